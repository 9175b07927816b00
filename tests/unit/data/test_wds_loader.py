"""The loaders on WebDataset tars (DALI's webdataset reader): the same images as TFRecords give the same batches.

The digits demo written as timm's WebDataset layout (`data_tools.make_wds_copy`, the webdataset library's writer),
tar for shard and record for record, then indexed in place by make_index: every guarantee of the TFRecord source
(exact validation at any world size, each epoch's fresh order, a resume bitwise, rectangular validation) shows as
batches equal, bit for bit, to those of the TFRecords they were copied from.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.loaders import open_train, open_val
from vitlarge.data import load_manifest
from vitlarge.errors import UserError

CPU = torch.device("cpu")


def val_pass(d, batch_size, rank, world_size, **kw):
    v = open_val(d, batch_size, 32, rank=rank, world_size=world_size, device=CPU, num_threads=1, **kw)
    batches = list(v)
    assert sum(len(labels) for _, labels in batches) == v.num_examples_this_rank
    return [x for batch in batches for x in batch]


def test_validation_is_the_tfrecords_pass_at_any_world_size(demo_data, demo_wds):
    assert load_manifest(demo_wds).num_examples("validation") == 360
    ref = val_pass(demo_data, 50, 0, 1)
    for world_size in (1, 3):  # 3 ranks: 120 each, of 3 batches (50, 50, 20)
        wds = [t for r in range(world_size) for t in val_pass(demo_wds, 50, r, world_size)]
        assert sum(len(t) for t in wds[1::2]) == 360
        assert torch.equal(torch.cat(wds[0::2]), torch.cat(ref[0::2]))
        assert torch.equal(torch.cat(wds[1::2]), torch.cat(ref[1::2]))


def test_rectangular_validation_reads_the_tars_by_index(demo_data, demo_wds):
    for world_size in (1, 2):
        wds = [t for r in range(world_size) for t in val_pass(demo_wds, 8, r, world_size, rect_val=True)]
        tfr = [t for r in range(world_size) for t in val_pass(demo_data, 8, r, world_size, rect_val=True)]
        assert sum(len(t) for t in wds[1::2]) == 360
        assert all(torch.equal(a, b) for a, b in zip(wds, tfr, strict=True))


def test_train_stream_is_the_tfrecords_and_resumes_bitwise(demo_data, demo_wds):
    kw = dict(rank=1, world_size=2, device=CPU, seed=5, initial_fill=64, num_threads=1)
    wds, tfr = open_train(demo_wds, 32, 32, **kw), open_train(demo_data, 32, 32, **kw)
    for _ in range(25):  # 22 batches an epoch on this rank: crosses into the second, a fresh order
        (a, la), (b, lb) = next(wds), next(tfr)
        assert torch.equal(la, lb) and torch.equal(a, b)
    state = wds.state()
    expected = [next(wds) for _ in range(3)]
    restored = open_train(demo_wds, 32, 32, state=state, **kw)
    for (a, la), (b, lb) in zip(expected, (next(restored) for _ in range(3))):
        assert torch.equal(la, lb) and torch.equal(a, b)


def test_repeated_augmentation_needs_tfrecords(demo_wds):
    with pytest.raises(UserError, match="data.repeats=3 reads TFRecord shards by index"):
        open_train(demo_wds, 32, 32, device=CPU, seed=0, repeats=3)


def test_the_pipeline_reads_each_cls_integer_as_make_index_does(tmp_path):
    """Labels of 1 to 7 digits, some with a trailing newline, through DALI's reader and the in-pipeline parse."""
    from data_tools import make_index
    from tests.helpers.wds_sets import write_timm_wds

    labels = [0, 7, 12, 999, 1000, 123456, 5]

    def edit(split, i, sample):
        return {**sample, "cls": str(labels[i]) + "\n" * (i % 2)}

    d = write_timm_wds(str(tmp_path / "set"), {"train": 7, "validation": 7}, edit=edit)
    make_index.make_index(d, workers=1)
    assert [x for _, lab in open_val(d, 4, 16, device=CPU) for x in lab.tolist()] == labels
    train = open_train(d, 7, 16, device=CPU, seed=0)
    assert sorted(next(train)[1].tolist()) == sorted(labels)


@pytest.mark.parametrize("payload", [b"x", b"1 2", b"1x", b" 1"])
def test_a_cls_changed_after_indexing_to_no_integer_is_refused(tmp_path, payload):
    """The tar keeps its size (make_index's record) but a .cls is no longer an integer: the pipeline reads it as -1
    (never 0, nor 12 from "1 2") and the loader names the cause, on both validation paths."""
    import os
    import tarfile

    from data_tools import make_index
    from tests.helpers.wds_sets import write_timm_wds

    width = len(payload)
    d = write_timm_wds(
        str(tmp_path / "set"),
        {"train": 3, "validation": 3},
        edit=lambda s, i, x: {**x, "cls": "1" * width, "json": {**x["json"], "class_name": "one"}},  # one class
    )
    make_index.make_index(d, workers=1)
    tar = os.path.join(d, "tiny-validation-0000.tar")
    with tarfile.open(tar) as t:
        cls = next(m for m in t.getmembers() if m.name.endswith(".cls"))
    with open(tar, "r+b") as f:
        f.seek(cls.offset_data)
        f.write(payload)
    for rect in (False, True):
        with pytest.raises(UserError, match=r"a \.cls that is no integer: the tar changed since make_index; rerun"):
            list(open_val(d, 3, 16, device=CPU, rect_val=rect, patch_size=16))


def test_the_loaders_batch_parse_is_make_indexs_rule():
    """`ascii_labels` (a batch of padded .cls bytes, in torch) reads each row as `parse_label` (make_index's regex)
    reads it: edge cases (10 and 11 digits, leading zeros, each whitespace byte, NUL, bytes past ASCII, digits
    after a space) and 20,000 random rows drawn from digits, whitespace and other bytes."""
    import random

    from vitlarge.data.wds_shards import LABEL_MAX_BYTES, ascii_labels, parse_label

    rows = [b"", b"0", b"007", b"4294967295", b"99999999999", b"1\t", b"1\x0b\x0c\r\n", b"1\x00", b"\xb9", b"12 3"]
    rng = random.Random(0)
    alphabet = b"0123456789" * 3 + b" \t\n\x0b\x0c\r" + b"x\x00\x80\xff-+."
    for _ in range(20_000):
        rows.append(bytes(rng.choice(alphabet) for _ in range(rng.randint(0, LABEL_MAX_BYTES))))
    padded = torch.tensor([list(r.ljust(LABEL_MAX_BYTES, b" ")) for r in rows], dtype=torch.uint8)
    want = [-1 if parse_label(r) is None else parse_label(r) for r in rows]
    assert ascii_labels(padded).tolist() == want
    assert sum(x >= 0 for x in want) > 2_000  # the draw reaches the labels, not only the refusals


@pytest.mark.parametrize("edited", ["one", "every"])
def test_a_cls_read_longer_than_a_label_is_refused(tmp_path, edited):
    """An index edited to give a .cls more bytes than a label has: DALI's reader reads them (the batch's rows then
    differ in width, or are all wider than a label) and the loader names the cause in one line instead of DALI's
    shape error, or a label read from a 40-byte .cls."""
    import os

    from data_tools import make_index
    from tests.helpers.wds_sets import write_timm_wds

    d = write_timm_wds(str(tmp_path / "set"), {"train": 3, "validation": 3})
    make_index.make_index(d, workers=1)
    index = os.path.join(d, "tiny-validation-0000.idx")
    with open(index) as f:
        lines = f.read().splitlines()
    for i in range(1, len(lines) if edited == "every" else 2):
        fields = lines[i].split(" ")
        at = fields.index("cls")
        fields[at + 2] = "40"  # the size DALI reads: the tar's block padding follows the member
        lines[i] = " ".join(fields)
        if edited == "every":  # spaces in that padding: "0" and 39 spaces, which parse_label refuses, not 0
            with open(os.path.join(d, "tiny-validation-0000.tar"), "r+b") as f:
                f.seek(int(fields[at + 1]) + 1)
                f.write(b" " * 39)
    with open(index, "w") as f:
        f.write("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=r"a \.cls that is no integer: the tar changed since make_index; rerun"):
        list(open_val(d, 3, 16, device=CPU))
