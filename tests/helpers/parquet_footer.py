"""A parquet file's footer decoded and written back, to craft files whose footer says other than their pages do.

The footer is a thrift ``FileMetaData`` in thrift's compact protocol (parquet-format's parquet.thrift); a struct
here is ``{field id: (compact type, value)}``, a list ``(element type, [values])``. No thrift library is installed
with the project, and pyarrow writes only true footers: the tests of `data_tools.parquet_source` need lying ones
(a dictionary page the footer hides, another encoding it calls PLAIN) to check what the reader bounds.
"""

from __future__ import annotations

import struct

from data_tools.tfrecord_io import _varint as _enc_varint  # protobuf's varint is thrift compact's

# FileMetaData 3: num_rows, 4: row_groups; RowGroup 1: columns, 3: num_rows; ColumnChunk 3: meta_data;
# ColumnMetaData 2: encodings, 3: path_in_schema, 7: total_compressed_size, 9: data_page_offset,
# 11: dictionary_page_offset, 13: encoding_stats
FILE_ROWS, ROW_GROUPS, COLUMNS, GROUP_ROWS, META_DATA = 3, 4, 1, 3, 3
ENCODINGS, PATH, COMPRESSED_SIZE, DATA_PAGE, DICTIONARY_PAGE, ENCODING_STATS = 2, 3, 7, 9, 11, 13
PLAIN, RLE = 0, 3  # parquet.thrift's Encoding


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        b = buf[i]
        i += 1
        out |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return out, i


def _unzigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _zigzag(n: int) -> int:
    return ((n << 1) ^ (n >> 63)) & ((1 << 64) - 1)


def _read_value(buf: bytes, i: int, t: int):
    if t in (1, 2):  # a bool field: its value is its type
        return t == 1, i
    if t == 3:
        return struct.unpack_from("b", buf, i)[0], i + 1
    if t in (4, 5, 6):
        v, i = _varint(buf, i)
        return _unzigzag(v), i
    if t == 7:
        return struct.unpack_from("<d", buf, i)[0], i + 8
    if t == 8:
        n, i = _varint(buf, i)
        return bytes(buf[i : i + n]), i + n
    if t in (9, 10):
        head = buf[i]
        i += 1
        n, element = head >> 4, head & 0xF
        if n == 15:
            n, i = _varint(buf, i)
        items = []
        for _ in range(n):
            if element in (1, 2):
                items.append(buf[i] == 1)
                i += 1
            else:
                v, i = _read_value(buf, i, element)
                items.append(v)
        return (element, items), i
    if t == 12:
        return _read_struct(buf, i)
    raise ValueError(f"thrift compact type {t}")


def _read_struct(buf: bytes, i: int) -> tuple[dict, int]:
    fields, last = {}, 0
    while True:
        head = buf[i]
        i += 1
        if head == 0:
            return fields, i
        delta, t = head >> 4, head & 0xF
        if delta:
            fid = last + delta
        else:
            v, i = _varint(buf, i)
            fid = _unzigzag(v)
        last = fid
        fields[fid] = (t, (value := _read_value(buf, i, t))[0])
        i = value[1]


def _enc_value(t: int, v) -> bytes:
    if t == 3:
        return struct.pack("b", v)
    if t in (4, 5, 6):
        return _enc_varint(_zigzag(v))
    if t == 7:
        return struct.pack("<d", v)
    if t == 8:
        return _enc_varint(len(v)) + v
    if t in (9, 10):
        element, items = v
        head = (
            bytes([(len(items) << 4) | element])
            if len(items) < 15
            else bytes([0xF0 | element]) + _enc_varint(len(items))
        )
        return head + b"".join(
            (b"\x01" if x else b"\x02") if element in (1, 2) else _enc_value(element, x) for x in items
        )
    if t == 12:
        return _enc_struct(v)
    raise ValueError(f"thrift compact type {t}")


def _enc_struct(fields: dict) -> bytes:
    out, last = bytearray(), 0
    for fid in sorted(fields):
        t, v = fields[fid]
        if t in (1, 2):
            t = 1 if v else 2
        delta = fid - last
        out += bytes([(delta << 4) | t]) if 0 < delta <= 15 else bytes([t]) + _enc_varint(_zigzag(fid))
        if t not in (1, 2):
            out += _enc_value(t, v)
        last = fid
    out.append(0)
    return bytes(out)


def read(path: str) -> tuple[bytes, dict]:
    """``(the file before its footer, the footer decoded)``."""
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[-8:-4], "little")
    return data[: len(data) - 8 - n], _read_struct(data, len(data) - 8 - n)[0]


def write(path: str, body: bytes, footer: dict) -> None:
    encoded = _enc_struct(footer)
    with open(path, "wb") as f:
        f.write(body + encoded + len(encoded).to_bytes(4, "little") + b"PAR1")


def claim_plain(path: str, column: str) -> None:
    """Rewrite ``path``'s footer to say that every column chunk under ``column`` (a top-level column's name) is
    PLAIN with no dictionary page, whatever its pages hold (a chunk that starts with a dictionary page then starts
    at its "data page")."""
    body, footer = read(path)
    for group in footer[ROW_GROUPS][1][1]:
        for chunk in group[COLUMNS][1][1]:
            meta = chunk[META_DATA][1]
            if meta[PATH][1][1][0] != column.encode():
                continue
            if DICTIONARY_PAGE in meta:
                meta[DATA_PAGE] = (meta[DATA_PAGE][0], meta[DICTIONARY_PAGE][1])
                del meta[DICTIONARY_PAGE]
            meta[ENCODINGS] = (meta[ENCODINGS][0], (5, [PLAIN, RLE]))
            meta.pop(ENCODING_STATS, None)
    write(path, body, footer)
