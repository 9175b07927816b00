"""Fuzzes the formats vitlarge reads from elsewhere, in one process started by tests/e2e/test_fuzz_files.py.

``python -m tests.helpers.fuzz_files SCRATCH DEMO_DATA SEED CASES [FORMAT ...]`` makes a real checkpoint, loader state
and data set under SCRATCH, then for each format feeds ``CASES`` random mutations of the real file (a
fixed seed per format: a format's first N cases do not depend on CASES) to the entry points that read it,
as a user's command would (evaluate's and init_from's weight reads, then an automatic resume and its
restore; an export's config.json as evaluate reads it; meta.json's phase list and schedule record; the loader;
make_index and the manifest; a TFDS folder's metadata and shards through make_index --out; WebDataset tars through make_index and the loader; the MLflow hook over a workdir's own store; an overrides file's load and the model it
sizes; a loader state's DALI fields and a shard's record payloads through the loader; the GPU parts bundle's receive
and join; a Hugging Face parquet set converted).
``FORMAT ...`` after CASES runs only those formats. Each case must end in a clean pass or a one-line `UserError`
(what the CLIs turn into exit 2; for a tracker, its one warning line, training going on); anything else is
reported as a traceback. An audit hook records every write, removal, rename, process start or network connection
outside SCRATCH, and every case runs under a 60 s alarm (a hang is reported, not waited for). Prints one JSON
object: per format the counts, the failures, the seconds and the largest peak RSS of one of its cases (the
kernel's high-water mark, reset before each case); the violations and the whole process's peak RSS.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import logging
import os
import pickle
import random
import resource
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path

import torch

SCRATCH: Path
violations: list[str] = []
_watch = False
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _inside(path) -> bool:
    if isinstance(path, int):
        return True  # a descriptor: its opening was seen
    p = os.path.abspath(os.fsdecode(path))
    return p == os.devnull or p.startswith(str(SCRATCH) + os.sep) or p.startswith("/dev/shm/")


def _audit(event: str, args) -> None:
    if not _watch:
        return
    if event == "open":
        path, mode, flags = args
        writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (flags or 0) & WRITE_FLAGS
        if writes and path is not None and not _inside(path):
            violations.append(f"open for writing outside the scratch folder: {path}")
    elif event in ("os.remove", "os.rmdir", "os.mkdir", "os.symlink", "os.link", "os.truncate", "shutil.rmtree"):
        # A relative name under a folder's descriptor (shutil.rmtree's walk, after its own audited event): inside.
        under_fd = event in ("os.remove", "os.rmdir", "os.mkdir") and isinstance(args[-1], int)
        if args and args[0] is not None and not under_fd and not _inside(args[0]):
            violations.append(f"{event} outside the scratch folder: {args[0]}")
    elif event in ("os.rename", "os.replace"):
        if not (_inside(args[0]) and _inside(args[1])):
            violations.append(f"{event} outside the scratch folder: {args[0]} -> {args[1]}")
    elif event in ("os.system", "subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn", "os.fork"):
        violations.append(f"{event}: {str(args)[:200]}")
    elif event == "socket.connect":  # a file from elsewhere naming a server (an artifact location)
        violations.append(f"{event}: {str(args[1])[:200]}")


class Hang(Exception):
    pass


def _alarm(*_):
    raise Hang("no answer within 60 s")


def reset_peak_rss() -> None:
    """Sets the process's peak RSS (VmHWM) back to its RSS now (Linux's clear_refs 5), so that each case's peak is
    its own; where the kernel has no such file, peaks are the process's so far."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss_mib() -> int:
    """The process's peak RSS since `reset_peak_rss` (VmHWM), in MiB."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) // 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


# Mutations -----------------------------------------------------------------------------------------

JUNK = [
    -1,
    0,
    2**63,
    10**20,
    -(10**12),
    1.5,
    float("inf"),
    "abc",
    "",
    "../../etc/hostname",
    "/dev/zero",
    [],
    {},
    None,
    True,
    [1, 2],
    {"a": 1},
    "x" * 300,
]


SIDES = [0, 1, 15, 16, 18, 32, 256, 1024, 1025, 4096, 16384, 1 << 40, -16]
"""Image sides a file may state: whole patches of 4 (the demo model's) and not, up to and past `MAX_IMAGE_SIZE`."""
EXPORT_KEYS = ["img_size", "input_size", "mean", "std", "crop_pct"]
PHASE_VALUE_KEYS = [
    "image_size",
    "eval_size",
    "global_batch",
    "micro_batch",
    "lr_scale",
    "lr",
    "crop_scale",
    "rect_val",
]


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    how = rng.randrange(5)
    if how == 0 and b:
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    elif how == 1:
        del b[rng.randrange(len(b) + 1) :]
    elif how == 2 and b:
        i = rng.randrange(len(b))
        b[i:i] = b[i : i + rng.randint(1, 64)]
    elif how == 3:
        i = rng.randrange(len(b) + 1)
        b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    else:
        i = rng.randrange(len(b) + 1)
        b[i : i + rng.randint(1, 32)] = bytes(rng.randint(1, 32))
    return bytes(b)


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:8]):
            yield from _paths(v, prefix + (i,))


def mutate_doc(doc, rng: random.Random):
    """A JSON-like tree with one value replaced by junk, a key removed or added, or nested deeply."""
    doc = copy.deepcopy(doc)
    paths = [p for p in _paths(doc) if p]
    if not paths:
        return rng.choice(JUNK)
    path = rng.choice(paths)
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    how = rng.randrange(4)
    if how == 0 and isinstance(parent, dict):
        del parent[path[-1]]
    elif how == 1 and isinstance(parent, dict):
        parent[rng.choice(["extra", "../x", ""])] = rng.choice(JUNK)
    elif how == 2:
        deep = []
        for _ in range(rng.choice([50, 5000])):
            deep = [deep]
        parent[path[-1]] = deep
    else:
        parent[path[-1]] = rng.choice(JUNK)
    return doc


def dump(doc) -> bytes:
    try:
        return json.dumps(doc).encode()
    except (ValueError, RecursionError):
        return b"[" * 100_000


def reseal(path: Path) -> None:
    import crc32c

    try:
        meta = json.loads((path / "meta.json").read_bytes())
        for name in meta["files"]:
            data = (path / name).read_bytes()
            meta["files"][name] = {"bytes": len(data), "crc32c": f"{crc32c.crc32c(data):08x}"}
        (path / "meta.json").write_text(json.dumps(meta))
    except Exception:  # noqa: BLE001 - a mutated meta.json may not be resealable: then it stays as it is
        pass


# The trackers' files: a handed-over workdir's MLflow store (mlflow.db, mlartifacts) and the names beside it.
# W&B is not driven here: wandb.init starts its service process (what the audit hook reports); its folder's
# guard is tests/unit/hooks/test_planted_links.py's.

TRACKER_NAMES = [
    "mlflow.db",
    "mlflow.db-journal",
    "mlflow.db-wal",
    "mlartifacts",
    "mlartifacts/{run}",
    "mlartifacts/{run}/artifacts/model",
    "mlartifacts/{run}/artifacts/model/config.json",
    "trackers.json",
]
PLANTS = ["link to a file outside", "link to a folder outside", "dangling link outside", "fifo", "folder", "/dev/zero"]
STORE_COLUMNS = [
    ("experiments", "artifact_location"),
    ("experiments", "name"),
    ("experiments", "lifecycle_stage"),
    ("runs", "artifact_uri"),
    ("runs", "status"),
    ("runs", "lifecycle_stage"),
    ("runs", "experiment_id"),
    ("runs", "run_uuid"),
    ("tags", "value"),
    ("params", "value"),
]


def _outside() -> Path:
    """A folder beside SCRATCH (made by `mlflow_template`): what a crafted store names; a write there is a violation,
    and stays in the test's tmp."""
    return SCRATCH.parent / "outside"


def _locations() -> list[str]:
    out = _outside()
    return [
        out.as_uri(),
        str(out),
        f"{(SCRATCH / 'x' / 'mlartifacts').as_uri()}/../../../outside",
        "http://127.0.0.1:9/x",
        "mlflow-artifacts:/x",
        "s3://bucket/x",
        "file:///dev/zero",
        "file:///proc/self/mem",
    ]


def drive_mlflow(workdir: Path, flush_timeout_s: float = 20) -> None:
    """The MLflow hook over ``workdir``'s own store, through a short run's events (tests/e2e/test_trackers.py's
    `drive`); a warning line it logs (its refusal, a store it cannot use) is raised as the case's one-line
    `UserError`: the tracker's contract is that line and training going on."""
    import logging

    from hooks import MlflowHook
    from tests.helpers.events import EVAL, make_run, step_metrics
    from vitlarge.config.schema import Config
    from vitlarge.errors import UserError

    cfg = Config()
    cfg.log.mlflow, cfg.log.experiment = True, "fuzz"
    lines: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("vitlarge").addHandler(handler)
    try:
        hook = MlflowHook(str(workdir), flush_timeout_s=flush_timeout_s)
        run = make_run(workdir, cfg=cfg)
        hook.on_train_start(run)
        for s in (1, 2, 3):
            hook.on_step_end(run, step_metrics(s))
        hook.on_eval_end(run, EVAL)
        hook.on_train_end(run, EVAL)
        export = workdir / "model"
        if not export.is_dir():
            export.mkdir()
            (export / "config.json").write_text("{}")
        hook.on_export(run, str(export))
        hook.on_close(run)
    finally:
        logging.getLogger("vitlarge").removeHandler(handler)
    if lines:
        raise UserError(lines[0] if len(lines) == 1 else f"{len(lines)} lines: " + " | ".join(lines))


def mlflow_template() -> Path:
    """A workdir after one tracked run on its own store (MLflow's migrations: seconds, once), copied by each case."""
    template = SCRATCH / "tracked"
    if not template.exists():
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        _outside().mkdir(exist_ok=True)
        template.mkdir()
        drive_mlflow(template, flush_timeout_s=600)  # a new store's migrations: seconds, more on a loaded machine
    return template


def _tracked_copy(case: int) -> tuple[Path, str]:
    """A copy of the tracked workdir as a workdir of its own (the absolute paths its database and trackers.json record
    moved with it; a path of its own too: MLflow keeps a store's connection per URI for the process), and its run's
    id."""
    import sqlite3

    template, work = mlflow_template(), SCRATCH / f"case{case}" / "run"
    shutil.copytree(template, work, symlinks=True)
    con = sqlite3.connect(work / "mlflow.db")
    for table, column in (("experiments", "artifact_location"), ("runs", "artifact_uri"), ("tags", "value")):
        con.execute(f"UPDATE {table} SET {column} = REPLACE({column}, ?, ?)", (str(template), str(work)))
    con.commit()
    con.close()
    state = (work / "trackers.json").read_text().replace(str(template), str(work))  # its store's URI
    (work / "trackers.json").write_text(state)
    return work, json.loads(state)["lines"][""]["mlflow"]["id"]


def mlflow_store(case: int, rng: random.Random) -> None:
    """mlflow.db edited as a forger would (an artifact location set to one elsewhere, or any column of every row
    set to junk), or its bytes damaged; half the cases without trackers.json (a new tracked run)."""
    import sqlite3

    work, _ = _tracked_copy(case)
    db = work / "mlflow.db"
    how = rng.random()
    if how < 0.75:
        if how < 0.4:
            table, column = rng.choice([("experiments", "artifact_location"), ("runs", "artifact_uri")])
            value = rng.choice(_locations())
        else:
            table, column = rng.choice(STORE_COLUMNS)
            value = rng.choice([v for v in JUNK if isinstance(v, (int, float, str, type(None)))])
        con = sqlite3.connect(db)
        try:
            con.execute(
                f"UPDATE {table} SET {column} = ?", (min(value, 2**63 - 1) if isinstance(value, int) else value,)
            )
            con.commit()
        except sqlite3.Error:  # a constraint the schema keeps: the store as it was
            pass
        finally:
            con.close()
    else:
        db.write_bytes(mutate_bytes(db.read_bytes(), rng))
    if rng.random() < 0.5:
        (work / "trackers.json").unlink()
    drive_mlflow(work)


def tracker_names(case: int, rng: random.Random) -> None:
    """A name the workdir's store creates or writes through, planted as a link out, a FIFO, a folder or a device."""
    work, run = _tracked_copy(case)
    name = work / rng.choice(TRACKER_NAMES).format(run=run)
    _planting(name, rng.choice(PLANTS), _outside() / f"planted{case}")
    if rng.random() < 0.5:
        (work / "trackers.json").unlink(missing_ok=True)
    drive_mlflow(work)


def _planting(name: Path, plant: str, target: Path) -> None:
    """What the one who handed the workdir over did (outside SCRATCH too: not watched)."""
    with _unwatched():
        _plant(name, plant, target)


@contextlib.contextmanager
def _unwatched():
    global _watch
    was, _watch = _watch, False
    try:
        yield
    finally:
        _watch = was


def _plant(name: Path, plant: str, target: Path) -> None:
    if name.is_dir() and not name.is_symlink():
        shutil.rmtree(name)
    else:
        name.unlink(missing_ok=True)
    name.parent.mkdir(parents=True, exist_ok=True)
    if plant == "link to a file outside":
        target.write_text("precious")
        name.symlink_to(target)
    elif plant == "link to a folder outside":
        target.mkdir()
        name.symlink_to(target)
    elif plant == "dangling link outside":
        name.symlink_to(target)
    elif plant == "fifo":
        os.mkfifo(name)
    elif plant == "folder":
        name.mkdir()
    else:
        name.symlink_to("/dev/zero")


# Overrides files, a loader state's DALI fields, TFRecord payloads -------------------------------------------------

OVERRIDES_YAML = (
    "optim:\n  lr: 0.001\n  betas: [0.9, 0.98]\nmodel.kwargs: {depth: 2, embed_dim: 48}\n"
    "train:\n  compile: off\n  phases:\n    - {epoch: 0, image_size: 16}\n    - {epoch: 3, image_size: 24}\n"
)
OVERRIDES_PY = (
    "optim.lr = 0.001\noptim.betas = (0.9, 0.98)\nmodel.kwargs = {'depth': 2, 'embed_dim': 48}\n"
    "train.phases = [{'epoch': 0, 'image_size': 16}, {'epoch': 3, 'image_size': 24}]\n"
)


def mutate_overrides(text: str, rng: random.Random, yaml: bool) -> bytes:
    """An overrides file with a bomb (aliases that double, a cycle, deep or wide nesting, a long expression), a
    value of another type at a known key, or random bytes."""
    how = rng.randrange(4)
    if how == 0 and yaml:
        n = rng.choice([3, 25, 40])
        lines = ["model:", "  kwargs:", "    a0: &a0 [x, x]"] + [
            f"    a{i}: &a{i} [*a{i - 1}, *a{i - 1}]" for i in range(1, n)
        ]
        return ("\n".join(rng.choice([lines, ["optim: &a {lr: 0.1, x: *a}"]])) + "\n").encode()
    if how == 0:
        op = rng.choice(["-", "1+", "not ", "("])
        return f"optim.lr = {op * rng.choice([50, 3_000, 100_000])}1\n".encode()
    if how == 1:
        depth, width = rng.choice([(5, 1), (40, 1), (3_000, 1), (1, 3_000)])
        value = "[" * depth + ", ".join(["1"] * width) + "]" * depth
        key = rng.choice(["optim.lr", "model.kwargs.depth", "train.phases", "optim.betas"])
        return (f"{key}: {value}\n" if yaml else f"{key} = {value}\n").encode()
    if how == 2:
        key = rng.choice(
            [
                "model.kwargs.depth",
                "model.kwargs.mlp_ratio",
                "model.kwargs.qkv_bias",
                "optim.lr",
                "train.micro_batch",
                "model.kwargs.global_pool",
                "train.phases.1.image_size",
            ]
        )
        value = rng.choice(["two", "1e999", "-1", "[]", "{}", "none", "''", "true", "0x10", "1" * 5000, "0.5"])
        return (f"{key}: {value}\n" if yaml else f"{key} = {value!r}\n").encode()
    return mutate_bytes(text.encode(), rng)


def dali_checkpoint_edit(doc: dict, rng: random.Random) -> dict:
    """A loader state (its JSON) whose DALI checkpoint has one field set to junk: the reader's age, epoch or
    random state, the pipeline's iter/epoch_idx, an operator's state or name."""
    from vitlarge.data import dali_state

    checkpoint = dali_state.parse(base64.b64decode(doc["dali"]))
    reader = next(op for op in checkpoint.cpts if op.operator_name == "Reader")
    snapshot = dali_state.reader_snapshot(reader.operator_state)
    numbers = [-(2**31), -1, 0, 1, 1436, 1437, 1438, 2**20, 2**31 - 1]
    field = rng.choice(["age", "current_epoch", "rng", "pipeline_data", "op_state", "op_name"])
    if field in ("age", "current_epoch"):
        setattr(snapshot.loader_state, field, rng.choice(numbers))
    elif field == "rng":
        snapshot.loader_state.rng = rng.choice([b"", b"0", b"2147483647", b"junk", b"1" * 400, b"-5", b"\xff"])
    elif field == "pipeline_data":
        iteration, epoch = rng.choice(numbers + [10**30, "x", None]), rng.choice([0, -1, 2**40, "x"])
        text = (
            json.dumps({"iter": iteration, "epoch_idx": epoch}) if rng.random() < 0.8 else rng.choice(["[]", "", "{"])
        )
        checkpoint.external_ctx_cpt.pipeline_data = text.encode()
    elif field == "op_state":
        op = rng.choice(list(checkpoint.cpts))
        op.operator_state = mutate_bytes(op.operator_state, rng)
    else:
        rng.choice(list(checkpoint.cpts)).operator_name = rng.choice(["Reader", "", "x" * 300, "__CoinFlip_2"])
    reader.operator_state = snapshot.SerializeToString()
    doc["dali"] = base64.b64encode(checkpoint.SerializeToString()).decode()
    return doc


def mutate_payload(payload: bytes, rng: random.Random) -> bytes:
    """A record's Example bytes, mutated: random bytes, cut, a label or image feature of another type."""
    from data_tools import tfrecord_io

    if rng.random() < 0.5:
        return mutate_bytes(payload, rng)
    features = rng.choice(
        [
            {"image/encoded": (b"", "byte"), "image/class/label": (1, "int")},
            {"image/encoded": (payload[:100], "byte"), "image/class/label": (2**62, "int")},
            {"image/encoded": (payload, "byte"), "image/class/label": (1.5, "float")},
            {"image/encoded": (payload, "byte"), "image/class/label": ([1, 2, 3], "int")},
            {"image/class/label": (1, "int")},
            {"image/encoded": ([payload, payload], "byte"), "image/class/label": (-(2**40), "int")},
        ]
    )
    return tfrecord_io.encode_example(features)


def overrides_and_data_formats(scratch: Path, data: Path, state: str, rng: random.Random, cases: int) -> dict:
    """The formats of this section, each ``name: (case function, number of cases)`` as `main` runs them."""
    import struct

    from data_tools import tfrecord_io
    from tests.helpers import ROOT
    from tests.helpers.loaders import open_train
    from vitlarge.config.load import load_config
    from vitlarge.model.vit import describe_model

    recipe = ROOT / "recipes" / "demo_digits.py"
    cpu = torch.device("cpu")

    def overrides(case, suffix, text):
        f = scratch / f"case{case}" / f"overrides{suffix}"
        f.parent.mkdir(parents=True)
        f.write_bytes(mutate_overrides(text, rng, yaml=suffix == ".yaml"))
        cfg = load_config(recipe, override_files=[f])
        if cfg.model.kwargs != {"patch_size": 4, "embed_dim": 48, "depth": 2, "num_heads": 3}:
            # the model they describe, as the dry run sizes it: model.kwargs reach timm there. (A depth a byte
            # mutation made 2222222 is a model that takes minutes to size, not a crafted file: not built here.)
            if all(type(v) is not int or 0 <= v <= 64 or len(str(v)) > 100 for v in cfg.model.kwargs.values()):
                describe_model(cfg)

    def dali_fields(case):
        text = json.dumps(dali_checkpoint_edit(json.loads(state), rng))
        loader = open_train(str(data), 16, 32, rank=0, world_size=1, device=cpu, seed=0, state=text)
        next(loader)

    # A small data set for the payloads: DALI parses a record only when it is returned, so each case reads a whole
    # epoch, 32 records (the demo's first) in one train shard; its index and dataset.json made before the mutation.
    small = scratch / "small"
    small.mkdir()
    source, frames = sorted(data.glob("train-00000-of-*"))[0], []
    with open(source, "rb") as f:
        for _ in range(32):
            header = f.read(12)
            (length,) = struct.unpack("<Q", header[:8])
            frames.append(header + f.read(length + 4))
    (small / "train-00000-of-00001").write_bytes(b"".join(frames))
    for val in data.glob("validation-*-of-*"):
        if val.suffix != ".idx":
            shutil.copyfile(val, small / val.name)
    from data_tools.make_index import make_index

    make_index(str(small), num_classes=10)

    def payloads(case):
        d = scratch / f"case{case}" / "data"
        shutil.copytree(small, d)
        shard = d / "train-00000-of-00001"
        raw, offset = bytearray(shard.read_bytes()), 0
        chosen = set(rng.sample(range(len(frames)), rng.choice([0, 1, 1, 2, 3])))  # none: the epoch reads as it is
        for i, framed in enumerate(frames):
            length = len(framed) - 16
            if i in chosen:  # a few records, anywhere in the shard: size, index and dataset.json kept
                new = tfrecord_io.frame(mutate_payload(framed[12:-4], rng))
                if rng.random() < 0.3:  # a length header past the record, its CRC valid
                    header = struct.pack("<Q", rng.choice([1 << 40, length + 1, 2**64 - 1]))
                    new = header + tfrecord_io._masked_crc(header) + new[12:]
                new = new[: 16 + length] if len(new) > 16 + length else new + b"\0" * (16 + length - len(new))
                raw[offset : offset + 16 + length] = new
            offset += 16 + length
        shard.write_bytes(bytes(raw))
        loader = open_train(str(d), 16, 32, rank=0, world_size=1, device=cpu, seed=0)
        for _ in range(2):  # the epoch
            next(loader)

    return {
        "YAML overrides": (lambda case: overrides(case, ".yaml", OVERRIDES_YAML), cases),
        ".py overrides": (lambda case: overrides(case, ".py", OVERRIDES_PY), cases),
        "loader state DALI fields": (dali_fields, cases),
        "TFRecord payloads": (payloads, max(cases // 4, 10)),
    }


def parts_bundle_formats(scratch: Path, cases: int, rng: random.Random) -> dict:
    """The DALI parts bundle's manifest.json (scripts/gpu_parts.py): three small wheels packed once in parts of
    32 KiB; each case mutates a copy of the manifest (its JSON tree, or its bytes), then receives and joins the parts
    into a stage of its own, as the device's last command does before pip (a process: not started here). Its
    one-line `PartsError` (exit 2) counts as the refusal."""
    from scripts import gpu_parts
    from vitlarge.errors import UserError

    wheels, template = scratch / "parts-wheels", scratch / "parts-template"
    made = random.Random(7)  # the wheels' bytes: the same bundle at any seed
    for path, size in (
        ("dali/nvidia_dali_cuda130-2.4.0-py3-none-manylinux_2_28_x86_64.whl", 70_000),
        ("dali/gast-0.7.0-py3-none-any.whl", 9_000),
        ("colossalai/colossalai-0.5.0-py3-none-any.whl", 20_000),
    ):
        (wheels / path).parent.mkdir(parents=True, exist_ok=True)
        (wheels / path).write_bytes(made.randbytes(size))
    gpu_parts.pack(wheels, template, part_bytes=32 * 1024, checkout=0)
    raw = (template / gpu_parts.MANIFEST).read_bytes()

    def manifest(case):
        d = scratch / f"case{case}"
        shutil.copytree(template, d / "parts")
        mutated = dump(mutate_doc(json.loads(raw), rng)) if rng.random() < 0.8 else mutate_bytes(raw, rng)
        (d / "parts" / gpu_parts.MANIFEST).write_bytes(mutated)
        try:
            m, have = gpu_parts.receive(d / "parts", d / "stage")
            gpu_parts.assemble(m, d / "stage", have)
        except gpu_parts.PartsError as e:
            raise UserError(str(e)) from None

    return {"parts manifest": (manifest, cases)}


def parquet_formats(scratch: Path, demo_data: str, cases: int, rng: random.Random) -> dict:
    """A Hugging Face parquet set (`data_tools.parquet_source`) written once by ``datasets`` from a few of the demo's
    images (two classes, two files a split, row groups of 3 rows); each case mutates one file of a copy, its bytes
    or its ``huggingface`` metadata (the class names, the features), then converts it in process as
    ``imagenet_to_tfrecord --src`` does."""
    import pyarrow.parquet as pq

    from data_tools.imagenet_to_tfrecord import convert_parquet
    from data_tools.make_parquet_dataset import write_parquet

    tree = scratch / "parquet-tree"
    for split, per_class in (("train", 4), ("val", 2)):
        for digit in ("0", "1"):
            (tree / split / digit).mkdir(parents=True)
            for f in sorted((Path(demo_data) / "src" / split / digit).iterdir())[:per_class]:
                shutil.copyfile(f, tree / split / digit / f.name)
    template = scratch / "parquet-template"
    write_parquet(str(tree), str(template), files_per_split=2, rows_per_group=3)

    def parquet(case):
        d = scratch / f"case{case}"
        shutil.copytree(template, d / "src")
        target = rng.choice(sorted((d / "src" / "data").iterdir()))
        if rng.random() < 0.6:
            target.write_bytes(mutate_bytes(target.read_bytes(), rng))
        else:
            table = pq.read_table(target)
            meta = dict(table.schema.metadata)
            meta[b"huggingface"] = dump(mutate_doc(json.loads(meta[b"huggingface"]), rng))
            pq.write_table(table.replace_schema_metadata(meta), target, row_group_size=3)
        convert_parquet(str(d / "src"), str(d / "out"), workers=0, progress=False)

    # Each case a conversion (~0.1 s): a quarter of the cases.
    return {"parquet": (parquet, max(cases // 4, 10))}


# The formats and their entry points ----------------------------------------------------------------


def main(scratch: str, demo_data: str, seed: int, cases: int, only: list[str] | None = None) -> dict:
    global SCRATCH, _watch
    SCRATCH = Path(scratch).resolve()
    sys.addaudithook(_audit)
    torch.set_num_threads(1)
    from tests.helpers import ROOT
    from tests.helpers.loaders import open_train, open_val
    from tests.helpers.tiny_model import make, trained
    from tests.helpers.wds_sets import write_timm_wds
    from vitlarge.checkpoint import init_from, resume, store
    from vitlarge.checkpoint import weights as ckpt_weights
    from vitlarge.checkpoint.state import RunState
    from vitlarge.checkpoint.trust import index as dcp_index
    from vitlarge.config.load import load_recipe
    from vitlarge.data import load_manifest
    from vitlarge.data.manifest import shard_files
    from vitlarge.errors import UserError

    cfg = load_recipe(ROOT / "recipes" / "demo_digits.py")
    model, opt, scaler = trained(cfg)
    original = store.save(SCRATCH / "orig", RunState(model, opt, scaler, step=1, data="loader-state"), cfg, keep=3)
    data = SCRATCH / "data"
    shutil.copytree(demo_data, data, ignore=shutil.ignore_patterns("src"))
    # Parsed once (the pure-Python unpickler takes ~0.3 s on 2 cores); each case mutates a copy.
    original_index = dcp_index.unpickle_index((original / ".metadata").read_bytes())
    cpu = torch.device("cpu")
    loader_kw = {"rank": 0, "world_size": 1, "device": cpu, "seed": 0}
    state = open_train(str(data), 16, 32, **loader_kw).state()
    rng = random.Random()  # seeded per format below: a format's first N cases are the same at any CASES
    if not only or {"mlflow.db", "tracker names"} & set(only):
        mlflow_template()  # MLflow's migrations, once (seconds), before any case's alarm

    def fresh_checkpoint(case: int) -> Path:
        dest = SCRATCH / f"case{case}" / "checkpoints" / original.name
        dest.mkdir(parents=True)
        for f in original.iterdir():
            shutil.copyfile(f, dest / f.name)
        return dest

    def read_checkpoint(path: Path, weight_reads: bool = True, first=None) -> None:
        """Evaluate's and init_from's reads, then an automatic resume and its restore, of the same folder;
        raises the first `UserError` any of them raised (each one is still run). The resume goes last: it
        moves a checkpoint that fails its check aside, after which the reads would only see a missing folder.
        ``weight_reads=False``: the resume only, for a file the weight reads never open (a rank file); ``first``: a
        reader of the folder run before them all (evaluate's reading of meta.json)."""

        def resume_and_restore():
            m, o, s = make(cfg)
            passed_over = []
            handler = logging.Handler()
            handler.emit = lambda record: passed_over.extend(
                [record.getMessage()] if "passed over" in record.msg else []
            )
            logging.getLogger("vitlarge").addHandler(handler)
            try:
                chosen = resume.choose(path.parent.parent, None, m, cfg, optimizer=o).path
            finally:
                logging.getLogger("vitlarge").removeHandler(handler)
            if chosen is not None:
                resume.restore(chosen, RunState(m, o, s), cfg)
            elif passed_over:  # the folder's one checkpoint failed its files' or its restore's check: that line
                raise UserError(passed_over[0])

        refused = None
        weights = (
            lambda: ckpt_weights.load_model_weights(path, make(cfg)[0], cfg),
            lambda: init_from.read_state_dict(path),
        )
        for entry in (*((first,) if first else ()), *(weights if weight_reads else ()), resume_and_restore):
            try:
                entry()
            except UserError as e:
                refused = refused or e
        if refused:
            raise refused

    def meta_json(case):
        path = fresh_checkpoint(case)
        raw = (path / "meta.json").read_bytes()
        mutated = dump(mutate_doc(json.loads(raw), rng)) if rng.random() < 0.7 else mutate_bytes(raw, rng)
        (path / "meta.json").write_bytes(mutated)
        read_checkpoint(path)

    def index(case):
        path = fresh_checkpoint(case)
        raw = (path / ".metadata").read_bytes()
        if rng.random() < 0.5:
            md = copy.deepcopy(original_index)
            targets = [md] + list(md.storage_data.values())[:20] + list(md.state_dict_metadata.values())[:20]
            target = rng.choice(targets)
            field = rng.choice([k for k in vars(target)] or ["x"])
            setattr(target, field, rng.choice(JUNK + [torch.Size([1 << 30, 1 << 30]), "__0_0.distcp", 1 << 40]))
            raw = pickle.dumps(md, protocol=4)
        else:
            raw = mutate_bytes(raw, rng)
        (path / ".metadata").write_bytes(raw)
        if rng.random() < 0.8:
            reseal(path)  # a forger recomputes the checksums
        read_checkpoint(path)

    def rank_file(case):
        path = fresh_checkpoint(case)
        f = path / "rank_00000.pt"
        if rng.random() < 0.6:
            content = mutate_doc(torch.load(f, weights_only=True), rng)
            try:
                torch.save(content, f)
            except RecursionError:  # torch.save cannot write 5,000 levels: a file that nests as deep as it can
                f.write_bytes(b"\x80\x02" + b"]" * 100_000)
        else:
            f.write_bytes(mutate_bytes(f.read_bytes(), rng))
        reseal(path)
        # Evaluate's and init_from's reads never unpickle a rank file (its CRC32C, resealed, passes): all 200 passed these
        # cases when they were run too (seed 20261125), at two thirds of this format's time.
        read_checkpoint(path, weight_reads=False)

    def loader_state(case):
        doc = json.loads(state)
        if rng.random() < 0.5:
            blob = mutate_bytes(base64.b64decode(doc["dali"]), rng)
            doc["dali"] = base64.b64encode(blob).decode()
            text = json.dumps(doc)
        else:
            text = dump(mutate_doc(doc, rng)).decode("utf-8", "replace")
        loader = open_train(str(data), 16, 32, state=text, **loader_kw)
        next(loader)

    def dataset_json(case):
        d = SCRATCH / f"case{case}" / "data"
        d.mkdir(parents=True)
        for f in data.iterdir():
            if f.is_file() and f.name != "dataset.json":
                shutil.copyfile(f, d / f.name)
        raw = (data / "dataset.json").read_bytes()
        mutated = dump(mutate_doc(json.loads(raw), rng)) if rng.random() < 0.7 else mutate_bytes(raw, rng)
        (d / "dataset.json").write_bytes(mutated)
        manifest = load_manifest(str(d))
        shard_files(manifest, "train")
        shard_files(manifest, "validation")

    def tfrecord(case):
        from data_tools.make_index import make_index

        d = SCRATCH / f"case{case}" / "data"
        shutil.copytree(data, d)
        shard = sorted(d.glob("train-*-of-*"))[0]
        raw = shard.read_bytes()
        b = bytearray(raw)
        if rng.random() < 0.6:  # a record header: its 8-byte length and 4-byte CRC
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(12)] = rng.randrange(256)
            raw = bytes(b)
        else:
            raw = mutate_bytes(raw, rng)
        shard.write_bytes(raw)
        make_index(str(d))
        manifest = load_manifest(str(d))
        shard_files(manifest, "train")

    from tests.helpers.data_fixtures import small_tfds

    tfds_src = small_tfds(SCRATCH / "tfds" / "tinynet" / "1.0.0")

    tars = SCRATCH / "tars"  # a WebDataset set in timm's layout: 9 train, 4 validation samples, 2 + 1 tars
    write_timm_wds(str(tars), {"train": 9, "validation": 4})

    def webdataset(case):
        """A tar of the set mutated (its headers, most often), then make_index and the validation pass on it."""
        from data_tools.make_index import make_index

        d = SCRATCH / f"case{case}" / "tars"
        shutil.copytree(tars, d)
        tar = d / rng.choice(["tiny-train-0000.tar", "tiny-validation-0000.tar"])
        raw = bytearray(tar.read_bytes())
        if rng.random() < 0.6:  # a member's 512-byte header: its name, mode, size, type or checksum fields
            for _ in range(rng.randint(1, 4)):
                raw[512 * rng.randrange(len(raw) // 512 // 4) + rng.randrange(512)] = rng.randrange(256)
            tar.write_bytes(bytes(raw))
        else:
            tar.write_bytes(mutate_bytes(bytes(raw), rng))
        make_index(str(d), workers=1)
        for _ in open_val(str(d), 2, 16, device=cpu):
            pass

    def tfds_folder(case):
        """A TFDS version folder (dataset_info.json, features.json, label.labels.txt, shards) with one of them
        mutated, indexed read-in-place into an index folder and read back as the loaders check it."""
        from data_tools import tfds_layout
        from data_tools.make_index import make_index

        d = SCRATCH / f"case{case}" / "tinynet" / "1.0.0"
        shutil.copytree(tfds_src, d)
        name = rng.choice([tfds_layout.INFO_NAME, tfds_layout.INFO_NAME, tfds_layout.FEATURES_NAME, "label.labels.txt"])
        name = name if rng.random() < 0.8 else rng.choice(sorted(p.name for p in d.glob("*.tfrecord-*")))
        raw = (d / name).read_bytes()
        if name.endswith(".json") and rng.random() < 0.7:
            (d / name).write_bytes(dump(mutate_doc(json.loads(raw), rng)))
        else:
            (d / name).write_bytes(mutate_bytes(raw, rng))
        index = SCRATCH / f"case{case}" / "index"
        make_index(str(d), out=str(index))
        manifest = load_manifest(str(index))
        shard_files(manifest, "train")
        shard_files(manifest, "validation")

    from vitlarge.checkpoint.export import export
    from vitlarge.checkpoint.trust import layout
    from vitlarge.config.checks import check_read_back
    from vitlarge.config.phase_list import final_eval_size, patch_size
    from vitlarge.config.schema import IMAGE_SIZE, MAX_EVAL_TOKENS
    from vitlarge.evaluate import as_exported, as_trained
    from vitlarge.model.vit import build_model
    from vitlarge.plan.plan import evaluation_plan

    exported = export(SCRATCH / "export", model, cfg)

    def believed(c, size: int | None = None) -> None:
        """After a pass: what the file made of the config breaks none of the schema's rules (checked before anything
        is built at it), else a failure: a size or a std a file stated was believed."""
        try:
            check_read_back(c, "the config as read")
        except UserError as e:
            raise AssertionError(f"believed a value outside the schema's rules ({e})") from None
        if size is not None and (not IMAGE_SIZE.test(size) or (size // patch_size(c)) ** 2 > MAX_EVAL_TOKENS):
            raise AssertionError(f"believed an evaluation size of {size}")

    def export_config(case):
        """An export's config.json, read as vitlarge-evaluate reads it: the sizes and preprocessing it states
        (`as_exported`), then the model built at them and the weights loaded (the evaluation itself at that size
        is e2e/test_evaluate.py's)."""
        d = SCRATCH / f"case{case}" / "model"
        shutil.copytree(exported, d)
        raw = (d / "config.json").read_bytes()
        doc = json.loads(raw)
        how = rng.random()
        if how < 0.5:  # a value of the kind each key holds, in or out of the schema's bounds
            key, side = rng.choice(EXPORT_KEYS), rng.choice(SIDES)
            value = {
                "img_size": side,
                "input_size": [3, side, side],
                "mean": [rng.choice([0, 0.5, 2, -1, 1e308])] * 3,
                "std": [rng.choice([0, 1e-30, 0.2, 100, -0.2])] * 3,
                "crop_pct": rng.choice([0, 0.9, 7, -1]),
            }[key]
            doc["model_args" if key == "img_size" else "pretrained_cfg"][key] = value
            raw = dump(doc)
        else:
            raw = dump(mutate_doc(doc, rng)) if how < 0.85 else mutate_bytes(raw, rng)
        (d / "config.json").write_bytes(raw)
        c = copy.deepcopy(cfg)
        believed(c, as_exported(c, d)[1])
        ckpt_weights.load_model_weights(d, build_model(c), c)
        final_eval_size(c)

    def meta_phases_and_schedule(case):
        """meta.json's phase list (up to past `MAX_PHASES` entries, sizes past `MAX_IMAGE_SIZE`) or its schedule
        record, read by evaluate (the config as trained and the phase it evaluates at) and by `read_checkpoint`."""
        path = fresh_checkpoint(case)
        meta = json.loads((path / "meta.json").read_bytes())
        if rng.random() < 0.5:
            phases = []
            for i in range(rng.choice([1, 2, 3, 1024, 1025, 5000])):
                entry = {"epoch": rng.choice([i / 1000, i / 1000, i, -1, 1e308, "x"])}
                for k in rng.sample(PHASE_VALUE_KEYS, rng.randint(0, 3)):
                    entry[k] = rng.choice(SIDES + JUNK[:8])
                phases.append(entry)
            meta["config"]["train"]["phases"] = phases
        else:
            lr = rng.choice([0, 0.0, 1e-3, -1, 1e308, float("inf"), "x", None])
            continues = rng.choice([None, {"step": rng.choice([0, 1, 2, -1]), "base_lr": lr}, [], "x"])
            meta["schedule"] = {"num_train_examples": rng.choice([1437, 0, 10**14, None, "x"]), "continues": continues}
        (path / "meta.json").write_bytes(dump(meta))

        def evaluate_reads():
            c = copy.deepcopy(cfg)
            as_trained(c, layout.read_meta(path).get("config", {}))
            believed(c)
            evaluation_plan(c, 1, 1437)
            final_eval_size(c)

        read_checkpoint(path, first=evaluate_reads)

    formats = {
        "meta.json": (meta_json, cases),
        # Each case a read of the folder's files and a model of its own (~0.1 s): half the cases.
        "export config.json": (export_config, max(cases // 2, 10)),
        # Each case the reads of a whole checkpoint (~0.5 s): a quarter, beside meta.json's own 200.
        "meta.json phases and schedule": (meta_phases_and_schedule, max(cases // 4, 10)),
        ".metadata": (index, cases),
        "rank file": (rank_file, cases),
        "loader state": (loader_state, cases),
        "dataset.json": (dataset_json, cases),
        "TFRecord headers": (tfrecord, max(cases // 4, 10)),
        # Each case indexes a copy of 3 small tars and reads its validation split (~0.25 s): an eighth.
        "WebDataset tars": (webdataset, max(cases // 8, 10)),
        # Each case indexes a 9-record TFDS folder (~30 ms): a quarter.
        "TFDS folder": (tfds_folder, max(cases // 4, 10)),
        # Each case drives the MLflow hook over a copy of one tracked workdir (~1 s): a twentieth of the cases.
        "mlflow.db": (lambda case: mlflow_store(case, rng), max(cases // 20, 8)),
        "tracker names": (lambda case: tracker_names(case, rng), max(cases // 20, 8)),
        **overrides_and_data_formats(SCRATCH, data, state, rng, cases),
        **parts_bundle_formats(SCRATCH, cases, rng),
        **parquet_formats(SCRATCH, demo_data, cases, rng),
    }
    report = {}
    setup_peak = peak_rss_mib()  # before any reset: the setup's (a real checkpoint, the data, MLflow's store)
    signal.signal(signal.SIGALRM, _alarm)
    case = 0
    for name, (fn, n) in formats.items():
        if only and name not in only:
            continue
        rng.seed(f"{seed}/{name}")
        started = time.perf_counter()
        counts = {"passed": 0, "refused": 0}
        failures = []
        peak = 0
        for _ in range(n):
            case += 1
            reset_peak_rss()
            _watch = True
            signal.alarm(60)
            try:
                fn(case)
                counts["passed"] += 1
            except UserError as e:
                if "\n" in str(e):
                    failures.append(f"case {case}: a UserError of several lines: {str(e)[:300]}")
                counts["refused"] += 1
            except Exception as e:  # noqa: BLE001 - every other exception is a traceback the user would see
                tb = traceback.format_exception(e)
                failures.append(f"case {case}: {type(e).__name__}: {str(e)[:200]} at {tb[-2].strip()[:300]}")
            finally:
                signal.alarm(0)
                _watch = False
            peak = max(peak, peak_rss_mib())
            shutil.rmtree(SCRATCH / f"case{case}", ignore_errors=True)
        seconds = round(time.perf_counter() - started, 1)
        report[name] = {**counts, "failures": failures, "seconds": seconds, "peak_rss_mib": peak}
    report["violations"] = violations
    # The whole run's: its setup's and each case's (reset_peak_rss starts the kernel's count afresh per case).
    report["peak_rss_mib"] = max([setup_peak] + [r["peak_rss_mib"] for r in report.values() if isinstance(r, dict)])
    return report


if __name__ == "__main__":
    scratch, demo_data, seed, cases = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    result = main(scratch, demo_data, seed, cases, sys.argv[5:])
    sys.stdout.flush()
    print("FUZZ " + json.dumps(result))
