"""Checkpoints that resume exactly: save, find, verify and load; crash-consistent.

Layout of ``<workdir>/checkpoints/step_0000100/`` (format 3):

* ``__0_0.distcp`` ...    weights and optimizer state through ``torch.distributed.checkpoint`` (DCP): each
                          rank writes its own shards (ddp: each replicated tensor once, spread over the
                          ranks); a resume at any world size, ddp or fsdp, reads only what its shards need
                          (vitlarge/checkpoint/sharded.py). A checkpoint of an optimizer that never stepped
                          holds the weights only (meta.json ``optimizer_state: false``). With a model EMA
                          (``train.ema_decay``) its average too, in the same write (meta.json ``ema: true``).
* ``.metadata``           DCP's index of those files (rank 0)
* ``rank_00000.pt`` ...   per rank: RNG states (torch, CUDA, numpy, python), loss scaler, data-loader state
* ``meta.json``           format version, step, world size, model name and parameter shapes, config,
                          and ``files``: each file's size and CRC32C (``{"bytes": n, "crc32c": "..."}``)

There is no full ``model.safetensors`` in a checkpoint: the export (vitlarge/checkpoint/export.py) gathers the
model once at the end of a run, and ``load_model_weights`` / ``model.init_from`` / ``vitlarge.evaluate``
read the weights of a checkpoint folder on one process (``sharded.read_full_model``).
Format 2 (``model.safetensors`` + ``optimizer.pt`` or ``optimizer_rank_NNNNN.pt``) still resumes.

Publishing (``save``, a collective): every rank writes its files into ``.step_0000100.tmp/``, fsyncs
them (DCP's ``sync_files``) and checksums what it wrote; once every rank reports success, rank 0 writes
``meta.json`` (atomically), fsyncs the folder, renames it to its final name and fsyncs ``checkpoints/``.
So a folder named ``step_*`` was complete on disk before it got that name, whatever crashes when; a run
killed mid-write leaves only a ``.tmp`` folder, never chosen and removed by the next save. Then rank
0 prunes to the newest ``keep``, counting the new checkpoint and only older ones: a checkpoint newer
than the one just written is never pruned (there is none after a resume, see ``vitlarge/checkpoint/resume.py``).

Reading: ``verify`` re-reads every byte against ``meta.json`` (rank 0 does it once per resume);
``read`` checks the sizes of the files listed (a stat each) and reads this rank's own file; ``apply``
loads the weights and optimizer state (a collective). Nothing is unpickled beyond tensors and numbers
(``weights_only=True``; DCP's index through a restricted unpickler).
Folders named ``abandoned_*`` hold checkpoints moved aside by a resume (vitlarge/checkpoint/resume.py); nothing here
reads or prunes them.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch.distributed.checkpoint.api import CheckpointException

from vitlarge import fileio
from vitlarge.checkpoint import meta as meta_json
from vitlarge.checkpoint import sharded
from vitlarge.checkpoint.meta import FORMAT_VERSION, READABLE_FORMATS, STEP_DIR, expected_files  # noqa: F401
from vitlarge.config.schema import Config
from vitlarge.distributed.collective import gather, rank_and_world
from vitlarge.errors import UserError

CHECKPOINTS_DIR = "checkpoints"
"""The folder under the workdir that holds one ``step_NNNNNNN`` folder per checkpoint."""


def step_name(step: int) -> str:
    """The one spelling of a checkpoint folder's name (``STEP_DIR`` reads it back)."""
    return f"step_{step:07d}"


def rng_state() -> dict:
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "python": random.getstate()[1],
        "python_gauss": random.getstate()[2],  # random.gauss() caches its second value
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(
        ("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    random.setstate((3, tuple(state["python"]), state.get("python_gauss")))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def param_shapes(model: torch.nn.Module) -> dict[str, list[int]]:
    """The unsharded state dict's shapes (never a collective: FSDP's are recorded when it wraps)."""
    return sharded.full_shapes(model) or {k: list(v.shape) for k, v in model.state_dict().items()}


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module under a Booster wrapper or DDP (an FSDP1 root stays: see `sharded_checkpoint`)."""
    return sharded._root(model)


def save(
    workdir: str | Path,
    step: int,
    model,
    optimizer,
    scaler,
    data_state: str | None,
    cfg: Config,
    keep: int,
    extra_meta: dict | None = None,
    ema=None,
) -> Path:
    """Collective: every rank calls it at the same optimizer-step boundary. Returns the final path.
    ``ema``: the run's `vitlarge.model.ema.ModelEma`, saved with the weights (a checkpoint is complete with it).

    Raises the same one-line ``UserError`` on every rank if any rank fails; earlier checkpoints stay."""
    rank, world = rank_and_world()
    root = Path(workdir) / CHECKPOINTS_DIR
    final, tmp = root / step_name(step), root / f".{step_name(step)}.tmp"
    raw = unwrap(model)
    # Every rank must make the same choice: the two state dicts are built by different collectives.
    with_optimizer = all(gather(sharded.has_optimizer_state(optimizer)))

    def prepare():
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".step_*.tmp"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()

    def write() -> dict:
        names = [f"rank_{rank:05d}.pt"]
        # Before DCP's save: its planning and index are collectives, a failure there reaches every rank.
        _torch_save({"rng": rng_state(), "scaler": scaler.state_dict(), "data": data_state}, tmp / names[0])
        sharded.save(tmp, model, optimizer, with_optimizer, ema and ema.state_dict())  # a collective; fsyncs
        names += sharded.dcp_files_of(rank, tmp)
        return {name: fileio.sync_and_record(tmp / name) for name in names}

    def publish(files: dict):
        meta = {
            "format_version": FORMAT_VERSION,
            "step": step,
            "world_size": world,
            "model": cfg.model.name,
            "param_shapes": param_shapes(raw),
            "config": cfg.to_dict(),
            "optimizer_state": with_optimizer,
            "ema": ema is not None,
            **(extra_meta or {}),
            "files": dict(sorted(files.items())),
        }
        fileio.write_atomic(tmp / "meta.json", json.dumps(meta, indent=1))  # also fsyncs tmp's names
        os.replace(tmp, final)
        fileio.fsync_dir(root)
        fileio.fsync_dir(root.parent)  # checkpoints/ itself may be new
        older = [p for p in list_checkpoints(workdir) if step_of(p) < step]
        for old in older[: max(0, len(older) - (keep - 1))]:
            shutil.rmtree(old, ignore_errors=True)

    def phase(fn, here: bool) -> list:
        result, error = None, None
        if here:
            try:
                result = fn()
            # A full disk surfaces as RuntimeError (torch.save) or DCP's CheckpointException (a
            # BaseException, raised on every rank when one fails), not only OSError; every failure
            # must reach the gather, or the other ranks would wait there forever.
            except (OSError, RuntimeError, CheckpointException) as e:
                error = reason_of(e, written_in=root)
        outcomes = gather((result, error))
        failed = [(r, why) for r, (_, why) in enumerate(outcomes) if why]
        if failed:
            if rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            r, why = failed[0]
            raise UserError(
                f"writing checkpoint {final} failed ({why}{f' on rank {r}' if world > 1 else ''}); free space in "
                f"{root} (or make it writable) or point --workdir elsewhere; earlier checkpoints are intact",
                same_on_all_ranks=True,
            )
        return [result for result, _ in outcomes]

    phase(prepare, rank == 0)
    records = phase(write, True)
    phase(lambda: publish({k: v for part in records for k, v in part.items()}), rank == 0)
    return final


def _torch_save(obj, path: Path) -> None:
    # Through a Python file, so a full disk's OSError is kept as the context of torch's RuntimeError
    # (whose own message, "unexpected pos ...", does not say why).
    with open(path, "wb") as f:
        torch.save(obj, f)


FULL_BELOW_BYTES = 1 << 20
"""A failed write with less free space than this in its folder is reported as a full disk."""


def reason_of(error: BaseException, written_in: Path | None = None) -> str:
    """The OSError behind ``error`` if there is one ("No space left on device"), else its first line.

    ``written_in``: the folder a failed write went to. DCP gathers each rank's failure across the
    ranks by pickling it, which drops the OSError a full disk raised (only torch's "unexpected pos"
    is left), so a folder with under `FULL_BELOW_BYTES` free is reported as full, as it is."""
    if isinstance(error, CheckpointException) and error.failures:  # DCP: the first failing rank's own error
        error = next(iter(error.failures.values()))[0]
    cause = error
    while cause is not None:
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror
        cause = cause.__cause__ or cause.__context__
    if written_in is not None:
        try:
            if shutil.disk_usage(written_in).free < FULL_BELOW_BYTES:
                return os.strerror(errno.ENOSPC)
        except OSError:
            pass
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def step_of(path: Path) -> int:
    return int(STEP_DIR.match(path.name).group(1))


def _step_dirs(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if STEP_DIR.match(p.name) and p.is_dir()), key=step_of)


def list_checkpoints(workdir: str | Path) -> list[Path]:
    """Published checkpoint folders (``step_*``) of the workdir, oldest first, checked or not (see ``verify``)."""
    return _step_dirs(Path(workdir) / CHECKPOINTS_DIR)


def exists(workdir: str | Path, step: int) -> bool:
    """Whether the workdir holds a published checkpoint of ``step`` (a name and its meta.json; no checksums)."""
    return (Path(workdir) / CHECKPOINTS_DIR / step_name(step) / "meta.json").is_file()


def _read_meta(path: Path) -> tuple[dict | None, str | None]:
    """``(meta, None)``, or ``(None, why it is not a checkpoint's meta.json)`` (`vitlarge.checkpoint.meta.read`)."""
    return meta_json.read(path)


def verify(path: str | Path) -> str | None:
    """Why ``path`` is not a usable checkpoint, or None when meta.json parses and every file it lists
    has its recorded size and CRC32C. Reads every byte (at 15 GB/s for the checksum itself)."""
    path = Path(path)
    meta, problem = _read_meta(path)
    if problem:
        return problem
    for name, record in expected_files(meta).items():
        problem = fileio.record_problem(path / name, record)
        if problem:
            return problem
    if meta["format_version"] >= 3:  # the index is a pickle: read as data, and every range it names checked
        try:
            return sharded.slices_problem(path, sharded.read_index(path, meta["files"]))
        except sharded.IndexProblem as e:
            return str(e)
    return None


def newest_verified(workdir: str | Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest checkpoint of the workdir that passes ``verify``, and the newer ones that failed (with why)."""
    failed = []
    for path in reversed(list_checkpoints(workdir)):
        problem = verify(path)
        if problem is None:
            return path, failed
        failed.append((path, problem))
    return None, failed


def latest(workdir: str | Path) -> Path | None:
    """What an automatic resume of ``workdir`` continues from: its newest verified checkpoint, or None."""
    return newest_verified(workdir)[0]


class Unusable(UserError):
    """A checkpoint that fails its check; ``problem`` says why in a few words ("no meta.json")."""

    def __init__(self, path: str | Path, problem: str):
        path = Path(path)
        if problem == "does not exist":
            message = f"checkpoint {path} does not exist; check --resume, or omit it to resume from the workdir"
        elif problem == "no meta.json":
            found = _step_dirs(path / CHECKPOINTS_DIR) or _step_dirs(path)
            example = f", e.g. {found[-1]}" if found else ""
            message = (
                f"{path} is not a complete vitlarge checkpoint (no meta.json); "
                f"pass a checkpoints/step_* folder{example}"
            )
        else:
            message = (
                f"checkpoint {path} fails its check ({problem}); --resume an older checkpoints/step_* "
                "folder, or omit --resume to take the newest one that passes"
            )
        super().__init__(message)
        self.problem = problem


def read_meta(path: str | Path) -> dict:
    """meta.json of a checkpoint folder; a one-line ``UserError`` if there is none or it is unreadable."""
    meta, problem = _read_meta(Path(path))
    if problem:
        raise Unusable(path, problem)
    return meta


def check_writable(workdir: str | Path, rank: int) -> None:
    """Every rank, before any work: the workdir (created if missing) and its checkpoints folder (if
    there is one) accept a new file, so a read-only mount fails now in one line, not at the first save."""
    workdir = Path(workdir)
    for folder, what in ((workdir, "workdir"), (workdir / CHECKPOINTS_DIR, "checkpoint folder")):
        if what != "workdir" and folder.is_symlink():  # a handed-over workdir's link would take the writes elsewhere
            raise UserError(
                f"{folder} is a symbolic link (to {os.readlink(folder)}); vitlarge writes checkpoints only inside the "
                "workdir: remove the link, or pass --workdir on the file system it pointed to"
            )
        if what != "workdir" and not folder.is_dir():
            continue
        probe = folder / f".write_test_{rank}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fileio.probe_writable(folder, probe.name)  # a planted link is removed, never followed
        except OSError as e:
            fix = (
                "pass a writable --workdir"
                if what == "workdir"
                else "make it writable or pass another "
                "--workdir (--resume may still read a checkpoint from a read-only place)"
            )
            raise UserError(f"{what} {folder} is not writable ({e.strerror}); {fix}") from None


SHARED_PROBE = ".vitlarge_shared_probe"


def write_shared_probe(workdir: str | Path) -> str:
    """Rank 0, after `check_writable`: a file with a token no other run writes; returns the token. With
    `check_shared_probe` on every rank it shows the ranks share the workdir (a mount missing on one node
    leaves that node a local folder of the same name, and its checkpoint parts never reach the others)."""
    import uuid

    token = uuid.uuid4().hex
    fileio.write_atomic(Path(workdir) / SHARED_PROBE, token)
    return token


def check_shared_probe(workdir: str | Path, token: str, wait_s: float = 5.0) -> None:
    """Every rank: rank 0's probe holds ``token`` in this rank's view of ``workdir`` (polled for ``wait_s``:
    a shared file system may show another node's new file a moment late); else a one-line ``UserError``."""
    import time

    path, deadline = Path(workdir) / SHARED_PROBE, time.monotonic() + wait_s
    while True:
        try:
            if fileio.read_capped(path, 64, follow=False) == token.encode():  # a planted link or FIFO: never read
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise UserError(
                f"--workdir {workdir} here is not the folder rank 0 writes to ({SHARED_PROBE} it wrote is not there "
                "or holds another run's token): every node must see the workdir on one shared file system "
                "(is it mounted on this node?)"
            )
        time.sleep(0.2)


def check_compatible(meta: dict, path: Path, model: torch.nn.Module, cfg: Config) -> None:
    """A one-line ``UserError`` unless the checkpoint holds this recipe's model in a layout this run reads
    (any plugin and world size: the optimizer state is re-sharded where needed, see vitlarge/checkpoint/sharded.py)."""
    shapes, saved = param_shapes(unwrap(model)), meta["param_shapes"]
    if meta["model"] == cfg.model.name and saved == shapes:
        return
    diff = [k for k in shapes if saved.get(k) != shapes[k]]
    trained_at = meta.get("config", {}).get("data", {}).get("image_size")
    if meta["model"] == cfg.model.name and diff == ["pos_embed"] and saved.keys() == shapes.keys():
        # The same model at another input size (a rerun without the run's data.image_size): only the
        # position embedding's grid differs.
        trained_at = trained_at or _size_of_grid(saved["pos_embed"], model)
        if trained_at and trained_at != cfg.data.image_size:
            raise UserError(
                f"checkpoint {path} was trained at data.image_size={trained_at}, this run has data.image_size="
                f"{cfg.data.image_size} (pos_embed {saved['pos_embed']} there, {shapes['pos_embed']} here); "
                f"pass data.image_size={trained_at}"
            )
    if diff:
        detail = f"first difference at '{diff[0]}': {saved.get(diff[0])} there, {shapes[diff[0]]} here"
    else:
        detail = "different parameter set"
    raise UserError(
        f"checkpoint {path} holds model {meta['model']} that does not match the recipe's {cfg.model.name} "
        f"({detail}); use another --workdir or --resume a checkpoint of this recipe"
    )


def _size_of_grid(pos_embed: list[int], model: torch.nn.Module) -> int | None:
    """The square input size whose patch grid ``pos_embed`` (a shape) holds, for ``model``'s patch size and
    prefix tokens; None where that is not a square grid of square patches."""
    import math

    m = unwrap(model)
    patch = tuple(getattr(getattr(m, "patch_embed", None), "patch_size", ()) or ())
    if len(pos_embed) != 3 or len(patch) != 2 or patch[0] != patch[1]:
        return None
    tokens = pos_embed[1] - (0 if getattr(m, "no_embed_class", False) else getattr(m, "num_prefix_tokens", 1))
    side = math.isqrt(max(tokens, 0))
    return side * patch[0] if tokens > 0 and side * side == tokens else None


EXPORT_CONFIG_LIMIT = (
    16 * 2**20
)  # an export's config.json (1000 class names and texts: ~100 KB); a larger one is not read


def _export_input_size(folder: Path) -> tuple[int, ...] | None:
    """``pretrained_cfg.input_size`` that an export's config.json records (timm's), or None: the file is data,
    read up to `EXPORT_CONFIG_LIMIT` and only for this message."""
    try:
        with open(folder / "config.json", "rb") as f:
            raw = f.read(EXPORT_CONFIG_LIMIT + 1)
        size = json.loads(raw)["pretrained_cfg"]["input_size"] if len(raw) <= EXPORT_CONFIG_LIMIT else None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return tuple(size) if isinstance(size, list) and all(isinstance(x, int) for x in size) else None


def _does_not_fit(given: Path, tensors: dict, model: torch.nn.Module, cfg: Config, e: RuntimeError) -> str:
    """Why a model.safetensors does not load into ``model``: for an export of another image size, the size it
    was trained at and the override; else torch's first mismatch (its first line is only a header)."""
    mine = unwrap(model).state_dict().get("pos_embed")
    theirs = tensors.get("pos_embed")
    if mine is not None and theirs is not None and list(mine.shape) != list(theirs.shape):
        trained_at = _size_of_grid(list(theirs.shape), model)
        recorded = _export_input_size(given) if given.is_dir() else None
        if trained_at and trained_at != cfg.data.image_size:
            said = f" (its config.json: input_size {'x'.join(map(str, recorded))})" if recorded else ""
            return (
                f"export {given} was trained at data.image_size={trained_at}{said}, this run has data.image_size="
                f"{cfg.data.image_size} (pos_embed {list(theirs.shape)} there, {list(mine.shape)} here); "
                f"pass data.image_size={trained_at}"
            )
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    first = next((line for line in lines[1:] if not line.startswith("Error(s)")), lines[0] if lines else "")
    return f"{given} does not fit model {cfg.model.name}: {first}"


def load(path: str | Path, model, optimizer, scaler, cfg: Config, ema=None) -> dict:
    """Restores weights, optimizer, scaler, RNG (and the EMA); returns meta plus ``data`` (this rank's loader state
    or None). ``read`` then ``apply``: a collective under fsdp (vitlarge/checkpoint/resume.py agrees on ``read``'s
    failures first)."""
    return apply(read(path, model, cfg), model, optimizer, scaler, ema)


def read(path: str | Path, model, cfg: Config) -> dict:
    """Rank-local, no collective: checks the checkpoint (model, sizes of the files this run reads;
    ``verify`` is rank 0's job, see vitlarge/checkpoint/resume.py) and reads this rank's own file into host memory
    (format 2: also the full weights and the optimizer files). A ``UserError`` here can be one rank's
    alone: agree on it before ``apply``."""
    path = Path(path)
    meta = read_meta(path)
    check_compatible(meta, path, model, cfg)
    if meta.get("config", {}).get("train", {}).get("plugin") == "zero":  # the removed plugin
        raise UserError(
            f"checkpoint {path} was written by train.plugin=zero (removed), whose optimizer file holds "
            f"rank 0's shard only and cannot be resumed; start a new --workdir with model.init_from={path}"
        )
    rank, world = rank_and_world()
    # With another world size the per-rank loader and RNG states do not map onto the new ranks:
    # we keep weights, optimizer (re-sharded exactly) and step, and start the loaders afresh (documented; not bitwise).
    same_world = meta["world_size"] == world
    rank_file = f"rank_{rank:05d}.pt" if same_world else "rank_00000.pt"
    files = expected_files(meta)
    dcp_format = meta["format_version"] >= 3
    if dcp_format:  # which .distcp files this rank reads is DCP's plan: a stat of all of them is cheap
        names = [n for n in files if not n.startswith("rank_")] + [rank_file]
    else:
        names = ["model.safetensors", *sharded.legacy_optimizer_sources(files), rank_file]
    for name in names:
        problem = fileio.size_problem(path / name, files.get(name))
        if problem:
            raise Unusable(path, problem)
    index = None
    if dcp_format:  # read here, rank-local, so its problems surface before DCP's load (a collective) uses it
        try:
            index = sharded.read_index(path, files)
        except sharded.IndexProblem as e:
            raise Unusable(path, str(e)) from None
    rank_state = _torch_load(path, rank_file)
    problem = rank_state_problem(rank_state)
    if problem:
        raise Unusable(path, f"{rank_file} {problem}")
    loaded = {
        "path": path,
        "meta": meta,
        "same_world": same_world,
        "dcp": dcp_format,
        "rank": rank_state,
        "index": index,
    }
    if not dcp_format:
        optimizer_files = names[1:-1]
        loaded["model"] = _safetensors(path, "model.safetensors")
        loaded["optimizer"] = [_torch_load(path, n) for n in optimizer_files]
        loaded["optimizer_from_ddp"] = optimizer_files == [sharded.FULL_OPTIMIZER]
    return loaded


def apply(loaded: dict, model, optimizer, scaler, ema=None) -> dict:
    """Every rank, after ``read``: loads weights and optimizer state (a collective: DCP's load, or the
    format-2 reader), the EMA average ``ema`` (a `ModelEma`) and the scaler and RNG; returns ``load``'s dict.
    A checkpoint without an EMA (written before it existed, or with ``train.ema_decay=0``) starts the average
    from the restored weights, with one warning line. A DCP read that fails on any rank raises the same
    one-line ``UserError`` on every rank."""
    path, meta, state, same_world = loaded["path"], loaded["meta"], loaded["rank"], loaded["same_world"]
    saved_ema = ema is not None and loaded["dcp"] and meta.get("ema", False)
    if loaded["dcp"]:
        try:
            sharded.load(
                path,
                model,
                optimizer,
                meta.get("optimizer_state", True),
                ema.state_dict() if saved_ema else None,
                files=meta["files"],
                index=loaded["index"],
            )
        except CheckpointException as e:
            raise UserError(
                f"cannot read checkpoint {path} ({reason_of(e)}); check that every node sees it whole "
                "(shared file system), or --resume another checkpoint",
                same_on_all_ranks=True,
            ) from None
        except (RuntimeError, TypeError, ValueError, KeyError) as e:  # entries of another kind than this run's state
            raise UserError(
                f"checkpoint {path} holds state that does not fit this run ({type(e).__name__}: "
                f"{(str(e).splitlines() or [''])[0][:120]}); --resume another checkpoint",
                same_on_all_ranks=True,
            ) from None
    else:
        sharded.load_legacy(path, loaded["model"], loaded["optimizer"], loaded["optimizer_from_ddp"], model, optimizer)
    if ema is not None and not saved_ema:
        ema.reset()
        if rank_and_world()[0] == 0:  # one line per run, not per rank
            logging.getLogger("vitlarge").warning(
                f"warning: {path} holds no model EMA: the EMA (train.ema_decay={ema.decay}) starts from its weights"
            )
    if state["scaler"] or not scaler.is_enabled():
        scaler.load_state_dict(state["scaler"])
    elif not dist.is_initialized() or dist.get_rank() == 0:  # saved without fp16 (precision auto gave bf16/fp32)
        logging.getLogger("vitlarge").warning(  # every rank resumes alike: one line, from rank 0
            f"warning: {path} was trained in {meta['config']['train'].get('precision')}, this run is fp16: "
            f"the loss scale starts at its initial value"
        )
    if same_world:
        set_rng_state(state["rng"])
    return {**meta, "data": state["data"] if same_world else None, "same_world": same_world}


RANK_FILE_MAX_BYTES = 256 << 20
"""A rank file's cap: RNG and scaler states and the loader's position (a few KB to a few MB)."""


def _torch_load(folder: Path, name: str):
    """``folder/name`` through ``torch.load(weights_only=True)``; a file that is not one, or holds objects
    other than tensors and numbers, is `Unusable` in one line (never torch's advice to unpickle it anyway)."""
    import pickle

    try:
        with fileio.open_regular(folder / name, follow=False) as f:
            size = os.fstat(f.fileno()).st_size
            if name.startswith("rank_") and size > RANK_FILE_MAX_BYTES:
                raise Unusable(folder, f"{name} has {size:,} bytes, more than a rank file's {RANK_FILE_MAX_BYTES:,}")
            problem = sharded.stored_zip_problem(f, size)
            if problem:
                raise Unusable(folder, f"{name} {problem}")
            f.seek(0)
            return torch.load(f, map_location="cpu", weights_only=True)
    except Unusable:
        raise
    except OSError as e:
        raise Unusable(folder, f"{name} cannot be read ({e.strerror})") from None
    except pickle.UnpicklingError as e:
        # torch's message advises unpickling it anyway (weights_only=False): never passed on
        if "Unsupported global" in str(e):
            raise Unusable(folder, f"{name} holds objects other than tensors and numbers (refused)") from None
        raise Unusable(folder, f"{name} is not a readable torch file (UnpicklingError)") from None
    except Exception as e:  # noqa: BLE001 - torch.load raises many types on a damaged file
        raise Unusable(folder, f"{name} is not a readable torch file ({type(e).__name__})") from None


def _safetensors(folder: Path, name: str) -> dict[str, torch.Tensor]:
    """``folder/name`` as safetensors; a damaged or foreign file is `Unusable` in one line."""
    from safetensors import SafetensorError

    try:
        return load_file(str(folder / name), device="cpu")
    except (SafetensorError, OSError, ValueError) as e:
        reason = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
        raise Unusable(folder, f"{name} is not a safetensors file ({reason})") from None


def rank_state_problem(state) -> str | None:
    """Why ``state`` (a ``rank_NNNNN.pt``'s contents) is not what `save` writes: RNG states, the loss
    scaler's state and the loader's state string. None when it is."""
    if not isinstance(state, dict) or not {"rng", "scaler", "data"} <= set(state):
        return "lacks rng, scaler or data"
    rng, data, scaler = state["rng"], state["data"], state["scaler"]
    if data is not None and not isinstance(data, str):
        return "holds a data state that is not a string"
    if not isinstance(scaler, dict):
        return "holds a loss-scaler state that is not a map"
    numbers = {"scale": float, "growth_factor": float, "backoff_factor": float, "growth_interval": int}
    if scaler and not (
        all(isinstance(scaler.get(k), (int, float)) and not isinstance(scaler.get(k), bool) for k in numbers)
        and isinstance(scaler.get("_growth_tracker"), int)
    ):  # {} is a disabled scaler's (bf16, fp32)
        return "holds a malformed loss-scaler state"
    if not isinstance(rng, dict) or not isinstance(rng.get("torch"), torch.Tensor):
        return "holds no torch RNG state"
    if rng["torch"].dtype != torch.uint8 or rng["torch"].shape != torch.get_rng_state().shape:
        return "holds a torch RNG state of another kind"
    if "cuda" in rng and not (isinstance(rng["cuda"], torch.Tensor) and rng["cuda"].dtype == torch.uint8):
        return "holds a CUDA RNG state that is not bytes"
    n = rng.get("numpy")
    if not (
        isinstance(n, dict)
        and isinstance(n.get("keys"), torch.Tensor)
        and n["keys"].shape == (624,)
        and n["keys"].dtype == torch.int64
        and isinstance(n.get("pos"), int)
        and 0 <= n["pos"] <= 624
        and isinstance(n.get("has_gauss"), int)
        and n["has_gauss"] in (0, 1)  # numpy raises OverflowError on others (found by the fuzz)
        and isinstance(n.get("cached_gaussian"), float)
    ):
        return "holds a malformed numpy RNG state"
    python = rng.get("python")
    if not (
        isinstance(python, (list, tuple))
        and len(python) == 625
        and all(isinstance(x, int) and 0 <= x < 1 << 32 for x in python)
        and python[-1] <= 624
    ):
        return "holds a malformed Python RNG state"
    if rng.get("python_gauss") is not None and not isinstance(rng["python_gauss"], float):
        return "holds a malformed Python RNG state"
    return None


def weights_of(path: str | Path, meta: dict, like: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The full model state dict of checkpoint folder ``path`` (``meta``: its meta.json), on this process's
    CPU, no collective, after a size check of the files it reads (``Unusable`` if one is short).
    ``like``: a plain model's state dict to fill (format 3); allocated from the checkpoint otherwise."""
    path = Path(path)
    files = expected_files(meta)
    names = [n for n in files if not n.startswith("rank_")] if meta["format_version"] >= 3 else ["model.safetensors"]
    for name in names:
        problem = fileio.size_problem(path / name, files.get(name))
        if problem:
            raise Unusable(path, problem)
    if meta["format_version"] < 3:
        return _safetensors(path, "model.safetensors")
    try:
        # Inside DCP's load its reason would be lost ("metadata is None"); each range DCP torch.loads checked too.
        index = sharded.read_index(path, meta["files"])
        problem = sharded.slices_problem(path, index)
        if problem:
            raise Unusable(path, problem)
        return sharded.read_full_model(path, like, files=meta["files"], index=index)
    except sharded.IndexProblem as e:
        raise Unusable(path, str(e)) from None
    except CheckpointException as e:
        raise Unusable(path, reason_of(e)) from None


def load_model_weights(path: str | Path, model: torch.nn.Module, cfg: Config) -> None:
    """Weights only, from a checkpoint folder, an export folder (`vitlarge.checkpoint.export`) or a ``model.safetensors``."""
    given = path = Path(path)
    if path.is_dir() and (path / "config.json").is_file() and not (path / "meta.json").exists():
        path = path / "model.safetensors"  # an export: timm's config.json beside the weights
    elif path.is_dir():
        meta = read_meta(path)
        check_compatible(meta, path, model, cfg)
        target = sharded.inner(model)
        like = {k: torch.empty_like(v, device="cpu") for k, v in target.state_dict().items()}
        weights = weights_of(path, meta, like)
        try:
            target.load_state_dict(weights)
        except (RuntimeError, TypeError) as e:  # a checkpoint whose index passed but whose entries do not fit
            raise Unusable(path, f"its weights do not fit the model ({str(e).splitlines()[0][:120]})") from None
        return
    if not path.is_file():
        raise UserError(
            f"checkpoint {path} does not exist; pass a checkpoints/step_* folder or an exported model folder"
        )
    problem = fileio.regular_file_problem(path)
    if problem:
        raise UserError(f"{given}: {problem}; pass an exported model folder or a checkpoints/step_* folder")
    tensors = _safetensors(path.parent, path.name)
    try:
        unwrap(model).load_state_dict(tensors)
    except RuntimeError as e:
        raise UserError(_does_not_fit(given, tensors, model, cfg, e)) from None
