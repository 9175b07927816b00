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
Formats 1 and 2 (``model.safetensors`` + ``optimizer.pt`` or ``optimizer_rank_NNNNN.pt``) still resume.

Publishing (``save``, a collective): every rank writes its files into ``.step_0000100.tmp/``, fsyncs
them (DCP's ``sync_files``) and checksums what it wrote; once every rank reports success, rank 0 writes
``meta.json`` (atomically), fsyncs the folder, renames it to its final name and fsyncs ``checkpoints/``.
So a folder named ``step_*`` was complete on disk before it got that name, whatever crashes when; a run
killed mid-write leaves only a ``.tmp`` folder, never chosen and removed by the next save. Then rank
0 prunes to the newest ``keep``, counting the new checkpoint and only older ones: a checkpoint newer
than the one just written is never pruned (there is none after a resume, see ``vitlarge/checkpoint/resume.py``).

What is saved: a `vitlarge.checkpoint.state.RunState`, whose parts each offer their state (``state_dict()``).
Reading: ``verify`` (vitlarge/checkpoint/trust/folder.py, also every reader of weights') re-reads every byte against
``meta.json`` and ``restore_problem`` checks what a restore would load (rank 0 does both once per resume);
``read`` checks the sizes of the files listed (a stat each) and reads this rank's own file into a `ReadCheckpoint`
(formats 1 and 2 through the one adapter, vitlarge/checkpoint/legacy.py); ``apply`` loads it into the parts (the
weights and optimizer state: a collective) and returns a `LoadedCheckpoint`. Nothing is unpickled beyond tensors and numbers
(``weights_only=True``; DCP's index through a restricted unpickler).
Folders named ``abandoned_*`` hold checkpoints moved aside by a resume (vitlarge/checkpoint/resume.py); nothing here
reads or prunes them.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from torch.distributed.checkpoint.api import CheckpointException

from vitlarge import fileio
from vitlarge.checkpoint import legacy, sharded
from vitlarge.checkpoint.files import reason_of, torch_save
from vitlarge.checkpoint.state import LoadedCheckpoint, RunState
from vitlarge.checkpoint.trust import index as dcp_index
from vitlarge.checkpoint.trust.folder import verify
from vitlarge.checkpoint.trust.layout import (
    CHECKPOINTS_DIR,
    Unusable,
    list_checkpoints,
    read_meta,
    step_name,
    step_of,
)
from vitlarge.checkpoint.trust.meta import FORMAT_VERSION, expected_files, recordable_classes
from vitlarge.checkpoint.trust.torch_files import rank_state_problem, torch_load
from vitlarge.checkpoint.weights import (
    check_compatible,
    param_shapes,
)
from vitlarge.config.schema import Config
from vitlarge.distributed.collective import gather, rank_and_world
from vitlarge.errors import UserError

if TYPE_CHECKING:
    from torch.distributed.checkpoint.metadata import Metadata


def save(workdir: str | Path, state: RunState, cfg: Config, keep: int) -> Path:
    """Collective: every rank calls it at the same optimizer-step boundary (``state.step``). Returns the final path.
    A checkpoint is complete with every part of ``state``: with its model EMA when the run has one.

    Raises the same one-line ``UserError`` on every rank if any rank fails; earlier checkpoints stay."""
    rank, world = rank_and_world()
    step, root = state.step, Path(workdir) / CHECKPOINTS_DIR
    final, tmp = root / step_name(step), root / f".{step_name(step)}.tmp"
    # Every rank must make the same choice: the two state dicts are built by different collectives.
    with_optimizer = all(gather(sharded.has_optimizer_state(state.optimizer)))

    def prepare():
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".step_*.tmp"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()

    def write() -> dict:
        names = [f"rank_{rank:05d}.pt"]
        # Before DCP's save: its planning and index are collectives, a failure there reaches every rank.
        torch_save(state.rank_state(), tmp / names[0])
        sharded.save(tmp, state.sharded_parts(with_optimizer))  # a collective; fsyncs
        names += sharded.dcp_files_of(rank, tmp)
        return {name: fileio.sync_and_record(tmp / name) for name in names}

    def publish(files: dict):
        meta = {
            "format_version": FORMAT_VERSION,
            "step": step,
            "world_size": world,
            "model": cfg.model.name,
            "param_shapes": param_shapes(state.model),
            "config": state.config if state.config is not None else cfg.to_dict(),
            "optimizer_state": with_optimizer,
            "ema": state.ema is not None,
            "line": state.lineage,
            **({"schedule": state.schedule} if state.schedule is not None else {}),
            **({"classes": state.classes} if recordable_classes(state.classes) else {}),
            "files": dict(sorted(files.items())),
        }
        fileio.write_atomic(tmp / "meta.json", json.dumps(meta, indent=1))  # also fsyncs tmp's names
        os.replace(tmp, final)
        fileio.fsync_dir(root)
        fileio.fsync_dir(root.parent)  # checkpoints/ itself may be new
        prune(workdir, keep, step)

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


def prune(workdir: str | Path, keep: int, step: int) -> None:
    """Rank 0, after publishing the checkpoint of ``step``: removes the oldest checkpoints older than it, so that
    ``keep`` remain counting it. A newer checkpoint is never removed; a ``step_*`` link is no checkpoint, never
    counted (the next resume moves it aside)."""
    older = [p for p in list_checkpoints(workdir, links=False) if step_of(p) < step]
    for old in older[: max(0, len(older) - (keep - 1))]:
        shutil.rmtree(old, ignore_errors=True)


def rank_file_of(meta: dict, rank: int, world: int) -> str:
    """The rank file rank ``rank`` of a run of ``world`` processes restores: its own at the checkpoint's world size;
    rank 0's at another (its loader and RNG states do not map onto the new ranks: the loaders start afresh)."""
    return f"rank_{rank:05d}.pt" if meta["world_size"] == world else "rank_00000.pt"


def restore_problem(path: str | Path, optimizer=None) -> str | None:
    """Why a checkpoint that passes `verify` would still fail its restore (`read`, `apply`), or None: the contents
    (`rank_state_problem`) of every rank file the restore at this world size reads (`rank_file_of`: all of them at
    the checkpoint's, rank 0's alone at another), DCP's index against what the restore asks for
    (`sharded.index_gap`: keys and shapes, metadata only) and, given this run's ``optimizer``, the saved optimizer settings against
    the kinds it writes (`sharded.saved_groups_problem`). Rank 0 runs it inside the resume's choice
    (vitlarge/checkpoint/resume.py), before anything is loaded into any part, so that an automatic resume passes such a
    checkpoint over as it does a damaged one, every rank alike (the choice is broadcast)."""
    path = Path(path)
    meta = read_meta(path)
    world = rank_and_world()[1]
    try:
        for name in sorted({rank_file_of(meta, rank, world) for rank in range(world)}):
            problem = rank_state_problem(torch_load(path, name))
            if problem:
                return f"{name} {problem}"
        if meta["format_version"] >= 3:
            index = dcp_index.read_index(path, meta["files"])
            problem = sharded.index_gap(index, meta)
            if problem:
                return problem
            if optimizer is not None and meta.get("optimizer_state", True):
                problem = sharded.saved_groups_problem(path, optimizer, files=meta["files"], index=index)
                return problem and f"optimizer settings this run's optimizer does not write: {problem}"
    except Unusable as e:
        return e.problem
    except dcp_index.IndexProblem as e:
        return str(e)
    except CheckpointException as e:
        return reason_of(e)
    # entries DCP's planner cannot place, as in `apply`; ArithmeticError: a number no check foresaw, never a traceback
    except (RuntimeError, TypeError, ValueError, KeyError, ArithmeticError) as e:
        return f"its optimizer settings cannot be read ({type(e).__name__}: {(str(e).splitlines() or [''])[0][:120]})"
    return None


@dataclass(frozen=True)
class Newest:
    """The newest checkpoint of a workdir that passes `verify` (None: none does), and the newer ones that failed,
    each with why."""

    path: Path | None
    passed_over: list[tuple[Path, str]]


def newest_verified(workdir: str | Path, optimizer=None) -> Newest:
    """The newest checkpoint of the workdir that passes ``verify`` and `restore_problem` (``optimizer``: this run's,
    for its settings' kinds), and the newer ones that failed."""
    failed = []
    for path in reversed(list_checkpoints(workdir)):
        problem = verify(path) or restore_problem(path, optimizer)
        if problem is None:
            return Newest(path, failed)
        failed.append((path, problem))
    return Newest(None, failed)


def latest(workdir: str | Path) -> Path | None:
    """What an automatic resume of ``workdir`` continues from: its newest verified checkpoint, or None."""
    return newest_verified(workdir).path


@dataclass(frozen=True)
class ReadCheckpoint:
    """A checkpoint as one rank read it (`read`), before `apply` loads it into a run: always of the current form,
    whatever the format on disk (formats 1 and 2 through vitlarge/checkpoint/legacy.py)."""

    path: Path
    meta: dict
    same_world: bool
    """Written by as many processes as this run has: the RNG states and loader position apply."""
    rank_state: dict
    """This rank's ``rank_NNNNN.pt`` (rank 0's under another world size), checked by `rank_state_problem`."""
    index: Metadata | None = None
    """Format 3: DCP's index, read and checked here (`dcp_index.read_index`)."""
    full: legacy.FullState | None = None
    """Formats 1 and 2: the whole weights and optimizer state."""

    @property
    def with_optimizer(self) -> bool:
        return self.meta.get("optimizer_state", True)

    @property
    def with_ema(self) -> bool:
        return self.full is None and self.meta.get("ema", False)  # formats 1 and 2 predate the EMA


def load(path: str | Path, state: RunState, cfg: Config) -> LoadedCheckpoint:
    """Restores ``state``'s parts (weights, optimizer, scaler, RNG and the EMA) from ``path``. ``read`` then
    ``apply``: a collective under fsdp (vitlarge/checkpoint/resume.py agrees on ``read``'s failures first)."""
    return apply(read(path, state.model, cfg), state)


def read(path: str | Path, model, cfg: Config) -> ReadCheckpoint:
    """Rank-local, no collective: checks the checkpoint (model, sizes of the files this run reads;
    ``verify`` is rank 0's job, see vitlarge/checkpoint/resume.py) and reads this rank's own file into host memory
    (formats 1 and 2: also the full weights and the optimizer files). A ``UserError`` here can be one rank's
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
    rank_file = rank_file_of(meta, rank, world)
    files = expected_files(meta)
    dcp_format = meta["format_version"] >= 3
    if dcp_format:  # which .distcp files this rank reads is DCP's plan: a stat of all of them is cheap
        names = [n for n in files if not n.startswith("rank_")] + [rank_file]
    else:
        names = [*legacy.files_read(files), rank_file]
    for name in names:
        problem = fileio.size_problem(path / name, files.get(name))
        if problem:
            raise Unusable(path, problem)
    index = None
    if dcp_format:  # read here, rank-local, so its problems surface before DCP's load (a collective) uses it
        try:
            index = dcp_index.read_index(path, files)
        except dcp_index.IndexProblem as e:
            raise Unusable(path, str(e)) from None
    rank_state = torch_load(path, rank_file)
    problem = rank_state_problem(rank_state)
    if problem:
        raise Unusable(path, f"{rank_file} {problem}")
    full = None if dcp_format else legacy.read(path, files)
    return ReadCheckpoint(path, meta, same_world, rank_state, index=index, full=full)


def apply(loaded: ReadCheckpoint, state: RunState) -> LoadedCheckpoint:
    """Every rank, after ``read``: loads the weights and optimizer state (a collective: DCP's load, or the
    format-1/2 adapter's), the EMA average and the scaler and RNG into ``state``'s parts.
    A checkpoint without an EMA (written before it existed, or with ``train.ema_decay=0``) starts the average
    from the restored weights, with one warning line. A DCP read that fails on any rank raises the same
    one-line ``UserError`` on every rank."""
    path, meta, ema = loaded.path, loaded.meta, state.ema
    saved_ema = ema is not None and loaded.with_ema
    if loaded.full is not None:
        loaded.full.load_into(path, state)
    else:
        try:
            parts = state.sharded_parts(loaded.with_optimizer, saved_ema)
            sharded.load(path, parts, files=meta["files"], index=loaded.index)
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
    rank = rank_and_world()[0]
    if ema is not None and not saved_ema:
        ema.reset()
        if rank == 0:  # one line per run, not per rank
            logging.getLogger("vitlarge").warning(
                f"warning: {path} holds no model EMA: the EMA (train.ema_decay={ema.decay}) starts from its weights"
            )
    scaler = loaded.rank_state["scaler"]
    if scaler or not state.scaler.is_enabled():
        state.scaler.load_state_dict(scaler)
    elif rank == 0:  # saved without fp16 (precision auto gave bf16/fp32): every rank resumes alike, one line
        logging.getLogger("vitlarge").warning(
            f"warning: {path} was trained in {meta['config']['train'].get('precision')}, this run is fp16: "
            f"the loss scale starts at its initial value"
        )
    if loaded.same_world:
        state.rng.load_state_dict(loaded.rank_state["rng"])
    return LoadedCheckpoint(
        path=path,
        step=meta["step"],
        world_size=meta["world_size"],
        data_state=loaded.rank_state["data"] if loaded.same_world else None,
        lineage=meta.get("line"),
        config=meta.get("config", {}),
        schedule=meta.get("schedule") or {},
    )
