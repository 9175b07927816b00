"""DCP's ``.metadata`` index and the byte ranges it names, read as data from elsewhere.

The index is a pickle DCP offers no other format for: `read_index` reads it (a regular file of at most
`INDEX_MAX_BYTES`, never a link) through `_MetadataUnpickler`, which admits an exact list of (module, name) pairs
and nothing that runs code, charged against `vitlarge.checkpoint.trust.pickles.Budget`; `index_problem` then
checks it against meta.json: every byte range it names lies in a ``.distcp`` file meta.json lists, so no read
leaves the folder. `slices_problem` (rank 0, once per resume) and `archive_problem` (every ``torch.load`` of a
checkpoint's file) check that each range is a ``torch.save`` archive of its own size whose pickle is in budget.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import math
import pickle
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import IO, Any, ClassVar, cast

import torch
from torch.distributed.checkpoint import filesystem, metadata
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    _MEM_FORMAT_ENCODING,
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

from vitlarge import fileio
from vitlarge.checkpoint.trust import meta as meta_json
from vitlarge.checkpoint.trust import pickles

METADATA = ".metadata"  # DCP's index, written by the coordinator (rank 0)


INDEX_MAX_BYTES = 1 << 30
"""``.metadata``'s size cap: a 1024-rank FSDP ViT-H index (a chunk per rank per tensor) is about 0.3 GB."""


MAX_DIMS = 64
MAX_PATH = 4096


@functools.cache
def _metadata_classes() -> tuple[type, ...]:
    """DCP's metadata classes: what an index builds (NEWOBJ) and fills (BUILD), exactly these types."""
    return (
        metadata.Metadata,
        metadata.MetadataIndex,
        metadata.StorageMeta,
        metadata.TensorStorageMetadata,
        metadata.BytesStorageMetadata,
        metadata.ChunkStorageMetadata,
        metadata.TensorProperties,
        filesystem._StorageInfo,
    )


def _allowed_globals() -> dict[tuple[str, str], object]:
    """Exactly the (module, name) pairs a DCP index pickle refers to (torch 2.4-2.10): DCP's metadata
    classes, torch's dtypes, layouts and memory formats (values, not callables), ``torch.Size``, the
    writer's ``checkpoint_id`` path and torch's layout lookup by name; the callables among them replaced
    by bounded factories. No module, no dotted name, no ``getattr``, no builtin: nothing a crafted index
    can reach runs code, touches a file or changes a class."""
    allowed: dict[tuple[str, str], object] = {
        ("torch", "Size"): _size,
        ("torch.serialization", "_get_layout"): _layout_by_name,
        ("pathlib", "PosixPath"): _path,
        ("pathlib", "PurePosixPath"): _path,
        ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"): metadata._MEM_FORMAT_ENCODING,
    }
    for cls in _metadata_classes():
        allowed[(cls.__module__, cls.__qualname__)] = cls
    for name, value in vars(torch).items():
        if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
            allowed[("torch", name)] = value
    return allowed


@functools.cache
def _reducible() -> tuple:
    """What REDUCE may call: the bounded factories and the memory-format enum (a lookup by value)."""
    return (_size, _path, _layout_by_name, _MEM_FORMAT_ENCODING)


def _refuse(what: str):
    raise pickle.UnpicklingError(f"{METADATA} {what}, which a DCP index never holds")


def _size(dims=()):
    """``torch.Size`` of at most `MAX_DIMS` whole numbers (`_MetadataUnpickler` keeps one object per distinct
    value of a load, so a small pickle that names one large list many times cannot build many copies of it)."""
    if not isinstance(dims, (list, tuple)) or len(dims) > MAX_DIMS:
        _refuse(f"has a shape of more than {MAX_DIMS} dimensions or of another type")
    key = tuple(dims)
    if not all(type(d) is int for d in key):
        _refuse("has a shape that is not whole numbers")
    return torch.Size(key)


def _path(*parts):
    """The writer's ``checkpoint_id``: a path of at most `MAX_PATH` characters, kept as its text (nothing reads it)."""
    if not all(isinstance(p, str) for p in parts) or sum(map(len, parts)) > MAX_PATH:
        _refuse(f"holds a path that is not text of at most {MAX_PATH} characters")

    return PurePosixPath(*parts)


@functools.cache
def _layouts() -> dict[str, torch.layout]:
    return {str(v): v for v in vars(torch).values() if isinstance(v, torch.layout)}


def _layout_by_name(name):
    """``torch.serialization._get_layout`` for a name it knows; anything else is refused, not looked up."""
    layouts = _layouts()
    if not isinstance(name, str) or name not in layouts:
        raise pickle.UnpicklingError(f"{METADATA} names layout {str(name)[:40]!r}, which torch does not have")
    return layouts[name]


_PURE: Any = pickle._Unpickler  # typed Any: see _MetadataUnpickler.dispatch


class _MetadataUnpickler(pickle._Unpickler):
    """Unpickles DCP's ``.metadata`` as data: the exact globals of `_allowed_globals`, and only the opcodes a
    DCP index uses, each checked. Python's own unpickler (not the C one) so that every object-building
    opcode can be checked:

    * REDUCE calls only the bounded factories and the memory-format enum (never a class's constructor);
    * NEWOBJ makes an empty instance of a DCP metadata class, with no arguments; INST, OBJ, NEWOBJ_EX and
      persistent ids are refused;
    * BUILD fills only an instance of a DCP metadata class made by this load, with its own field names: never a
      class (``setattr(PosixPath, "_str", ...)`` would redirect every later write of the process), and never
      a large state copied into many objects;
    * every opcode is charged to a `pickles.Budget` of the file's size as it runs: the objects a crafted index
      makes stay within a few times what a real index of its size makes.
    """

    ALLOWED: dict[tuple[str, str], object] | None = None
    # pickle's pure-Python unpickler: its opcode table, its stack and its load_* methods are not in typeshed
    dispatch: ClassVar[dict[int, Callable[[Any], None]]] = dict(_PURE.dispatch)
    stack: list[Any]

    def __init__(self, file: IO[bytes], size: int):
        super().__init__(file)
        self.budget = pickles.Budget(size, METADATA)
        self._sizes: dict[tuple, torch.Size] = {}  # one torch.Size per distinct shape of this load

    def find_class(self, module: str, name: str):
        if _MetadataUnpickler.ALLOWED is None:
            _MetadataUnpickler.ALLOWED = _allowed_globals()
        found = _MetadataUnpickler.ALLOWED.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(
                f"{METADATA} refers to {module[:60]}.{name[:60]}, which a DCP index never holds"
            )
        return found

    def persistent_load(self, pid):
        _refuse("holds a persistent id")

    def _reduce(self):
        args = self.stack[-1]
        func = self.stack[-2]
        if not any(func is f for f in _reducible()):
            _refuse(f"calls {getattr(func, '__name__', type(func).__name__)[:60]}")
        if not isinstance(args, tuple):
            _refuse("calls with arguments that are not a tuple")
        if func is _size:
            shape = _size(*args)
            del self.stack[-2:]
            self.stack.append(self._sizes.setdefault(tuple(shape), shape))
            return
        _PURE.load_reduce(self)

    def _newobj(self):
        args = self.stack[-1]
        cls = self.stack[-2]
        if cls not in _metadata_classes() or args != ():
            _refuse(f"builds a {getattr(cls, '__name__', type(cls).__name__)[:60]} that way")
        _PURE.load_newobj(self)

    def _build(self):
        state, inst = self.stack[-1], self.stack[-2]
        if type(inst) not in _metadata_classes():
            _refuse(f"sets the state of a {type(inst).__name__[:60]}")
        if type(inst).__name__ == "TensorProperties":  # its own __setstate__ takes a 5-tuple of plain values
            if not (isinstance(state, tuple) and len(state) == 5):
                _refuse("holds tensor properties of another form")
        else:
            fields = {f.name for f in dataclasses.fields(inst)}
            if not (isinstance(state, dict) and set(state) <= fields):
                _refuse(f"sets fields a {type(inst).__name__} does not have")
        _PURE.load_build(self)

    def _refused_opcode(self):
        _refuse("uses an opcode (INST, OBJ or NEWOBJ_EX) that builds objects otherwise")

    dispatch[pickle.REDUCE[0]] = _reduce
    dispatch[pickle.NEWOBJ[0]] = _newobj
    dispatch[pickle.BUILD[0]] = _build
    for _op in (pickle.INST, pickle.OBJ, pickle.NEWOBJ_EX):
        dispatch[_op[0]] = _refused_opcode
    dispatch = pickles.charge_dispatch(dispatch)


def unpickle_index(raw: bytes):
    """The object a ``.metadata``'s bytes make under `_MetadataUnpickler` (checked by `read_index`, not here)."""
    return _MetadataUnpickler(io.BytesIO(raw), len(raw)).load()


class IndexProblem(ValueError):
    """Why a ``.metadata`` is not a DCP index of its checkpoint's own files (a few words, no traceback)."""


def read_index(folder: Path, files: Mapping[str, dict | None] | None = None):
    """DCP's ``Metadata`` of ``folder``, read as data: at most `INDEX_MAX_BYTES` (and its recorded size),
    a regular file, unpickled by `_MetadataUnpickler`, then checked (`index_problem`) against ``files``,
    meta.json's records (read from the folder when not given). Raises `IndexProblem`."""
    folder = Path(folder)
    try:
        listed: Mapping[str, dict | None] = meta_json.listed_files(folder) if files is None else files
    except ValueError as e:
        raise IndexProblem(str(e)) from None
    record = listed.get(METADATA)
    if not isinstance(record, dict):
        raise IndexProblem(f"meta.json does not list {METADATA}")
    try:
        raw = fileio.read_capped(folder / METADATA, min(INDEX_MAX_BYTES, record["bytes"]), follow=False)
    except FileNotFoundError:
        raise IndexProblem(f"{METADATA} is missing") from None
    except fileio.UnsafeFile as e:
        raise IndexProblem(f"{METADATA} {e.strerror}") from None
    except OSError as e:
        raise IndexProblem(f"{METADATA} cannot be read ({e.strerror})") from None
    try:
        metadata = unpickle_index(raw)
    except pickle.UnpicklingError as e:
        why = str(e).splitlines()[0][:120] if str(e) else ""
        raise IndexProblem(why if why.startswith(METADATA) else f"{METADATA} is not a DCP index ({why})") from None
    except RecursionError:
        raise IndexProblem(f"{METADATA} is nested too deeply to be a DCP index") from None
    except Exception as e:  # noqa: BLE001 - a damaged pickle raises EOFError, ValueError, TypeError, KeyError...
        raise IndexProblem(f"{METADATA} is not a DCP index ({type(e).__name__})") from None
    try:
        problem = index_problem(metadata, listed)
    except (AttributeError, TypeError, ValueError, OverflowError) as e:  # a field missing or of another type
        problem = f"{METADATA} is not a DCP index of this checkpoint ({type(e).__name__})"
    if problem:
        raise IndexProblem(problem)
    return metadata


def _is_size(x, dims: int | None = None) -> bool:
    return (
        isinstance(x, torch.Size)
        and (dims is None or len(x) == dims)
        and all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 48 for d in x)
    )


def _chunks_tile(chunks: list, size: torch.Size) -> bool:
    """Whether ``chunks`` (each inside ``size``) cover ``size`` exactly once: their volumes add up to it and no
    two overlap (pairwise for a few chunks; FSDP's many row shards must tile dimension 0 in order)."""
    if sum(math.prod(c.sizes) for c in chunks) != math.prod(size):
        return False
    boxes = [c for c in chunks if math.prod(c.sizes)]
    if len(boxes) <= 64:
        return not any(
            all(
                a.offsets[d] < b.offsets[d] + b.sizes[d] and b.offsets[d] < a.offsets[d] + a.sizes[d]
                for d in range(len(size))
            )
            for i, a in enumerate(boxes)
            for b in boxes[i + 1 :]
        )
    row = 0
    for c in sorted(boxes, key=lambda c: c.offsets[0]):
        if c.offsets[0] != row or any(c.offsets[1:]) or tuple(c.sizes[1:]) != tuple(size[1:]):
            return False
        row += c.sizes[0]
    return True


def index_problem(metadata, files: Mapping[str, dict | None]) -> str | None:
    """Why ``metadata`` is not a DCP index of the ``.distcp`` files meta.json lists (``files``), or None.
    Every storage entry must name one of them, with its byte range inside the recorded size; every
    tensor's shape, dtype and chunks must be well formed and no larger than the checkpoint's data (so a
    read of it allocates no more than the files hold)."""
    if type(metadata) is not Metadata:
        return f"{METADATA} holds a {type(metadata).__name__}, not DCP's Metadata"
    data_files = {n: cast(dict, r)["bytes"] for n, r in files.items() if n.endswith(".distcp")}  # None: TypeError
    total, tensor_bytes = sum(data_files.values()), 0
    entries = metadata.state_dict_metadata
    if not isinstance(entries, dict):
        return f"{METADATA}'s state_dict_metadata is not a map"
    for fqn, md in entries.items():
        if not isinstance(fqn, str):
            return f"{METADATA} has a key that is not a name"
        if type(md) is BytesStorageMetadata:
            if fqn.startswith(("model.", "ema.")):  # weights are tensors; only optimizer leaves may be bytes
                return f"{METADATA}: {fqn[:80]} is stored as bytes, not as a tensor"
            continue
        if type(md) is not TensorStorageMetadata:
            return f"{METADATA}: {fqn[:80]} is neither a tensor nor bytes"
        props = md.properties
        if type(props) is not TensorProperties or not isinstance(getattr(props, "dtype", None), torch.dtype):
            return f"{METADATA}: {fqn[:80]} has no dtype"
        if not _is_size(md.size) or not isinstance(md.chunks, list):
            return f"{METADATA}: {fqn[:80]} has no shape"
        tensor_bytes += math.prod(md.size) * props.dtype.itemsize
        if tensor_bytes > total:
            return f"{METADATA}: its tensors (up to {fqn[:80]}, {list(md.size)}) are larger than the checkpoint's data files"
        for c in md.chunks:
            if type(c) is not ChunkStorageMetadata or not (
                _is_size(c.offsets, len(md.size)) and _is_size(c.sizes, len(md.size))
            ):
                return f"{METADATA}: {fqn[:80]} has a malformed chunk"
            if any(o + n > d for o, n, d in zip(c.offsets, c.sizes, md.size)):
                return f"{METADATA}: a chunk of {fqn[:80]} lies outside its shape"
        if not _chunks_tile(md.chunks, md.size):  # else a read leaves part of the tensor as uninitialised memory
            return f"{METADATA}: the chunks of {fqn[:80]} do not cover its shape exactly once"
    storage = metadata.storage_data
    if not isinstance(storage, dict):
        return f"{METADATA}'s storage_data is not a map"
    for index, info in storage.items():
        if type(index) is not MetadataIndex or not isinstance(index.fqn, str):
            return f"{METADATA} has a malformed storage key"
        if index.offset is not None and not _is_size(index.offset):
            return f"{METADATA}: the storage key of {index.fqn[:80]} has a malformed offset"
        if type(info) is not _StorageInfo:
            return f"{METADATA}: the storage of {index.fqn[:80]} is not DCP's"
        path, offset, length = info.relative_path, info.offset, info.length
        if not isinstance(path, str) or path not in data_files:
            return (
                f"{METADATA} points {index.fqn[:80]} at {str(path)[:80]!r}, which meta.json does not list "
                "(refused: reads stay in the checkpoint's own files)"
            )
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (offset, length)) or not (
            0 <= offset and 0 <= length and offset + length <= data_files[path]
        ):
            return f"{METADATA} points {index.fqn[:80]} past the end of {path}"
        if getattr(info, "transform_descriptors", None):  # compression and the like: this vitlarge writes none
            return f"{METADATA}: {index.fqn[:80]} is stored with transforms, which this vitlarge does not read"
    planner = metadata.planner_data
    if planner is not None and not (
        isinstance(planner, dict)
        and all(
            isinstance(k, str) and isinstance(v, tuple) and all(isinstance(p, (str, int)) for p in v)
            for k, v in planner.items()
        )
    ):
        return f"{METADATA}'s planner data is not a map of names to paths"
    if metadata.storage_meta is not None and type(metadata.storage_meta) is not StorageMeta:
        return f"{METADATA}'s storage meta is not DCP's"
    return None


class _Window(io.RawIOBase):
    """Bytes ``[offset, offset + length)`` of an open file, as a seekable file of its own."""

    def __init__(self, f, offset: int, length: int):
        self._f, self._offset, self._length, self._pos = f, offset, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        self._pos = max(0, min(self._length, (0, self._pos, self._length)[whence] + pos))
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, b) -> int:
        n = min(len(b), self._length - self._pos)
        if n <= 0:
            return 0
        self._f.seek(self._offset + self._pos)
        data = self._f.read(n)
        b[: len(data)] = data
        self._pos += len(data)
        return len(data)


def stored_zip_problem(f, length: int) -> str | None:
    """Why the zip archive ``f`` (``torch.save``'s format; ``length`` bytes) is not one ``torch.save`` writes:
    every entry stored uncompressed, their sizes adding up to at most its own. A DEFLATE entry would make
    ``torch.load`` allocate ~1000x the file (a 195 KB rank file held a 200 MB tensor). None when it is."""
    try:
        with zipfile.ZipFile(f) as z:
            infos = z.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, IndexError):
        return "is not a torch file"
    if any(i.compress_type != zipfile.ZIP_STORED for i in infos):
        return "holds compressed entries (torch.save writes none)"
    if sum(i.file_size for i in infos) > length:
        return "declares more bytes than it holds"
    return None


def archive_problem(f, length: int) -> str | None:
    """Why ``f`` (``length`` bytes) is not an archive ``torch.load`` may open: `stored_zip_problem`, then its
    pickle (``<archive>/data.pkl``, the one torch unpickles) charged to a `pickles.Budget` of its own size,
    building nothing, so what ``torch.load`` makes of it stays in proportion to it. None when it may: a pickle
    that does not parse is ``torch.load``'s to refuse."""
    problem = stored_zip_problem(f, length)
    if problem:
        return problem
    try:
        with zipfile.ZipFile(f) as z:
            infos = z.infolist()
            name = infos[0].filename.split("/")[0] + "/data.pkl" if infos else ""
            info = next((i for i in infos if i.filename == name), None)
            if info is None:
                return None
            raw = z.read(info)  # stored (checked above): its own bytes, as torch.load reads it whole too
        pickles.scan(io.BytesIO(raw), len(raw), "has a data.pkl that")
    except pickle.UnpicklingError as e:
        return str(e)
    except Exception:  # noqa: BLE001 - a damaged pickle or archive: torch.load says what it is
        return None
    return None


def slices_problem(folder: Path, metadata) -> str | None:
    """Why a byte range the index names is not a ``torch.save`` archive of its own size (`archive_problem`),
    or None. Reads each range's zip directory and pickle only (a few KB a tensor), once per resume on rank 0 and
    before a one-process weights read; DCP ``torch.load``s each range."""
    by_file: dict[str, list] = {}
    for info in metadata.storage_data.values():
        by_file.setdefault(info.relative_path, []).append(info)
    for name, infos in sorted(by_file.items()):
        try:
            with fileio.open_regular(Path(folder) / name, follow=False) as f:
                for info in infos:
                    problem = archive_problem(_Window(f, info.offset, info.length), info.length)
                    if problem:
                        return f"{name} at byte {info.offset:,} {problem}"
        except OSError as e:
            return f"{name} cannot be read ({e.strerror})"
    return None
