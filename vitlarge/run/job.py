"""A training run from a loaded config: every step from the checks to the export, in order.

`build_run` starts the process as `vitlarge.evaluate` does (`vitlarge.train.command.start`: the device settings,
resolved once, determinism, the process group),
checks the inputs on every rank (``model.init_from``, data: `preflight`; then the workdir and ``--resume``:
`Checkpointer.check_workdir`), agreed by all ranks so one rank's missing path stops them all in seconds, builds the
parts (`vitlarge.train.assemble.build`), seeds, resumes (`Checkpointer.resume`: rank 0 picks the checkpoint,
`LoadedCheckpoint` says what of it this run can use), makes the phase loaders and the hooks the
caller hands in (train.py: hooks/'s `build_hooks`; the library imports no observer). `TrainingRun.fit` trains,
evaluates, checkpoints and exports. train.py is these two calls.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vitlarge.config.schema import Config
from vitlarge.distributed import booster, process
from vitlarge.distributed.launcher import DistEnv
from vitlarge.distributed.threads import NO_THREADS, ThreadPools
from vitlarge.errors import UserError
from vitlarge.events import Hook, RunInfo
from vitlarge.plan.edits import finished_line, frozen_lr_line, resume_plan
from vitlarge.plan.plan import Plan, make_plan, rng_seed
from vitlarge.train.command import start
from vitlarge.train.memory import gpu_start_line
from vitlarge.train.profile import check_window

if TYPE_CHECKING:
    from vitlarge.data.manifest import Manifest
    from vitlarge.train.assemble import Parts
    from vitlarge.train.loop import Trainer

log = logging.getLogger("vitlarge")

MakeHooks = Callable[..., list[Hook]]
"""What a run's hooks are made by, called as ``make_hooks(workdir, log_every=, nan_patience=, mlflow=, wandb=)``
(hooks/'s `build_hooks`): the same list on every rank."""


@dataclass
class TrainingRun:
    """A built run on this rank: ``fit`` trains it to the end (or a stop) and exports the model."""

    cfg: Config
    """The recipe's config as written (its ``auto`` values stay: what they resolved to is in ``parts.settings``)."""
    plan: Plan
    env: DistEnv
    parts: Parts
    trainer: Trainer
    manifest: Manifest

    def fit(self) -> int:
        """Trains, evaluates and exports; 0 when done (a stop raises `Preempted` or `StopTraining`)."""
        import torch.distributed as dist  # lazy: torch loads after the "loading PyTorch" line (vitlarge.run.cli)

        from vitlarge.train.settings import explain_nondeterministic  # lazy: torch, as above

        try:
            self.trainer.fit(export=self._export)
        except RuntimeError as e:  # an op with no deterministic kernel under train.deterministic: one line, exit 2
            line = explain_nondeterministic(e)
            if line is None:
                raise
            raise UserError(line, same_on_all_ranks=True) from e
        dist.destroy_process_group()
        return 0

    def _export(self) -> Path | None:
        """The timm export of the trained (or EMA) weights; every rank calls it, the main rank writes and returns it."""
        from vitlarge.checkpoint.export import export, weights_to_export  # lazy: torch, as in `fit`

        ema = self.parts.engine.ema if self.cfg.train.export_ema else None
        weights = weights_to_export(self.parts.model, ema, self.env.rank)  # a collective under fsdp
        if not self.env.is_main:
            return None
        classes = self.manifest.classes
        path = export(
            Path(self.cfg.workdir),
            self.parts.model,
            self.cfg,
            [c.synset for c in classes],
            {c.synset: c.text for c in classes if c.text} or None,
            tensors=weights,
            ema=ema is not None,
        )
        log.info(f'exported {path} (timm.create_model("local-dir:{path}", pretrained=True))')
        return path


def seed_rngs(seed: int) -> None:
    """torch's (CPU and every CUDA device), numpy's and python's RNGs."""
    import numpy as np  # lazy: torch loads after the "loading PyTorch" line (vitlarge.run.cli)
    import torch  # lazy: as above

    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def is_resume(cfg: Config, resume: str | None) -> bool:
    """Whether this run continues from a checkpoint (``--resume``, or any in the workdir)."""
    from vitlarge.checkpoint.checkpointer import Checkpointer  # lazy: torch, as in `seed_rngs`

    return bool(resume) or Checkpointer(cfg.workdir, cfg).any()


def init_from_warnings(cfg: Config, resuming: bool, dry_run: bool = False) -> list[str]:
    """Raises for what can fail before any data is read (one `UserError`): a fine-tuning source of another
    architecture or patch size. A resume takes its weights from the checkpoint: ``model.init_from`` is neither checked nor
    read then (the pretrained file may be gone from scratch space by then). Returns the warnings of a
    ``dry_run``, which plans a fine-tuning before its ``model.init_from`` exists (the pretraining's export)."""
    if not cfg.model.init_from or resuming:
        return []
    if dry_run:  # an existing source is checked by `init_from_notes`, on its shapes
        if Path(cfg.model.init_from).exists():
            return []
        return [
            f"model.init_from={cfg.model.init_from} does not exist yet; the run needs it (a pretraining's export, "
            "<workdir>/model, or a checkpoint)"
        ]
    from vitlarge.checkpoint.init_from import check_source  # lazy: torch, as in `is_resume`

    check_source(cfg)
    return []


def init_from_notes(cfg: Config, resuming: bool) -> list[str]:
    """``--dry-run``'s account of ``model.init_from``: what the run will do to the head and the position embedding
    (`vitlarge.checkpoint.init_from.plan_notes`, raising the run's one line for a source that does not fit), or that a
    resume does not read it; nothing without one, or where it is not there yet (`init_from_warnings` says so)."""
    if not cfg.model.init_from or (not resuming and not Path(cfg.model.init_from).exists()):
        return []
    if resuming:
        return ["not read: the run resumes from its checkpoint, which holds the weights"]
    from vitlarge.checkpoint.init_from import plan_notes  # lazy: torch, as in `is_resume`

    return plan_notes(cfg)


def preflight(cfg: Config, env: DistEnv, resuming: bool):
    """The checks before any work of the run's inputs, on every rank: ``model.init_from``, the data set (its
    manifest, class count, RandAugment string and shards), the batch arithmetic for this world size and the
    profiler's window inside the run. Returns ``(manifest, plan)``. (The workdir and ``--resume`` are checked after
    it: `Checkpointer.check_workdir`.)"""
    from vitlarge.data.sources import checked_manifest  # lazy: torch, as in `is_resume`

    init_from_warnings(cfg, resuming)  # raises; a run has no warnings to print here
    manifest = checked_manifest(cfg)
    plan = make_plan(cfg, env.world_size, manifest.num_examples("train"))
    check_window(cfg, plan)
    return manifest, plan


def data_digest(manifest) -> str:
    """What every rank must read alike: the example counts and a hash of the shard list (names, sizes, checksums)."""
    if not manifest.data_dir:  # synthetic: made from the config, the same everywhere
        return "synthetic"
    counts = ", ".join(f"{manifest.num_examples(s)} {s}" for s in ("train", "validation"))
    shards = [(s.file, s.bytes, s.checksum) for split in ("train", "validation") for s in manifest.shards(split)]
    return f"{counts} images, shard list {hashlib.sha256(repr(shards).encode()).hexdigest()[:12]}"


def build_run(
    cfg: Config, env: DistEnv, make_hooks: MakeHooks, resume: str | None = None, threads: ThreadPools = NO_THREADS
) -> TrainingRun:
    """Everything before the first step (see the module docstring); ``resume``: a ``--resume`` path."""
    # lazy: torch loads after the "loading PyTorch" line (vitlarge.run.cli)
    from vitlarge.checkpoint.checkpointer import Checkpointer
    from vitlarge.data.class_map import data_names  # lazy: numpy, as above
    from vitlarge.data.phased import PhasedLoaders  # lazy: torch, as above
    from vitlarge.distributed.collective import agree, check_same, rank0_decides  # lazy: torch, as above
    from vitlarge.train.assemble import build  # lazy: torch, as above
    from vitlarge.train.loop import Trainer  # lazy: torch, as above

    def before_group(settings) -> None:
        if gpu_line := gpu_start_line(settings.device, env.rank):  # every rank's own GPU, before the rendezvous
            process.say(gpu_line)
        booster.load()  # seconds: before the rendezvous, whose timeout the user sets

    # The process group first: a check that fails on one rank (a shard or a mount missing on one
    # node) then stops every rank within a collective, printed by the rank that met it. Its collectives wait
    # train.init_timeout_s until step 1 (then `Trainer` lowers it): the rendezvous, compile, the first DALI
    # fill, a resume's read.
    started = start(cfg, env, threads, before_group=before_group, collective_timeout_s=cfg.train.init_timeout_s)
    settings, device = started.settings, started.settings.device
    resuming = rank0_decides(lambda: is_resume(cfg, resume))  # one view of the checkpoint folder
    workdir = Path(cfg.workdir)
    manifest, plan = agree(lambda: preflight(cfg, env, resuming))
    check_same(data_digest(manifest), f"data sets ({cfg.data.path})", "every node must see the same --data")
    # auto settings are resolved per node: a node without a compiler (compile auto -> off) or with another GPU
    # generation (precision auto) would train differently from the others, and only rank 0's line is printed.
    check_same(
        f"train.precision={settings.precision}, train.compile={'on' if settings.compile else 'off'}",
        "settings (train.precision / train.compile auto, resolved on each node)",
        "give every node the same GPUs and toolchain, or set train.precision and train.compile explicitly",
    )
    checkpoints = Checkpointer(workdir, cfg, env.rank, classes=data_names(manifest))
    checkpoints.check_workdir(resume)  # writable on every rank, the same folder on every node, --resume readable
    if env.is_main:
        for message in [*settings.lines(), started.determinism]:
            if message:
                log.info(message)
        if cfg.data.source == "synthetic":  # images/s then measure the model and the loop, not the input pipeline
            log.info(
                f"data: synthetic, made on the device ({plan.num_train_examples} images per epoch, "
                f"{cfg.data.synthetic_val_examples} validation images, {cfg.data.num_classes} classes)"
            )

    # Identical initial weights on every rank (build seeds), then per-rank randomness.
    parts = build(cfg, plan, settings, init_from=not resuming)
    engine = parts.engine
    seed_rngs(rng_seed(cfg.train.seed, env.rank))

    # Rank 0 picks a verified checkpoint for all ranks; then weights, optimizer, scaler, RNG and step,
    # and the loader position where this run can still use it.
    start_step, data_state = 0, None
    checkpoints.attach(engine.model, engine.optimizer, engine.precision.scaler, engine.ema)
    found = checkpoints.resume(resume, plan.num_train_examples)
    chosen, lineage = found.path, found.lineage
    if chosen is None and resuming and cfg.model.init_from:
        raise UserError(
            f"{checkpoints.folder} holds no usable checkpoint, and without one this run "
            f"would start from scratch instead of model.init_from; move them aside or pass another --workdir"
        )
    if (resumed := found.loaded) is not None:  # the checkpoint at `chosen`, loaded
        start_step = resumed.step
        if resumed.world_size != plan.world_size:  # the RNG states were not restored: fresh draws from here
            seed_rngs(rng_seed(cfg.train.seed, env.rank, start_step))
        # The schedule against the checkpoint's own plan: the same, or what the edits change (lines said below).
        schedule = resume_plan(
            cfg, plan, resumed.path, resumed.config, resumed.schedule, start_step, resumed.world_size
        )
        plan = parts.engine.plan = schedule.plan  # the engine steps with the lr of the plan the run continues
        position = resumed.usable_data_state(cfg, plan, schedule_exact=schedule.exact)
        data_state = position.state
        if env.is_main:
            log.info(f"resumed from {resumed.path} at step {start_step}")
            if position.warning:
                log.warning(position.warning)
            for change in schedule.lines:
                log.warning(change)
            if schedule.exact and (frozen := frozen_lr_line(cfg, plan, start_step, resumed.path)):
                log.warning(frozen)
            if finished := finished_line(plan, start_step, resumed.path):
                log.warning(finished)

    # Each phase's loaders are built at its first step (a recipe without train.phases is one phase).
    loaders = PhasedLoaders(cfg, plan, env.rank, env.world_size, device, state=data_state)
    info = RunInfo(
        workdir=str(workdir),
        rank=env.rank,
        is_main=env.is_main,
        device=str(device),
        start_step=start_step,
        plan=plan,
        cfg=cfg,
        lineage=lineage,
        parent_lineage=found.parent_lineage,  # the trackers: a new lineage's tracked run names it as its parent
        precision_why=settings.precision_why,
        precision=settings.precision,
        compile=settings.compile,
    )
    hooks = make_hooks(
        str(workdir),
        log_every=cfg.train.log_every_steps,
        nan_patience=cfg.train.nan_patience,
        mlflow=cfg.log.mlflow,
        wandb=cfg.log.wandb,
    )
    resumed_from = str(chosen) if chosen is not None else None
    trainer = Trainer(cfg, plan, parts.engine, loaders, hooks, info, resumed_from, checkpoints)
    return TrainingRun(cfg=cfg, plan=plan, env=env, parts=parts, trainer=trainer, manifest=manifest)
