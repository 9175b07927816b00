"""Large-batch ViT pretraining: wires a recipe, the data, the model, the optimizer and the hooks.

    colossalai run --nproc_per_node 4 train.py --config recipes/vit_b16.py --data /data/imagenet-tfrecord
    srun python train.py --config recipes/vit_b16.py --data /data/imagenet-tfrecord --workdir runs/b16
    python train.py --config recipes/demo_digits.py optim.lr=0.01      # dotted overrides
    colossalai run --nproc_per_node 4 train.py --config recipes/vit_b16.py --dry-run
    torchrun --nproc_per_node 8 train.py --config recipes/vit_b16.py data.source=synthetic   # no data set

A rerun with the same ``--workdir`` resumes from its newest checkpoint that passes its check
(``--resume`` picks another; see vitlarge/resume.py). Exit status: 0 done, 2 bad input (one line
says what to fix), 3 stopped by the NaN guard, 75 checkpointed on SIGTERM/SIGUSR1 (run again to continue).
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="vitlarge: large-batch ViT pretraining on Colossal-AI")
    p.add_argument("--config", required=True, help="recipe file, e.g. recipes/vit_b16.py")
    p.add_argument(
        "--data", help="TFRecord directory with dataset.json (sets data.path; none with data.source=synthetic)"
    )
    p.add_argument("--workdir", help="logs, checkpoints and the exported model (sets workdir)")
    p.add_argument("--resume", help="a checkpoints/step_* folder; default: the newest one in the workdir")
    p.add_argument("--dry-run", action="store_true", help="print the resolved config and plan, touch no data")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides")
    return p.parse_intermixed_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from vitlarge import launch

    launch.quiet_imports()
    from vitlarge.errors import EXIT_PREEMPTED, Preempted, UserError
    from vitlarge.events import StopTraining

    env = None
    try:
        env = launch.detect()
        # Our lines at INFO on the main rank; every other library stays at WARNING (matplotlib's
        # "generated new fontManager" and the like are not the user's business).
        logging.basicConfig(level=logging.WARNING, format="%(message)s")
        logging.getLogger("vitlarge").setLevel(logging.INFO if env.is_main else logging.WARNING)
        threads = launch.size_thread_pools()  # before torch loads: its pool, OpenMP's, DALI's (data.num_threads=0)
        return run(args, env, threads)
    except UserError as e:
        if launch.prints_error(e, env):  # once, by rank 0, when every rank meets the same error
            print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    except StopTraining as e:
        if env is None or env.is_main:
            print(f"error: {e}", file=sys.stderr, flush=True)
        return 3
    except Preempted as e:
        if env.is_main:
            print(f"vitlarge: {e}", file=sys.stderr, flush=True)
        return EXIT_PREEMPTED


def run(args, env, threads: tuple[int, str]) -> int:
    from vitlarge.checkpoint import list_checkpoints
    from vitlarge.config import load_config, make_plan
    from vitlarge.errors import UserError

    cfg = load_config(args.config, args.overrides, data__path=args.data, workdir=args.workdir)

    # A resume takes its weights from the checkpoint: model.init_from is neither checked nor read
    # (the pretrained file may be gone from scratch space by then).
    resuming = bool(args.resume) or bool(list_checkpoints(cfg.workdir))
    if cfg.model.init_from and not resuming:
        from vitlarge.init_from import check_source

        check_source(cfg)  # a missing file, another architecture or patch size: one line, before any data
    if args.dry_run:
        from vitlarge.plan import print_plan

        if env.is_main:
            print_plan(cfg, make_plan(cfg, env.world_size))
        return 0

    # Setup: device, process group, workdir.
    import numpy as np
    import torch

    from hooks import build_hooks
    from vitlarge import checkpoint, launch
    from vitlarge import resume as resume_from
    from vitlarge.build import build, resolve_precision
    from vitlarge.data.build import check_data, train_loader, val_loader
    from vitlarge.data.common import state_from_older_release
    from vitlarge.events import RunInfo
    from vitlarge.export import export
    from vitlarge.sharded_checkpoint import model_tensors
    from vitlarge.trainer import Trainer

    manifest = check_data(cfg)  # class count and RandAugment string, before any work or file
    plan = make_plan(cfg, env.world_size, manifest.num_examples("train"))
    workdir = Path(cfg.workdir)
    checkpoint.check_writable(workdir, env.rank)
    if args.resume:
        checkpoint.read_meta(args.resume)  # a missing or incomplete --resume path fails before any work
    if env.is_main:
        logging.getLogger("vitlarge").info(f"threads: {threads[0]} per process ({threads[1]})")
        if cfg.data.source == "synthetic":  # images/s then measure the model and the loop, not the input pipeline
            logging.getLogger("vitlarge").info(
                f"data: synthetic, made on the device ({plan.num_train_examples} images per epoch, "
                f"{cfg.data.synthetic_val_examples} validation images, {cfg.data.num_classes} classes)"
            )
    device, backend = launch.choose_device(cfg.train.device, env.local_rank)
    why = resolve_precision(cfg, device)  # before anything reads it: model, engine, checkpoints
    if env.is_main and why:
        logging.getLogger("vitlarge").info(why)
    import colossalai.booster  # noqa: F401 (~10 s: before the rendezvous, whose timeout the user sets)

    launch.init_distributed(env, backend)

    # Model, optimizer, plugin, precision, engine (vitlarge/build.py): identical initial weights on
    # every rank, then per-rank randomness.
    parts = build(cfg, plan, device, init_from=not resuming)
    model = parts.model
    torch.manual_seed(cfg.train.seed + env.rank)
    np.random.seed(cfg.train.seed + env.rank)
    random.seed(cfg.train.seed + env.rank)

    # Resume: rank 0 picks a verified checkpoint for all ranks (vitlarge/resume.py); then weights,
    # optimizer, scaler, RNG, step and this rank's loader position.
    start_step, data_state = 0, None
    resume = resume_from.choose(workdir, args.resume, model, cfg)
    if resume is None and resuming and cfg.model.init_from:
        raise UserError(
            f"{workdir}/{checkpoint.CHECKPOINTS_DIR} holds no usable checkpoint, and without one this run "
            f"would start from scratch instead of model.init_from; move them aside or pass another --workdir"
        )
    if resume is not None:
        state = resume_from.restore(resume, model, parts.optimizer, parts.precision.scaler, cfg)
        start_step, data_state = state["step"], state["data"]
        if env.is_main:
            logging.getLogger("vitlarge").info(f"resumed from {resume} at step {start_step}")
        if env.is_main and not state["same_world"]:
            logging.getLogger("vitlarge").warning(
                f"warning: {resume} was written by {state['world_size']} processes, this run has {env.world_size}: "
                f"weights, optimizer (re-sharded), step and lr schedule resume exactly, the global batch stays "
                f"{plan.global_batch} ({plan.accum_steps} micro-steps per step now), the data stream restarts "
                "with a fresh epoch order"
            )

    # Data. A loader state from an older release cannot be continued (its pipeline differs): as after a
    # change of world size, weights, optimizer and step resume exactly and the data stream starts afresh.
    old = state_from_older_release(data_state)
    if old is not None:
        data_state = None
        if env.is_main:
            logging.getLogger("vitlarge").warning(
                f"warning: {resume} holds a data-loader position from an older vitlarge (state version {old}); "
                "the data stream restarts with a fresh epoch order, weights, optimizer and step resume exactly"
            )
    phased = None
    if plan.phases:  # each phase's loaders are built at its first step (vitlarge/phases.py)
        from vitlarge.phases import PhasedLoaders, state_of_other_phases

        if state_of_other_phases(data_state, cfg):
            data_state = None
            if env.is_main:
                logging.getLogger("vitlarge").warning(
                    f"warning: {resume} was written under another train.phases list (or none); the data stream "
                    "restarts with a fresh epoch order, weights, optimizer and step resume; lr and phase follow the "
                    "new list at that step"
                )

        phased, train, val = PhasedLoaders(cfg, plan, env.rank, env.world_size, device, state=data_state), None, None
    else:
        train = train_loader(cfg, env.rank, env.world_size, device, state=data_state)
        val = val_loader(cfg, env.rank, env.world_size, device)

    # Loop, final evaluation, export.
    run_info = RunInfo(
        workdir=str(workdir),
        rank=env.rank,
        is_main=env.is_main,
        device=str(device),
        start_step=start_step,
        plan=plan,
        cfg=cfg,
    )
    hooks = build_hooks(str(workdir), log_every=cfg.train.log_every_steps, nan_patience=cfg.train.nan_patience)
    Trainer(cfg, plan, parts.engine, train, val, hooks, run_info, start_step=start_step, phased=phased).fit()
    weights = model_tensors(model, env.rank)  # a collective under fsdp (gathers the shards to rank 0)
    if env.is_main:
        path = export(
            workdir,
            model,
            cfg,
            [c.synset for c in manifest.classes],
            {c.synset: c.text for c in manifest.classes if c.text} or None,
            tensors=weights,
        )
        logging.getLogger("vitlarge").info(f'exported {path} (timm.create_model("local-dir:{path}", pretrained=True))')
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
