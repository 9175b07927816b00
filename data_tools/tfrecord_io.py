"""TFRecord framing, tf.train.Example encoding, DALI index files and atomic shard writing.

A TFRecord file is a sequence of records framed as
``uint64 length | uint32 masked_crc32c(length) | payload | uint32 masked_crc32c(payload)``
(little endian); TensorFlow, DALI and the ``tfrecord`` package all read this framing. The payload
is a serialized ``tf.train.Example``, encoded directly (`example_parts`: the bytes the ``tfrecord`` package's
protobuf classes give, without their copies of the image); the tests read every shard back with that package's
reader.

A DALI index file (``<shard>.idx``) has one line ``offset size`` per record, where ``size``
includes the 16 bytes of framing -- the format DALI's ``tfrecord2idx`` writes.

Nothing here leaves a partial file under a final name: shards and indexes are written to
``*.tmp`` (created ``O_EXCL | O_NOFOLLOW``: `vitlarge.fileio.create_new`), fsynced and renamed.
Shards are read only as regular files (`vitlarge.fileio.open_regular`: a FIFO never blocks).
"""

from __future__ import annotations

import os
import struct
import sys
from dataclasses import dataclass

import crc32c

from vitlarge.errors import UserError
from vitlarge.fileio import create_new, fsync_dir, open_regular, write_atomic


def example_pb2():
    """The ``tfrecord`` package's protobuf module, imported without its torch helpers.

    ``import tfrecord`` also imports ``tfrecord.torch``, i.e. torch (~3 s); hide it meanwhile.
    """
    hide = "tfrecord" not in sys.modules and "tfrecord.torch" not in sys.modules
    if hide:
        sys.modules["tfrecord.torch"] = None  # type: ignore[assignment]
    try:
        from tfrecord import example_pb2 as pb2  # lazy: loaded with tfrecord.torch hidden, to keep torch off
    finally:
        if hide:
            del sys.modules["tfrecord.torch"]
    return pb2


_EXAMPLE = example_pb2().Example
_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")
FRAMING_BYTES = _HEADER.size + _FOOTER.size  # 16
TMP_SUFFIX = ".tmp"
_CRC_MASK_DELTA = 0xA282EAD8


def _mask(crc: int) -> bytes:
    return _FOOTER.pack((((crc >> 15) | (crc << 17)) + _CRC_MASK_DELTA) & 0xFFFFFFFF)


def _masked_crc(data: bytes) -> bytes:
    return _mask(crc32c.crc32c(data))


def frame(payload: bytes) -> bytes:
    """One TFRecord record: length, masked CRC32C of length, payload, masked CRC32C of payload."""
    length = struct.pack("<Q", len(payload))
    return b"".join((length, _masked_crc(length), payload, _masked_crc(payload)))


def encode_example(features: dict[str, tuple[object, str]]) -> bytes:
    """Serialize a ``tf.train.Example``; ``features`` maps name -> (value, "byte"|"int"|"float"): `example_parts`,
    joined."""
    return b"".join(example_parts(features))


_BIG = 1024  # bytes; a value at least this long is handed on as its own part, not copied
_FLOAT = struct.Struct("<f")


def example_parts(features: dict[str, tuple[object, str]]) -> list[bytes]:
    """A serialized ``tf.train.Example`` as a list of parts whose concatenation is exactly what the ``tfrecord``
    package's protobuf classes give with ``SerializeToString(deterministic=True)`` (map keys sorted: the same inputs,
    the same bytes in any process, so a resumed conversion matches an uninterrupted one byte for byte;
    tests/unit/data_tools/test_tfrecord_io.py checks it against protobuf). Written out because it is the converter's
    hot path, and measurably faster there: protobuf (upb) took ~17 us for an ImageNet-like record (a 60 KB image and
    the converter's nine small features: 2-core Xeon), copying the image into its message and again into the
    serialized string; this takes ~5 us, since the entries of small values (labels, classes, sizes: they repeat)
    come encoded from a bounded cache and a value of `_BIG` bytes or more (the image) stays the caller's object, a
    part of its own that `ShardWriter.write` writes as it is.

    The wire format: Example{1: Features{1: repeated entry{1: key, 2: Feature}}}, Feature{1: BytesList{1: repeated
    bytes} | 2: FloatList{1: packed float} | 3: Int64List{1: packed int64}} (tensorflow/core/example/feature.proto).
    """
    out: list[bytes] = []  # small entries joined, each big value a part of its own
    small: list[bytes] = []
    total = 0
    for key in sorted(features):  # code point order is UTF-8's byte order: protobuf's sorted keys
        value, kind = features[key]
        cached = (key, kind, value) if type(value) is int or (type(value) is bytes and len(value) <= 64) else None
        entry = _ENTRIES.get(cached) if cached is not None else None
        if entry is None:
            entry, big = _entry(key, value, kind)
            if cached is not None:
                if len(_ENTRIES) >= _MAX_CACHED:
                    _ENTRIES.clear()
                _ENTRIES[cached] = entry
            if big is not None:
                out.append(b"".join(small) + entry)
                out.append(big)
                small = []
                total += len(entry) + len(big)
                continue
        small.append(entry)
        total += len(entry)
    if not total:
        return []  # protobuf leaves an Example without features empty
    if small:
        out.append(b"".join(small))
    out[0] = b"\n" + _varint(total) + out[0]
    return out


_ENTRIES: dict[tuple, bytes] = {}  # encoded map entries of small values: a set's labels, classes, sizes repeat
_MAX_CACHED = 1 << 16


def _entry(key: str, value: object, kind: str) -> tuple[bytes, bytes | None]:
    """One map entry of Features, and the big value that follows it where it is left out of the entry (its last
    bytes: a one-value BytesList of `_BIG` bytes or more)."""
    values = value if isinstance(value, (list, tuple)) else (value,)
    big = None
    if kind == "byte":
        if len(values) == 1 and len(values[0]) >= _BIG:  # type: ignore[arg-type]
            big = values[0]
            inner = b"\n" + _varint(len(big))  # type: ignore[arg-type]
        else:
            inner = b"".join(b"\n" + _varint(len(v)) + v for v in values)  # type: ignore[arg-type]
        tag = b"\n"
    else:
        if kind == "int":
            packed = b"".join(_varint(int(v) & 0xFFFFFFFFFFFFFFFF) for v in values)  # type: ignore[call-overload]
            tag = b"\x1a"
        else:
            packed = b"".join(_FLOAT.pack(v) for v in values)
            tag = b"\x12"
        inner = b"\n" + _varint(len(packed)) + packed if values else b""
    inner_len = len(inner) + (len(big) if big is not None else 0)  # type: ignore[arg-type]
    feature = tag + _varint(inner_len) + inner
    k = key.encode()
    entry = b"\n" + _varint(len(k)) + k + b"\x12" + _varint(len(feature) + inner_len - len(inner)) + feature
    return b"\n" + _varint(len(entry) + inner_len - len(inner)) + entry, big  # type: ignore[return-value]


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


@dataclass(frozen=True)
class WrittenShard:
    """What a committed shard holds; goes into the manifest and the per-shard done-record."""

    num_records: int
    bytes: int
    checksum: str  # "crc32c:<8 hex>" of the whole shard file


class ShardWriter:
    """Writes one shard and its DALI index as ``*.tmp``; ``commit()`` fsyncs and renames both.

    Use as a context manager: leaving the block with an exception removes the temporary files,
    so an interrupted or failed shard never appears under its final name.
    """

    def __init__(self, path: str):
        self.path = path
        self.index_path = path + ".idx"
        self._tmp = path + TMP_SUFFIX
        self._index_tmp = self.index_path + TMP_SUFFIX
        self._file = open(create_new(self._tmp), "wb")  # a link planted as the .tmp is removed, not followed
        self._lines: list[str] = []
        self._offset = 0
        self._crc = 0

    def write(self, payload: bytes | list[bytes]) -> None:
        """Append one record: a serialized Example, whole or as the parts `example_parts` gives (written as they
        are: the image is not copied into a joined payload)."""
        parts = [payload] if isinstance(payload, (bytes, bytearray, memoryview)) else payload
        length, crc = 0, 0
        for p in parts:
            length += len(p)
            crc = crc32c.crc32c(p, value=crc)
        head = struct.pack("<Q", length)
        pieces = [head + _masked_crc(head), *parts, _mask(crc)]
        self._file.writelines(pieces)
        for p in pieces:
            self._crc = crc32c.crc32c(p, value=self._crc)
        record_size = length + FRAMING_BYTES
        self._lines.append(f"{self._offset} {record_size}\n")
        self._offset += record_size

    @property
    def num_records(self) -> int:
        return len(self._lines)

    def flush(self) -> None:
        self._file.flush()

    def commit(self) -> WrittenShard:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        write_atomic(self.index_path, "".join(self._lines), rename=False)
        os.replace(self._tmp, self.path)
        os.replace(self._index_tmp, self.index_path)
        fsync_dir(os.path.dirname(self.path) or ".")
        return WrittenShard(len(self._lines), self._offset, f"crc32c:{self._crc:08x}")

    def abort(self) -> None:
        if not self._file.closed:
            self._file.close()
        for p in (self._tmp, self._index_tmp):
            try:
                os.remove(p)
            except FileNotFoundError:
                pass

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()


def scan_records(path: str, *, parse=None):
    """Yield ``(offset, size, payload_or_parsed)`` for each record of a TFRecord file.

    Checks framing and CRCs; a file that ends mid-record or has a bad CRC raises UserError naming
    the shard, as does a payload ``parse`` (optional, applied to each) cannot read. Memory stays
    bounded by the largest record the file's size allows.
    """
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        offset = 0
        while offset < size:
            header = f.read(_HEADER.size)
            if len(header) < _HEADER.size:
                raise _truncated(path, offset, size)
            length, length_crc = _HEADER.unpack(header)
            if _masked_crc(header[:8]) != struct.pack("<I", length_crc):
                raise UserError(
                    f"{path}: not a TFRecord file or corrupt at byte {offset} (bad length CRC); "
                    "re-copy or re-convert this shard"
                )
            if offset + _HEADER.size + length + _FOOTER.size > size:  # before reading: no allocation past the file
                raise _truncated(path, offset, size)
            body = f.read(length + _FOOTER.size)
            if len(body) < length + _FOOTER.size:
                raise _truncated(path, offset, size)
            payload = body[:length]
            if _masked_crc(payload) != body[length:]:
                raise UserError(
                    f"{path}: corrupt record at byte {offset} (bad data CRC); re-copy or re-convert this shard"
                )
            rec = length + FRAMING_BYTES
            if parse:
                try:
                    payload = parse(payload)
                except UserError:
                    raise
                except RecordRefused as e:
                    raise UserError(f"{path}: the record at byte {offset}: {e}") from None
                except Exception as e:  # noqa: BLE001 (protobuf's DecodeError and whatever a junk record raises)
                    raise UserError(
                        f"{path}: the record at byte {offset} is not a tf.train.Example with an image and "
                        f"an integer label ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'no detail'}); "
                        "re-convert this shard or remove its set"
                    ) from None
            yield offset, rec, payload
            offset += rec


class RecordRefused(Exception):
    """A ``parse``'s refusal of a well-formed record (its image past a guard, cut short, or in a format DALI does not
    decode), its message the fix: the shard's line names the record by its byte and says this, where any other
    exception from ``parse`` reads as a record that is no tf.train.Example."""


def _truncated(path: str, offset: int, size: int) -> UserError:
    return UserError(
        f"{path}: truncated TFRecord (record at byte {offset} runs past the end of the "
        f"{size}-byte file); re-copy or re-convert this shard"
    )


def write_index_for(shard_path: str, *, parse=None, index_path: str | None = None) -> tuple[int, int, str, list]:
    """Scan a shard, write its DALI index atomically (``index_path``, default ``<shard>.idx``: an index folder's
    name for a shard in a folder not written, `data_tools.make_index` ``--out``); return (records, bytes, checksum,
    parsed)."""
    lines, parsed, crc = [], [], 0
    for offset, rec, item in scan_records(shard_path, parse=parse):
        lines.append(f"{offset} {rec}\n")
        if parse:
            parsed.append(item)
    with open_regular(shard_path) as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            crc = crc32c.crc32c(block, value=crc)
    write_atomic(index_path or shard_path + ".idx", "".join(lines))
    return len(lines), os.path.getsize(shard_path), f"crc32c:{crc:08x}", parsed
