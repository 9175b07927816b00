"""DALI indexes and ``dataset.json`` for a WebDataset folder in timm's layout, read in place.

    python -m data_tools.make_index /data/imagenet-1k-wds     # timm/imagenet-1k-wds as downloaded

The layout is the Hugging Face Hub's ``timm/imagenet-1k-wds`` (timm's ``wds/`` reader): tars
``imagenet1k-train-NNNN.tar`` and ``imagenet1k-validation-NN.tar``, each sample ``<key>.jpg`` (or ``.jpeg``,
``.png``, ``.webp``), ``<key>.cls`` (the label, an ASCII integer from 0) and optionally ``<key>.json`` (timm's
holds ``filename``, ``label`` and ``class_name``), beside ``_info.json`` naming each split's ``filenames``,
``shard_lengths`` and ``num_samples``. Without ``_info.json`` the splits are the tars named
``...train-N.tar`` and ``...validation-N.tar`` (or ``val``).

Each tar is read once, header by header: its regular members are grouped into samples as DALI's ``wds2idx``
groups them (the name up to the first dot of its last part), and its DALI index (``<name>.idx``, `wds2idx`'s
format) is written beside it. Each sample must have exactly one image whose header PIL reads (only the header:
nothing is decoded; the validation images' sizes go to ``<tar>.sizes`` for ``data.rect_val``) and a ``.cls``
integer below `MAX_CLASSES`; members that are links, devices or sparse files, absolute names, names with ``..``
or not UTF-8, a pax or long-name header over `META_MAX_BYTES` (refused before `tarfile` reads it whole), a member
past the end of the file (a truncated tar), a tar ``_info.json`` lists twice (in one split or two) and counts that
disagree with ``_info.json`` are refused. Class names come from the ``.json`` members (``synset`` or ``wnid``,
``class_name``; two samples naming one label differently are refused) or from ``_info.json``'s ``classes`` (a list of
distinct names, index = label) where present. Every refusal is one line naming the file and the fix, exit status 2, with no
``dataset.json`` written; the indexes written before it are complete files and are rewritten by the next run.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import multiprocessing as mp
import os
import re
import sys
import tarfile
from collections.abc import Callable
from typing import BinaryIO

from PIL import Image, UnidentifiedImageError

from vitlarge.data.manifest import (
    CONFINED_FIX,
    MANIFEST_NAME,
    ClassInfo,
    Manifest,
    ShardInfo,
    confined_size,
    make_index_fix,
)
from vitlarge.data.manifest_schema import (
    MAX_CLASS_TEXT,
    MAX_CLASSES,
    MAX_LABEL,
    MAX_SYNSET,
    TAR_IMAGE_EXTS,
    TAR_INDEX_VERSION,
    TAR_LABEL_EXT,
    WDS_FORMAT,
)
from vitlarge.data.wds_shards import LABEL_MAX_BYTES, index_name, parse_label
from vitlarge.errors import UserError
from vitlarge.fileio import UnsafeFile, open_regular, read_capped, write_atomic

from .imagefolder import (
    DEFAULT_MAX_IMAGE_PIXELS,
    MAX_BYTES_PER_PIXEL,
    bomb_refusal,
    check_whole,
    displayed_header,
    too_many_bytes,
    too_many_pixels,
)

INFO_NAMES = ("_info.json", "info.json")  # timm's `_load_info` tries these
INFO_CAP = 64 << 20  # bytes of _info.json read: ImageNet-1k's is ~60 kB
JSON_CAP = 1 << 20  # bytes of a sample's .json member parsed for its class name
IN_PLACE_FORMATS = (
    "JPEG",
    "PNG",
    "WEBP",
)  # PIL's names of the formats an image read in place may have: DALI decodes them
TRANSPARENT_IN_PLACE = (
    "a transparent image, which DALI would read in place with its alpha dropped (on black) where the converter "
    "composites it on white (docs/DATA.md: images are trained as they look); re-write the image opaque, or unpack "
    "the set's images into ROOT/train/<class>/* and convert that with python -m data_tools.imagenet_to_tfrecord"
)
META_MAX_BYTES = 64 << 10  # a pax or long-name header larger than this is refused: tarfile reads it whole
SPLIT_NAMES = {"train": "train", "validation": "validation", "val": "validation"}
TAR_SPLIT_RE = re.compile(r"^(?:.*[-_])?(train|validation|val)[-_]?\d+\.tar$")
SYNSET_KEYS, TEXT_KEYS = ("synset", "wnid"), ("class_name", "label_name")  # not "text": a caption, per sample


def info_path(data_dir: str) -> str | None:
    return next((p for n in INFO_NAMES if os.path.lexists(p := os.path.join(data_dir, n))), None)


def is_webdataset(data_dir: str) -> bool:
    """Whether ``data_dir`` holds a WebDataset set (an ``_info.json``, or tars named by split) rather than
    TFRecord shards."""
    if not os.path.isdir(data_dir):
        return False
    return info_path(data_dir) is not None or any(TAR_SPLIT_RE.match(n) for n in os.listdir(data_dir))


def _split_files(data_dir: str) -> tuple[dict[str, list[str]], dict[str, list[int] | None], dict[str, int], list]:
    """Per split, its tars in order, their sample counts and the split's count as ``_info.json`` states them
    (None / absent without one), and ``_info.json``'s class names (``[]`` where it names none)."""
    info = info_path(data_dir)
    if info is None:
        files: dict[str, list[str]] = {}
        for n in sorted(os.listdir(data_dir)):
            if m := TAR_SPLIT_RE.match(n):
                files.setdefault(SPLIT_NAMES[m.group(1)], []).append(n)
        return files, {s: None for s in files}, {}, []
    fix = "re-download it with the data set, or remove it to index the tars named *-train-N.tar / *-validation-N.tar"
    try:
        doc = json.loads(read_capped(info, INFO_CAP))
    except UnsafeFile as e:
        raise UserError(f"{info}: {e.strerror}; {fix}") from None
    except (ValueError, RecursionError) as e:
        raise UserError(f"{info}: not JSON ({str(e)[:80]}); {fix}") from None
    splits = doc.get("splits") if isinstance(doc, dict) else None
    if not isinstance(splits, dict):
        raise UserError(f"{info}: no 'splits' object (timm's layout names each split's filenames there); {fix}")
    files, lengths, totals = {}, {}, {}
    listed: dict[str, str] = {}  # tar -> the split naming it: a tar read twice trains or validates on it twice
    for name, body in splits.items():
        split = SPLIT_NAMES.get(name)
        if split is None:  # a split vitlarge does not train or validate on (e.g. test)
            continue
        names = body.get("filenames") if isinstance(body, dict) else None
        if not (isinstance(names, list) and names and all(isinstance(n, str) for n in names)):
            raise UserError(f"{info}: splits.{name}.filenames is not a list of tar names; {fix}")
        for n in names:
            if os.path.basename(n) != n or n.startswith(".") or not n.endswith(".tar"):
                raise UserError(
                    f"{info}: splits.{name}.filenames holds {n[:80]!r}, not a tar file of its folder; {fix}"
                )
            if n in listed:
                where = "twice" if listed[n] == name else f"twice (also in splits.{listed[n]}.filenames)"
                raise UserError(f"{info}: splits.{name}.filenames lists {n} {where}; {fix}")
            listed[n] = name
        stated = body.get("shard_lengths")
        ok = isinstance(stated, list) and len(stated) == len(names) and all(type(x) is int for x in stated)
        lengths[split] = list(stated) if isinstance(stated, list) and ok else None
        if type(body.get("num_samples")) is int:
            totals[split] = body["num_samples"]
        files[split] = list(names)
    classes = doc.get("classes", [])
    if not isinstance(classes, list):
        raise UserError(f"{info}: classes is not a list of class names (index = label); {fix}")
    named: set[str] = set()
    for i, c in enumerate(classes):  # one entry dropped or repeated would give every later label another's name
        if not isinstance(c, str) or not c or c in named:
            what = "a repeat of an earlier name" if isinstance(c, str) and c else "not a class name"
            raise UserError(f"{info}: classes[{i}] is {json.dumps(c)[:80]}, {what}; {fix}")
        named.add(c)
    return files, lengths, totals, classes


def _member_problem(m: tarfile.TarInfo, size: int) -> str | None:
    """Why tar member ``m`` is refused (a link, a device, a name leading out, past the file's end), or None."""
    if m.issym() or m.islnk():
        return f"member {m.name[:120]!r} is a link; a data set's tar holds its files, not links"
    if m.ischr() or m.isblk() or m.isfifo():
        return f"member {m.name[:120]!r} is a device or FIFO; a data set's tar holds regular files"
    if m.name.startswith("/") or ".." in m.name.split("/"):
        return f"member {m.name[:120]!r} is an absolute name or leads out with '..'"
    if any(c.isspace() for c in m.name):
        return f"member {m.name[:120]!r} has whitespace in its name, which DALI's index cannot hold"
    if any("\udc80" <= c <= "\udcff" for c in m.name):  # tarfile's surrogateescape of bytes that are not UTF-8
        return f"member {m.name[:120]!r} has a name that is not UTF-8; re-write the tar with UTF-8 names"
    if m.issparse():  # its data is a map of holes: the bytes at offset_data are not the file
        return f"member {m.name[:120]!r} is a sparse file; re-write the tar without --sparse"
    if m.isreg() and m.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):  # e.g. a contiguous file: DALI reads regular
        return f"member {m.name[:120]!r} is not a plain regular file (type {m.type!r}); re-write the tar"
    if m.isreg() and m.offset_data + m.size > size:
        return f"truncated: member {m.name[:120]!r} ends at byte {m.offset_data + m.size:,}, past the file's {size:,}"
    return None


def _check_headers(path: str, f: BinaryIO) -> BinaryIO:
    """``f`` (open on tar ``path``) at its start, once its 512-byte header blocks are walked: a pax or GNU
    long-name header (types x, g, L, K) is read whole by `tarfile`, so one over `META_MAX_BYTES` is refused here
    (a 400 MB pax comment took 1.27 GB). The walk stops at the end blocks, at a block that is no header (`tarfile`
    then names it) or at a sparse member (`_member_problem` refuses it)."""
    offset, size = 0, os.fstat(f.fileno()).st_size
    while offset + 512 <= size:
        f.seek(offset)
        block = f.read(512)
        try:
            length = tarfile.nti(block[124:136])  # pyright: ignore[reportAttributeAccessIssue] (public in fact, not in the stub)
        except tarfile.HeaderError:
            break
        kind = block[156:157]
        if block == bytes(512) or kind == tarfile.GNUTYPE_SPARSE or length < 0:
            break
        if kind in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK):
            if length > META_MAX_BYTES:
                raise UserError(
                    f"{path}: a {length:,}-byte header record at byte {offset:,} (at most {META_MAX_BYTES:,} read); "
                    "re-write the tar without it"
                )
        offset += 512 + -(-length // 512) * 512
    f.seek(0)
    return f


def scan_tar(
    path: str, index_path: str, sized: bool, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
) -> tuple[str, int, int, int, dict, tuple | None]:
    """Reads tar ``path`` once and writes its DALI index to ``index_path``; returns (name, samples, bytes,
    largest label, {label: (synset, text)}, the images' ``(height, width)`` where ``sized``). `UserError` naming ``path`` for
    anything `_member_problem` or the module's rules refuse, an image of more than ``max_pixels`` pixels among them
    (the converter's ``--max-image-pixels``)."""
    Image.MAX_IMAGE_PIXELS = max_pixels
    fix = "re-copy or re-download this tar"
    size = os.path.getsize(path)
    samples: list[list[tarfile.TarInfo]] = []
    keys: list[str] = []
    names: dict[int, tuple[str, str]] = {}
    sizes: list[tuple[int, int]] = []
    try:
        with open_regular(path) as f, tarfile.open(fileobj=_check_headers(path, f), mode="r:") as tar:
            for m in tar:
                problem = _member_problem(m, size)
                if problem:
                    raise UserError(f"{path}: {problem}; {fix}")
                if not m.isreg():
                    continue
                cut = m.name.find(".", m.name.rfind("/") + 1)
                key = m.name[:cut] if cut >= 0 else m.name
                if not key or key.endswith("/"):  # hidden: DALI skips it
                    continue
                if not keys or keys[-1] != key:
                    keys.append(key)
                    samples.append([])
                samples[-1].append(m)
            end = tar.offset
            top = 0
            for k, ms in zip(keys, samples):
                label = _sample(path, tar, k, ms, names, sizes if sized else None, max_pixels)
                if label >= MAX_CLASSES:  # labels from 0: no manifest holds this many classes
                    raise UserError(
                        f"{path}: sample {k!r} has label {label}, past the {MAX_CLASSES:,} classes a data set may "
                        "have; fix the sample's .cls"
                    )
                top = max(top, label)
            f.seek(end)
            if f.read(512) != bytes(512):  # a tar ends with zero blocks: a cut at a member's end leaves none
                raise UserError(f"{path}: truncated (no end-of-archive blocks after its last member); {fix}")
    except tarfile.TarError as e:
        raise UserError(f"{path}: not a readable tar ({e}); {fix}") from None
    except OSError as e:
        raise UserError(f"{path}: {e.strerror or e}; {CONFINED_FIX}") from None
    if not samples:
        raise UserError(f"{path}: holds no samples (DALI cannot read an empty tar); {fix}")
    lines = [f"{TAR_INDEX_VERSION} {len(samples)}"]
    lines += [" ".join(f"{_ext(m)} {m.offset_data} {m.size} {m.name}" for m in members) for members in samples]
    write_atomic(index_path, "\n".join(lines) + "\n", root=os.path.dirname(index_path) or ".")
    return os.path.basename(path), len(samples), size, top, names, (tuple(sizes) if sized else None)


def _ext(m: tarfile.TarInfo) -> str:
    return m.name[m.name.find(".", m.name.rfind("/") + 1) + 1 :]


def _sample(
    path: str, tar: tarfile.TarFile, key: str, members: list, names: dict, sizes: list | None, max_pixels: int
) -> int:
    """Checks one sample (one image, one integer ``.cls``); returns its label, adds its class name to ``names``
    (``{label: (synset, text)}``) and its image's ``(height, width)`` to ``sizes``."""
    by_ext: dict[str, tarfile.TarInfo] = {}
    for m in members:
        if _ext(m) in by_ext:
            raise UserError(f"{path}: sample {key!r} has two {_ext(m)!r} members; re-write the tar with one each")
        by_ext[_ext(m)] = m
    images = [by_ext[e] for e in TAR_IMAGE_EXTS if e in by_ext]
    if len(images) != 1 or TAR_LABEL_EXT not in by_ext:
        what = "no image (.jpg, .jpeg, .png or .webp)" if not images else "two images" if len(images) > 1 else "no .cls"
        raise UserError(
            f"{path}: sample {key!r} has {what} (members: {', '.join(sorted(by_ext))[:120]}); a sample in timm's "
            "layout is <key>.jpg and <key>.cls: re-write the tar or drop the sample"
        )
    cls = by_ext[TAR_LABEL_EXT]
    label = parse_label(_member_bytes(tar, cls, LABEL_MAX_BYTES + 1)) if cls.size <= LABEL_MAX_BYTES else None
    if label is None or label > MAX_LABEL:
        raise UserError(f"{path}: {cls.name}: not a class index (an ASCII integer 0..{MAX_LABEL}); fix the sample")
    image = images[0]
    too_large = too_many_bytes(image.size, max_pixels)  # before a byte is read, as the converter refuses a file
    if too_large:
        raise UserError(f"{path}: {image.name}: {too_large}")
    try:
        member = tar.extractfile(image)
        if member is None:
            raise ValueError("not a regular member")
        header = displayed_header(member)  # the header only: nothing is decoded
        if header.format not in IN_PLACE_FORMATS:
            raise ValueError(f"a {header.format} image")
    except Image.DecompressionBombError as e:  # past twice Image.MAX_IMAGE_PIXELS (`scan_tar` sets it)
        raise UserError(f"{path}: {image.name}: {bomb_refusal(e, max_pixels)}") from None
    except (UnidentifiedImageError, ValueError, SyntaxError, IndexError) as e:
        raise UserError(
            f"{path}: {image.name}: not an image DALI decodes ({str(e)[:80]}); re-write the sample with its JPEG"
        ) from None
    if header.transparent:
        raise UserError(f"{path}: {image.name}: {TRANSPARENT_IN_PLACE}")
    height, width = header[:2]
    too_large = too_many_pixels(width, height, max_pixels)
    if too_large:
        raise UserError(f"{path}: {image.name}: {too_large}")
    try:
        check_whole(
            header, _member_tail(tar, image, 8), lambda: _member_bytes(tar, image, MAX_BYTES_PER_PIXEL * max_pixels)
        )
    except ValueError as e:
        raise UserError(f"{path}: {image.name}: {e}; re-write the sample with its whole image") from None
    if sizes is not None:
        sizes.append((height, width))
    if "json" in by_ext and by_ext["json"].size <= JSON_CAP:
        try:
            doc = json.loads(_member_bytes(tar, by_ext["json"], JSON_CAP))
        except (ValueError, RecursionError):
            doc = None
        if isinstance(doc, dict):
            synset = next((doc[k] for k in SYNSET_KEYS if isinstance(doc.get(k), str)), "")
            text = next((doc[k] for k in TEXT_KEYS if isinstance(doc.get(k), str)), "")
            if synset or text:
                named = (synset or text, text if synset else "")
                if (
                    names.setdefault(label, named) != named
                ):  # as between tars (`make_index`): which is wrong, only the user knows
                    raise UserError(
                        f"{path}: {by_ext['json'].name} names label {label} {named[0][:80]!r}, an earlier sample "
                        f"{names[label][0][:80]!r}; fix the .json members of the wrong one"
                    )
    return label


def _member_tail(tar: tarfile.TarFile, m: tarfile.TarInfo, count: int) -> bytes:
    """The last ``count`` bytes of regular member ``m`` (one seek, not a read of the member)."""
    f = tar.extractfile(m)
    if f is None:
        return b""
    f.seek(max(0, m.size - count))
    return f.read(count)


def _member_bytes(tar: tarfile.TarFile, m: tarfile.TarInfo, cap: int) -> bytes:
    """At most ``cap`` bytes of regular member ``m``."""
    f = tar.extractfile(m)
    return f.read(cap) if f is not None else b""


def make_index(
    data_dir: str,
    index_folder: Callable[[], tuple[str, str]],
    num_classes: int | None = None,
    workers: int = 1,
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
) -> Manifest:
    """Indexes WebDataset folder ``data_dir`` (the module's docstring): writes each tar's index and returns its
    manifest, which `data_tools.make_index.publish` writes.
    ``index_folder()``: where the indexes, sizes and ``dataset.json`` go and the manifest's ``data_dir`` (the
    folder of the tars where not that one, `data_tools.make_index`'s ``--out``), asked once the set is checked
    whole: nothing is written into ``data_dir`` itself then."""
    files, lengths, totals, info_classes = _split_files(data_dir)
    info = info_path(data_dir) or data_dir
    if not files:
        raise UserError(
            f"{info}: names no train or validation tars; a WebDataset folder in timm's layout holds "
            "*-train-N.tar and *-validation-N.tar (and _info.json naming them)"
        )
    root = os.path.realpath(data_dir)
    for split, names in files.items():  # before any tar is opened: the set must be whole, each a regular file
        for n in names:
            p = os.path.join(data_dir, n)
            try:
                confined_size(p, root)
            except FileNotFoundError:
                raise UserError(
                    f"{info}: the {split} split names {n}, which {data_dir} lacks; restore it (re-download the "
                    "missing tars), then rerun " + make_index_fix(data_dir)
                ) from None
            except OSError as e:
                raise UserError(f"{p}: {e.strerror}; {CONFINED_FIX}") from None
    index_dir, shard_dir = index_folder()
    jobs = [
        (os.path.join(data_dir, n), os.path.join(index_dir, index_name(n)), split == "validation", max_pixels)
        for split, names in files.items()
        for n in names
    ]
    if workers > 1 and len(jobs) > 1:
        with cf.ProcessPoolExecutor(min(workers, len(jobs)), mp_context=mp.get_context("spawn")) as pool:
            results = list(pool.map(scan_tar, *zip(*jobs)))
    else:
        results = [scan_tar(*job) for job in jobs]
    by_name = {r[0]: r for r in results}
    splits: dict[str, list[ShardInfo]] = {}
    seen: dict[int, tuple[str, str]] = {}
    for split, names in files.items():
        counts = [by_name[n][1] for n in names]
        stated = lengths.get(split)
        for n, count, want in zip(names, counts, stated or []):
            if count != want:
                raise UserError(
                    f"{info}: states {want:,} samples for {n}, which holds {count:,}; re-download {n} (or the "
                    f"_info.json that goes with these tars)"
                )
        if split in totals and totals[split] != sum(counts):
            raise UserError(
                f"{info}: states {totals[split]:,} {split} samples, the tars hold {sum(counts):,}; re-download the "
                "tars that differ (or the _info.json that goes with them)"
            )
        for n in names:
            _, count, size, _, labels, sizes = by_name[n]
            for k, v in labels.items():
                if seen.setdefault(k, v) != v:  # one of them names the wrong class: which, only the user knows
                    raise UserError(
                        f"{os.path.join(data_dir, n)}: a sample's .json names label {k} {v[0][:80]!r}, another tar's "
                        f"{seen[k][0][:80]!r}; fix the .json members of the wrong one"
                    )
            splits[split] = splits.get(split, []) + [ShardInfo(n, index_name(n), count, size, None, sizes)]
    top = max(r[3] for r in results)
    inferred = top + 1
    want = num_classes or max(inferred, len(info_classes))
    if inferred > want:
        bad = next(os.path.join(data_dir, r[0]) for r in results if r[3] == top)
        raise UserError(
            f"{bad}: a sample has label {top}, outside the {want:,} classes "
            f"({'_info.json classes' if info_classes else '--num-classes'}); fix the sample's .cls, or pass "
            f"--num-classes {inferred}"
        )
    if info_classes:
        classes = [ClassInfo(i, name) for i, name in enumerate(info_classes)]
    elif seen and len(seen) == want:
        classes = [ClassInfo(k, *seen[k]) for k in sorted(seen)]
    else:
        classes = []
    if any(len(c.synset) > MAX_SYNSET or len(c.text) > MAX_CLASS_TEXT for c in classes):
        print(f"warning: {data_dir}: a class name is longer than {MANIFEST_NAME} holds; it lists none", file=sys.stderr)
        classes = []
    m = Manifest(
        num_classes=want,
        label_offset=0,
        classes=classes,
        splits=splits,
        tool="data_tools.make_index",
        tool_version="1.0.0",
        data_dir=index_dir,
        shard_dir=shard_dir,
        format=WDS_FORMAT,
    )
    return m
