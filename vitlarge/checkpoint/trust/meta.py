"""A checkpoint's ``meta.json``, read as data from elsewhere: bounded, typed, and confined to its folder.

Checkpoints are handed between people (a colleague's run, a shared workdir), so nothing in one is
trusted: meta.json is read through `fileio.read_capped` (a regular file of at most `META_MAX_BYTES`,
never a symlink, FIFO or device), then checked key by key before anything uses it (`problem_of`):
types and ranges (a negative ``step``, a ``world_size`` of 10^11, ``files: []``), and every name it
lists is a plain file name of a kind a checkpoint holds (`LISTED_NAME`: no ``/``, no ``..``), so every
read it leads to stays inside the folder. The files themselves are then checked where they are read
(`fileio.size_problem` refuses a symlink or a FIFO under a listed name).

This module imports nothing heavy: store.py and trust/index.py both read meta.json through it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import typing
from dataclasses import dataclass
from pathlib import Path

from vitlarge import fileio
from vitlarge.config.checks import check_read_back
from vitlarge.config.renamed import upgrade_recorded
from vitlarge.config.schema import MAX_EPOCHS, MAX_PHASES, Config
from vitlarge.data.manifest_schema import MAX_CLASSES, MAX_SYNSET, distinct_names
from vitlarge.errors import UserError

FORMAT_VERSION = 3
# 1: before meta.json recorded sizes and checksums (only emptiness is checked); 1 and 2: model.safetensors
# and torch.save optimizer files (read by vitlarge/checkpoint/legacy.py); 3: DCP.
READABLE_FORMATS = (1, 2, 3)
STEP_DIR = re.compile(r"^step_(\d{7,})$")
REQUIRED_META = ("step", "world_size", "model", "param_shapes")
META_MAX_BYTES = 4 << 20
"""meta.json's size cap: a 1024-rank ViT-H checkpoint's is about 0.3 MB (its config, shapes and file list; the
list grows by ~140 bytes a rank, so some 28,000 ranks fit). JSON of empty objects makes ~25 bytes of objects
per byte: a file at the cap costs ~100 MB to parse, whatever it holds."""
LINE_MAX_CHARS = 4096
"""The longest ``line`` (the path of the run a checkpoint continues) meta.json may hold: Linux's ``PATH_MAX``.
Every later checkpoint copies it, so a 40 MB one was written again at each save."""
MAX_WORLD_SIZE = 1 << 20
MAX_STEP = 10**12
MAX_EXAMPLES = 10**13
LISTED_NAME = re.compile(
    r"^(?:__\d{1,7}_\d{1,7}\.distcp|\.metadata|rank_\d{5,7}\.pt|model\.safetensors|optimizer\.pt"
    r"|optimizer_rank_\d{5,7}\.pt)$"
)
"""Every file name a checkpoint of any readable format lists: plain names, so every read stays in the folder."""
CRC = re.compile(r"^[0-9a-f]{8}$")
CLASSES_MAX_BYTES = 1 << 20
"""The most bytes of JSON the class names in meta.json (``classes``) take: ImageNet-21k's 21,841 synsets take
~0.3 MB. A data set whose names take more is recorded without them (evaluated by index, said in one line), so
meta.json stays within `META_MAX_BYTES` with its config, shapes and file list."""


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x: object) -> typing.TypeGuard[int | float]:
    """A finite int or float, not a bool. An int beyond a float's range (``10**400``) is not one: every consumer
    converts to float, and ``math.isfinite`` itself raises OverflowError on it."""
    if isinstance(x, int) and not isinstance(x, bool):
        return -(2**1023) <= x <= 2**1023
    return isinstance(x, float) and math.isfinite(x)


@dataclass(frozen=True)
class MetaRead:
    """meta.json of a checkpoint folder (``meta``), or why there is no usable one (``problem``): exactly one is set."""

    meta: dict | None
    problem: str | None = None


def read(path: Path) -> MetaRead:
    """meta.json of checkpoint folder ``path``, read and checked (`problem_of`), or why it is not a usable one."""
    if not path.exists():
        return MetaRead(None, "does not exist")
    meta_file = path / "meta.json"
    try:
        raw = fileio.read_capped(meta_file, META_MAX_BYTES, follow=False)
    except FileNotFoundError:
        return MetaRead(None, "no meta.json")
    except fileio.UnsafeFile as e:  # a link, FIFO or device, or past the cap: never read
        return MetaRead(None, f"meta.json {e.strerror}")
    except OSError as e:
        return MetaRead(None, f"meta.json cannot be read ({e.strerror})")
    try:
        meta = json.loads(raw)
    except RecursionError:
        return MetaRead(None, "meta.json is nested too deeply to be a checkpoint's")
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
        return MetaRead(None, f"meta.json is not JSON: {str(e).splitlines()[0]}")
    problem = problem_of(meta, path)
    if problem:
        return MetaRead(None, problem)
    if "config" in meta:  # a key renamed since the checkpoint was written: read as its successor
        meta = {**meta, "config": upgrade_recorded(meta["config"])}
    return MetaRead(meta)


def problem_of(meta, path: Path | None = None) -> str | None:
    """Why ``meta`` (parsed meta.json of folder ``path``) cannot be a checkpoint's, or None. Checked
    before anything reads it: every key a reader uses, with its type and range."""
    if not isinstance(meta, dict):
        return "meta.json is not a JSON object"
    version = meta.get("format_version")
    if not _is_int(version) or version not in READABLE_FORMATS:
        readable = " and ".join(map(str, READABLE_FORMATS))
        return f"checkpoint format {str(version)[:40]}, this vitlarge reads {readable}"
    missing = [k for k in REQUIRED_META + (("files",) if version >= 2 else ()) if k not in meta]
    if missing:
        return f"meta.json lacks '{missing[0]}'"
    step, world = meta["step"], meta["world_size"]
    if not _is_int(step) or not 0 <= step <= MAX_STEP:
        return f"meta.json's step is {str(step)[:40]!s}, not a whole number from 0 to {MAX_STEP:,}"
    if path is not None:
        m = STEP_DIR.match(path.name)
        if m and int(m.group(1)) != step:
            return f"meta.json's step {step} is not the folder's ({path.name})"
    if not _is_int(world) or not 1 <= world <= MAX_WORLD_SIZE:
        return f"meta.json's world_size is {str(world)[:40]}, not a whole number from 1 to {MAX_WORLD_SIZE:,}"
    if not isinstance(meta["model"], str):
        return "meta.json's model is not a name"
    shapes = meta["param_shapes"]
    if not isinstance(shapes, dict) or not all(
        isinstance(s, list) and all(_is_int(d) and d >= 0 for d in s) for s in shapes.values()
    ):
        return "meta.json's param_shapes is not a map of names to shapes"
    if "classes" in meta:
        problem = classes_problem(meta["classes"], shapes)
        if problem:
            return problem
    for key in ("optimizer_state", "ema"):
        if key in meta and not isinstance(meta[key], bool):
            return f"meta.json's {key} is not true or false"
    if "line" in meta and meta["line"] is not None and not isinstance(meta["line"], str):
        return "meta.json's line is not a path"
    if len(line := meta.get("line") or "") > LINE_MAX_CHARS:
        return f"meta.json's line is {len(line):,} characters long, not a path (at most {LINE_MAX_CHARS:,})"
    if "schedule" in meta:
        problem = schedule_problem(meta["schedule"], step)
        if problem:
            return problem
    config = meta.get("config", {})
    if not isinstance(config, dict):
        return "meta.json's config is not a map of sections"
    problem = _saved_config_problem(config)
    if problem:
        return problem
    if version >= 2:
        return files_problem(meta["files"], version)
    return None


def schedule_problem(record, step: int) -> str | None:
    """Why meta.json's ``schedule`` (`vitlarge.plan.plan.Plan.record`: the training images the plan was made for,
    and where a resume re-planned the lr) is not one a checkpoint of step ``step`` records, or None."""
    if not isinstance(record, dict):
        return "meta.json's schedule is not a map"
    n = record.get("num_train_examples")
    if n is not None and not (_is_int(n) and 1 <= n <= MAX_EXAMPLES):
        return (
            f"meta.json's schedule.num_train_examples is {str(n)[:40]}, not a whole number from 1 to {MAX_EXAMPLES:,}"
        )
    e = record.get("counted_from")
    if e is not None:
        if not (isinstance(e, dict) and _is_int(e.get("step")) and 0 <= e["step"] <= step):
            return f"meta.json's schedule.counted_from is not {{'step': a step from 0 to {step}, 'epoch': an epoch}}"
        epoch = e.get("epoch")
        if not (is_number(epoch) and 0 <= epoch <= MAX_EPOCHS):
            return (
                f"meta.json's schedule.counted_from.epoch is {str(epoch)[:40]}, not an epoch from 0 to {MAX_EPOCHS:g}"
            )
        if "epoch" not in record:  # what `vitlarge.plan.edits.resume_plan` checks the count against
            return "meta.json's schedule.counted_from without schedule.epoch (the epochs done at its step)"
    if "epoch" in record and not (is_number(record["epoch"]) and 0 <= record["epoch"] <= MAX_EPOCHS):
        return f"meta.json's schedule.epoch is {str(record['epoch'])[:40]}, not an epoch from 0 to {MAX_EPOCHS:g}"
    c = record.get("continues")
    if c is None:
        return None
    if not (isinstance(c, dict) and _is_int(c.get("step")) and 0 <= c["step"] <= step):
        return f"meta.json's schedule.continues is not {{'step': a step from 0 to {step}, 'base_lr': an lr}}"
    lr = c.get("base_lr")
    if not (is_number(lr) and lr >= 0):
        return f"meta.json's schedule.continues.base_lr is {str(lr)[:40]}, not a finite lr >= 0"
    return None


def recordable_classes(names) -> bool:
    """Whether ``names`` (a data set's class names in label order) are class names meta.json may record: a list of
    at most `MAX_CLASSES` distinct names of 1 to `MAX_SYNSET` characters, at most `CLASSES_MAX_BYTES` as JSON."""
    return distinct_names(names) and 0 < len(names) <= MAX_CLASSES and len(json.dumps(names)) <= CLASSES_MAX_BYTES


def classes_problem(names, shapes: dict) -> str | None:
    """Why meta.json's ``classes`` are not the class names of the checkpoint's outputs (`recordable_classes`, one per
    row of its ``head.weight`` in ``shapes``), or None. A checkpoint written before it recorded them has none."""
    if not recordable_classes(names):
        return (
            f"meta.json's classes is not a list of at most {MAX_CLASSES:,} distinct class names of at most "
            f"{MAX_SYNSET:,} characters ({CLASSES_MAX_BYTES:,} bytes in all)"
        )
    head = shapes.get("head.weight")
    if head and head[0] != len(names):
        return f"meta.json's classes lists {len(names):,} names, its head.weight has {head[0]:,} outputs"
    return None


def files_problem(files, version: int) -> str | None:
    """Why meta.json's ``files`` is not a list of this checkpoint's own files with their records, or None."""
    if not isinstance(files, dict) or not files:
        return "meta.json's files is not a map of file names to records"
    for name, record in files.items():
        if not LISTED_NAME.match(name):
            return f"meta.json lists {name[:80]!r}, not a checkpoint file name (refused: files stay in the folder)"
        if not (
            isinstance(record, dict)
            and _is_int(record.get("bytes"))
            and record["bytes"] >= 0
            and isinstance(record.get("crc32c"), str)
            and CRC.match(record["crc32c"])
        ):
            return f"meta.json's record of {name} is not {{'bytes': a size, 'crc32c': 8 hex digits}}"
    if version >= 3 and ".metadata" not in files:
        return "meta.json does not list .metadata (DCP's index)"
    if not any(n.startswith("rank_") for n in files):
        return "meta.json lists no rank_NNNNN.pt file"
    return None


def _saved_config_problem(config: dict) -> str | None:
    """Why the config a checkpoint recorded breaks the schema's rules for a key this vitlarge knows (types, ranges,
    what fields allow only together, the phase list: `check_read_back`), or None. The resume plans the run it
    continues from it and the evaluation evaluates as it says: a value no recipe may give (``train.micro_batch=0``,
    ``train.epochs=1e308``) makes the checkpoint unusable, passed over by an automatic resume. Keys it does not know
    (another version's) pass, as do Literal values of another version (their readers say what they make of them)."""
    phases = config.get("train", {}).get("phases") if isinstance(config.get("train"), dict) else None
    if isinstance(phases, list) and len(phases) > MAX_PHASES:  # counted before any entry is read
        return f"meta.json's config: train.phases holds {len(phases):,} entries, more than {MAX_PHASES:,}"
    cfg = Config()
    for section, values in config.items():
        target = getattr(cfg, section, None)
        if not dataclasses.is_dataclass(target):
            continue
        if not isinstance(values, dict):
            return f"meta.json's config.{section} is not a map of keys to values"
        hints = typing.get_type_hints(type(target))
        for name, value in values.items():
            if name not in hints:
                continue
            if typing.get_origin(hints[name]) is typing.Literal and isinstance(value, str):
                continue  # a value another version allowed (train.plugin=zero): its readers say what they make of it
            setattr(target, name, value)
    try:
        check_read_back(cfg, "meta.json's config")
    except UserError as e:
        return str(e).split("; ")[0]
    return None


def expected_files(meta: dict) -> dict[str, dict | None]:
    """File name -> record (size, CRC32C) for every file the checkpoint must hold; None where format 1 kept none."""
    if meta["format_version"] >= 2:
        return meta["files"]
    names = ["model.safetensors", "optimizer.pt"] + [f"rank_{r:05d}.pt" for r in range(meta["world_size"])]
    return dict.fromkeys(names)


def listed_files(folder: Path) -> dict[str, dict]:
    """meta.json's ``files`` of format-3 checkpoint ``folder``; ValueError saying why there are none."""
    found = read(Path(folder))
    meta = found.meta
    if meta is None:
        raise ValueError(found.problem)
    if meta["format_version"] < 3:
        raise ValueError(f"format {meta['format_version']} has no DCP index")
    return meta["files"]
