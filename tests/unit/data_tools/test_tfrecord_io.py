"""data_tools/tfrecord_io.py: the direct tf.train.Example encoder against protobuf's own serialization, and a
record written as parts against the same record written whole."""

from __future__ import annotations

import pytest

from data_tools import tfrecord_io

CASES = [
    {},
    {"image/class/label": (1, "int")},
    {"b": (b"", "byte"), "a": ([], "int"), "c": ([], "float"), "d": ([], "byte")},
    {"a": (1, "float"), "b": (1, "int"), "d": (b"1", "byte"), "e": ([1, 2], "int")},
    {"x": ([-1, 0, 2**63 - 1, -(2**63), 127, 128, 300], "int"), "y": ([0.5, -2.25, 1e30], "float")},
    {"z/é": ([b"a", b"", bytes(range(256)) * 70], "byte"), "é": (b"\xff", "byte"), "Z": (7, "int")},
    {"k" * 300: (b"v" * 20000, "byte"), "image/encoded": (bytes(200_000), "byte"), "image/height": (480, "int")},
]


@pytest.mark.parametrize("features", CASES, ids=range(len(CASES)))
def test_direct_encoding_is_protobufs(features):
    ex = tfrecord_io._EXAMPLE()
    for key, (value, kind) in features.items():
        values = value if isinstance(value, list) else [value]
        feat = ex.features.feature[key]
        {"byte": feat.bytes_list, "int": feat.int64_list, "float": feat.float_list}[kind].value.extend(values)
    expected = ex.SerializeToString(deterministic=True)
    for _ in range(2):  # the second from the cache of small entries
        assert b"".join(tfrecord_io.example_parts(features)) == expected
    assert tfrecord_io.encode_example(features) == expected
    assert tfrecord_io._EXAMPLE.FromString(expected) == ex


def test_large_values_are_not_copied():
    image = bytes(100_000)
    parts = tfrecord_io.example_parts({"image/encoded": (image, "byte"), "image/width": (3, "int")})
    assert any(p is image for p in parts)


def test_a_record_written_in_parts_is_the_record_written_whole(tmp_path):
    features = {"image/encoded": (bytes(range(256)) * 400, "byte"), "image/class/label": (3, "int")}
    written = []
    for name, payload in (
        ("whole", tfrecord_io.encode_example(features)),
        ("parts", tfrecord_io.example_parts(features)),
    ):
        with tfrecord_io.ShardWriter(str(tmp_path / name)) as w:
            w.write(payload)
            w.write(payload)
            written.append(w.commit())
    assert written[0] == written[1]
    assert (tmp_path / "whole").read_bytes() == (tmp_path / "parts").read_bytes()
    assert (tmp_path / "whole.idx").read_bytes() == (tmp_path / "parts.idx").read_bytes()
    records = list(tfrecord_io.scan_records(str(tmp_path / "parts")))
    assert [r[2] for r in records] == [tfrecord_io.encode_example(features)] * 2
