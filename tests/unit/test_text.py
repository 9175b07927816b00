"""vitlarge/text.py: counts in messages read as English ("1 process", "3 processes")."""

from vitlarge.text import plural


def test_one_is_singular_every_other_count_plural():
    assert [plural(n, "process") for n in (0, 1, 2)] == ["0 processes", "1 process", "2 processes"]
    assert [plural(n, "shard") for n in (1, 4)] == ["1 shard", "4 shards"]
    assert plural(1, "micro-step") == "1 micro-step" and plural(3, "micro-step") == "3 micro-steps"
    assert plural(1, "index", "indexes") == "1 index" and plural(2, "index", "indexes") == "2 indexes"
    assert plural(1437, "image", grouped=True) == "1,437 images" and plural(1, "class") == "1 class"
