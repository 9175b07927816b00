"""Which checkpoint a run continues from, decided once by rank 0 for every rank.

Contract (both functions are collectives: every rank calls ``choose``, then ``restore``):

* ``choose`` without ``--resume``: rank 0 takes the workdir's newest checkpoint that passes
  ``store.verify`` (a folder, not a link; every file's size and CRC32C against meta.json) and
  ``store.restore_problem`` (what the restore would load: rank files, the optimizer settings' kinds), before
  anything is loaded, and logs one warning line for each newer one it passes over, naming it and why. With
  ``--resume PATH`` (any checkpoint, in this workdir or another one): PATH must pass both, else a one-line error;
  a PATH that is a link (a user's own ``latest``) is resolved once and the folder it names is checked and used.
* The chosen checkpoint must hold this recipe's model (name and parameter shapes), else a one-line
  error and nothing is moved.
* The workdir's checkpoints newer than the chosen step (those passed over, and with ``--resume`` the
  rest of the lineage the user went back from) are moved, never deleted, into
  ``checkpoints/abandoned_<UTC time>_from_step_<N>/``, with one log line. This run's saves then
  take those step names again, and the next automatic resume continues this run's lineage.
* Lineages: every checkpoint's meta.json names the lineage it belongs to (meta.json's ``line``): the absolute path of the
  ``--resume`` checkpoint the lineage started from (None for a run that started from scratch); an automatic
  resume keeps the lineage of the checkpoint it continues. ``--resume X`` when the workdir already holds
  a checkpoint of X's lineage (the same command run again: a Slurm requeue replays its arguments)
  continues from that lineage's newest checkpoint that passes its check: nothing is moved aside, the run
  never goes back to X, and X itself may have been pruned. To go back to X a second time, move the
  lineage's checkpoints aside (or ``--resume`` a copy of X under another path).
* A checkpoint from outside the workdir's ``checkpoints/`` is first copied in (hard links where
  possible) and the copy is used: the workdir's lineage then starts with it.
* Rank 0 broadcasts its choice: no other rank lists the checkpoint folder (on a shared file system
  with attribute caching ranks can see different folders).
* ``restore``: every rank loads the chosen checkpoint; if one cannot, every rank raises the same
  one-line error naming the lowest failing rank and the path, so all exit and none waits.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from vitlarge import fileio
from vitlarge.checkpoint import files as ckpt_files
from vitlarge.checkpoint import store, weights
from vitlarge.checkpoint.state import LoadedCheckpoint, RunState
from vitlarge.checkpoint.trust import layout
from vitlarge.checkpoint.trust import meta as meta_json
from vitlarge.config.schema import Config
from vitlarge.data.sources import source_changed
from vitlarge.distributed.collective import first_failure, rank0_decides
from vitlarge.errors import UserError
from vitlarge.plan.phases import new_boundaries_before

log = logging.getLogger("vitlarge")


@dataclass(frozen=True)
class Choice:
    """The checkpoint every rank loads (None: start from scratch) and the lineage this run's checkpoints belong to
    (their meta.json's ``line``; None for a run from scratch that was never resumed with ``--resume``)."""

    path: Path | None
    lineage: str | None
    parent: str | None = field(default=None, compare=False)
    """The lineage the loaded checkpoint's own meta.json names (a copied-in one's: this run's); None from scratch.
    Read inside the choice, so that no rank reads a meta.json again outside the collective."""


def choose(
    workdir: str | Path,
    requested: str | Path | None,
    model,
    cfg: Config,
    num_train_examples: int | None = None,
    optimizer=None,
) -> Choice:
    """Rank 0's choice for every rank: see the module docstring. ``num_train_examples``: the data set's, for the
    phase-boundary check (`check_edits`; skipped without it). ``optimizer``: this run's, whose settings' kinds a
    checkpoint's must have (`store.restore_problem`; not checked without it)."""
    requested = Path(requested) if requested else None
    return rank0_decides(lambda: _choose(Path(workdir), requested, model, cfg, num_train_examples, optimizer))


def lineage_of(requested: str | Path) -> str:
    """The lineage a run started with ``--resume requested`` writes: the checkpoint's absolute path, so that
    the same command, run again (a Slurm requeue replays its arguments), finds the lineage it started."""
    return str(Path(requested).absolute())


def newest_of_lineage(workdir: str | Path, lineage: str, verified: bool = True, optimizer=None) -> Path | None:
    """The workdir's newest checkpoint that belongs to ``lineage`` (and passes its check, `store.verify` and
    `store.restore_problem` with ``optimizer``, unless ``verified`` is False: then its meta.json alone is read, no
    checksum). A ``step_*`` link is never read through. Verified (rank 0, inside `choose`): each newer checkpoint of
    the line that fails gets the automatic resume's one `passed_over` line."""
    for path in reversed(layout.list_checkpoints(workdir, links=False)):
        try:
            meta = layout.read_meta(path)
        except UserError:
            continue
        if meta.get("line") != lineage:
            continue
        problem = (store.verify(path) or store.restore_problem(path, optimizer)) if verified else None
        if problem is None:
            return path
        passed_over(path, problem)
    return None


def passed_over(path: Path, problem: str) -> None:
    """The one line for a checkpoint a resume skips because it fails its check (rank 0's, inside `choose`)."""
    log.warning(f"warning: checkpoint {path} fails its check ({problem}); passed over")


def check_requested(workdir: str | Path, requested: str | Path) -> None:
    """Before any work, on rank 0 (`rank0_decides`: one view of the folder): ``--resume`` names a checkpoint
    with a readable meta.json, or its lineage continues in the workdir (a requeue after the checkpoint itself
    was pruned); else a one-line ``UserError``. Reads meta.json files only: the checksums are `_choose`'s,
    once, on rank 0 (at 7.6 GB per vit_h14 checkpoint, not a read per rank at every requeue)."""
    if newest_of_lineage(workdir, lineage_of(requested), verified=False) is None:
        layout.read_meta(requested)


def check_edits(meta: dict, path: Path, cfg: Config, num_train_examples: int | None) -> None:
    """The edits a checkpoint cannot continue under (one ``UserError``): another ``data.source``
    (`vitlarge.data.sources.source_changed`; a meta.json without one was written by a TFRecord run), a phase boundary
    moved or added before its step (`vitlarge.plan.phases.new_boundaries_before`), layer-wise lr decay turned on or
    off (`optimizer_groups_changed`). On rank 0 inside `choose`, before any checkpoint is moved or copied."""
    saved = meta.get("config", {})
    edited = source_changed(str(saved.get("data", {}).get("source", "tfrecord")), cfg)
    edited = edited or (
        new_boundaries_before(saved, cfg, num_train_examples, meta["step"]) if num_train_examples else None
    )
    edited = edited or optimizer_groups_changed(meta, cfg)
    if edited:
        raise UserError(f"{path}: {edited}", same_on_all_ranks=True)


def _choose(
    workdir: Path, requested: Path | None, model, cfg: Config, num_train_examples: int | None, optimizer
) -> Choice:
    lineage = None
    if requested is not None:
        lineage = lineage_of(requested)
        continued = newest_of_lineage(workdir, lineage, optimizer=optimizer)
        if continued is not None:  # the same --resume again: continue the lineage it started
            meta = layout.read_meta(continued)
            weights.check_compatible(meta, continued, model, cfg)
            check_edits(meta, continued, cfg, num_train_examples)
            log.info(f"--resume {requested}: this workdir continues its line; resuming from {continued}")
            _set_aside_newer(workdir, continued, meta["step"])
            return Choice(continued, lineage, meta.get("line"))
        # A path the user names (a `latest` link of their own) is resolved once and the folder it names checked and
        # read; only the workdir's listed step_* links are refused (`store.verify`).
        chosen = requested.resolve()
        problem = store.verify(chosen) or store.restore_problem(chosen, optimizer)
        if problem:
            raise layout.Unusable(requested, problem)
    else:
        newest = store.newest_verified(workdir, optimizer)
        chosen = newest.path
        for path, problem in newest.passed_over:
            passed_over(path, problem)
    step, parent = 0, None
    if chosen is not None:
        meta = layout.read_meta(chosen)
        weights.check_compatible(meta, chosen, model, cfg)
        check_edits(meta, chosen, cfg, num_train_examples)  # before anything is moved aside or copied
        step = meta["step"]
        lineage = lineage if requested is not None else meta.get("line")  # an automatic resume keeps the lineage
        parent = meta.get("line")
    _set_aside_newer(workdir, chosen, step)
    ours = workdir / layout.CHECKPOINTS_DIR
    if chosen is not None and chosen.resolve().parent != ours.resolve():
        # From another workdir (or an abandoned_* folder): a copy here starts this run's lineage, so an
        # automatic resume before the first save comes back to it, not to this workdir's older steps.
        try:
            chosen = _adopt(chosen, workdir, lineage)
            parent = lineage  # the copy's meta.json names this run's lineage
        except OSError as e:
            raise UserError(
                f"cannot copy checkpoint {chosen} into {ours} ({e.strerror}); free space there or pass "
                "another --workdir"
            ) from None
        log.info(f"copied the checkpoint to resume from into {chosen}")
    return Choice(chosen, lineage, parent)


def _set_aside_newer(workdir: Path, chosen: Path | None, step: int) -> None:
    """Moves the workdir's checkpoints from another lineage out of the way (see the module docstring).

    A checkpoint of the same step that is not the chosen one (``--resume`` from another workdir) goes too:
    the final-save decision would otherwise take it for this run's."""
    same = chosen.resolve() if chosen is not None else None
    later = [
        p
        for p in layout.list_checkpoints(workdir)
        if layout.step_of(p) > step or (layout.step_of(p) == step and (p.is_symlink() or p.resolve() != same))
    ]
    if not later:
        return
    try:
        dest = _move_aside(workdir, later, step)
    except OSError as e:
        raise UserError(
            f"cannot move checkpoints newer than step {step} aside in {workdir / layout.CHECKPOINTS_DIR} "
            f"({e.strerror}); make it writable or pass another --workdir"
        ) from None
    log.warning(
        f"moved {len(later)} checkpoint(s) newer than step {step} ({', '.join(p.name for p in later)}) "
        f"aside to {dest}; this run continues from {chosen or 'no checkpoint of this workdir (model.init_from or scratch)'}"
    )


def _move_aside(workdir: str | Path, paths: list[Path], from_step: int) -> Path:
    """Moves checkpoint folders (never deletes them) into ``checkpoints/abandoned_<UTC time>_from_step_<N>/``.

    Returns that folder. Its name matches no ``step_*`` pattern, so it is never chosen nor pruned."""
    root = Path(workdir) / layout.CHECKPOINTS_DIR
    base = f"abandoned_{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}_from_{layout.step_name(from_step)}"
    i = 0
    while True:
        dest = root / (base if i == 0 else f"{base}_{i}")
        try:
            dest.mkdir()
            break
        except FileExistsError:
            i += 1
    for path in paths:
        os.rename(path, dest / path.name)
    fileio.fsync_dir(dest)
    fileio.fsync_dir(root)
    return dest


def _adopt(src: str | Path, workdir: str | Path, lineage: str | None) -> Path:
    """Publishes a copy of checkpoint ``src`` (from elsewhere) in the workdir, as ``checkpoints/step_<N>``,
    its meta.json naming ``lineage`` as its ``line`` (the copy is the lineage's first checkpoint); returns it. Hard links where
    the file system allows (no bytes copied; checkpoint files are never modified in place), else copies;
    fsynced and renamed like a save. The name must be free."""
    src, root = Path(src), Path(workdir) / layout.CHECKPOINTS_DIR
    meta = layout.read_meta(src)
    step = meta["step"]
    final, tmp = root / layout.step_name(step), root / f".{layout.step_name(step)}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    fileio.write_atomic(tmp / "meta.json", json.dumps({**meta, "line": lineage}, indent=1))
    for name in meta_json.expected_files(meta):  # the files meta.json lists, never whatever else is there
        f = src / name
        problem = fileio.regular_file_problem(f)
        if problem:
            raise layout.Unusable(src, problem)
        try:
            os.link(f, tmp / f.name)
        except OSError:  # another file system, or links not allowed
            shutil.copyfile(f, tmp / f.name)
            fileio.fsync_path(tmp / f.name)
    fileio.fsync_dir(tmp)
    os.replace(tmp, final)
    fileio.fsync_dir(root)
    return final


def restore(path: Path, state: RunState, cfg: Config) -> LoadedCheckpoint:
    """Every rank loads ``path`` into ``state``'s parts (``store.load``); returns what it restored, or all ranks
    raise one agreed error."""
    loaded, problem = None, None
    try:  # rank-local reads first: a rank that cannot read must not leave the others in a collective load
        loaded = store.read(path, state.model, cfg)
    except layout.Unusable as e:
        problem = e.problem
    except UserError as e:
        problem = str(e)
    except Exception as e:  # noqa: BLE001 - torch.load and safetensors raise many types on damaged files
        problem = f"{type(e).__name__}: {ckpt_files.reason_of(e)}"
    failed = first_failure(problem)
    if failed:
        rank, why = failed
        raise UserError(
            f"rank {rank} cannot read checkpoint {path} ({why}); check that every node sees it whole (shared file "
            "system), or --resume another checkpoint",
            same_on_all_ranks=True,
        )
    assert loaded is not None  # every rank read it (first_failure agreed)
    return store.apply(loaded, state)  # DCP's load is a collective: every rank together


def optimizer_groups_changed(meta: dict, cfg: Config) -> str | None:
    """The error line when the checkpoint's optimizer has other parameter groups than this run's: layer-wise
    lr decay turned on or off (`vitlarge.optim.lamb.param_groups`: one decay and one no-decay group without
    it, both per layer with it). Another ``optim.layer_decay`` below 1 keeps the groups and resumes (each
    group's lr follows the recipe's scale). None when the groups match."""
    was = meta.get("config", {}).get("optim", {}).get("layer_decay", 1.0)
    now = cfg.optim.layer_decay
    if (was == 1.0) == (now == 1.0):
        return None
    return (
        f"optim.layer_decay={now:g}, but the checkpoint was trained with {was:g}, so its optimizer state has other "
        f"parameter groups (per layer with layer decay, two without): set optim.layer_decay={was:g} to resume, or "
        "start a new workdir with model.init_from=<the checkpoint> (a fine-tune starts a new optimizer)"
    )
