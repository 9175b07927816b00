"""Large-batch ViT pretraining: wires a recipe, the data, the model, the optimizer and the hooks.

    colossalai run --nproc_per_node 4 train.py --config recipes/vit_b16.py --data /data/imagenet-tfrecord
    srun python train.py --config recipes/vit_b16.py --data /data/imagenet-tfrecord --workdir runs/b16
    python train.py --config recipes/demo_digits.py optim.lr=0.01      # dotted overrides
    colossalai run --nproc_per_node 4 train.py --config recipes/vit_b16.py --dry-run
    torchrun --nproc_per_node 8 train.py --config recipes/vit_b16.py data.source=synthetic   # no data set
    python -m vitlarge.run --nproc_per_node 4 train.py --config recipes/vit_b16.py ...  # torchrun keeping the status

A rerun with the same ``--workdir`` resumes from its newest checkpoint that passes its check
(``--resume`` picks another; see vitlarge/checkpoint/resume.py). Exit status: 0 done, 2 bad input (one line
says what to fix), 3 stopped by the NaN guard, 75 checkpointed on SIGTERM/SIGUSR1, 130 checkpointed on Ctrl-C
(SIGINT; a second Ctrl-C leaves at once, without it): run the same command to continue. Launchers change some
of these (docs/CLUSTERS.md).
"""

from __future__ import annotations

import argparse
import logging


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="vitlarge: large-batch ViT pretraining on Colossal-AI")
    p.add_argument("--config", required=True, help="recipe file, e.g. recipes/vit_b16.py")
    p.add_argument(
        "--data", help="TFRecord directory with dataset.json (sets data.path; none with data.source=synthetic)"
    )
    p.add_argument("--workdir", help="logs, checkpoints and the exported model (sets workdir)")
    p.add_argument("--resume", help="a checkpoints/step_* folder; default: the newest one in the workdir")
    p.add_argument("--dry-run", action="store_true", help="print the resolved config and plan, touch no data")
    p.add_argument(
        "--overrides",
        dest="override_files",
        action="append",
        default=[],
        metavar="FILE",
        help="a .py (dotted.key = value lines) or .yaml file of overrides, applied before the command line's",
    )
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="dotted config overrides: optim.lr=0.01, optim.betas=0.9,0.98, model.kwargs.depth=2, train.phases.1.image_size=192",
    )
    return p.parse_intermixed_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from vitlarge.distributed import launch, launcher, threads

    launch.quiet_imports()
    from vitlarge.errors import Preempted, UserError
    from vitlarge.events import StopTraining

    env = None
    try:
        env = launcher.detect()
        # Our lines at INFO on the main rank; every other library stays at WARNING (matplotlib's
        # "generated new fontManager" and the like are not the user's business).
        logging.basicConfig(level=logging.WARNING, format="%(message)s")
        logging.getLogger("vitlarge").setLevel(logging.INFO if env.is_main else logging.WARNING)
        pools = threads.size_thread_pools()  # before torch loads: its pool, OpenMP's, DALI's (data.num_threads=0)
        return run(args, env, pools)
    except UserError as e:
        launch.tell_launcher(f"error: {e}", 2)  # the launcher's summary repeats the line (torchrun's error file)
        if launch.report_before_group(e, env):  # once; a rank's own error named by it (and told to the others)
            launch.say(f"error: {e}")
        return 2
    except StopTraining as e:
        launch.tell_launcher(f"error: {e}", 3)
        if env is None or env.is_main:
            launch.say(f"error: {e}")
        return 3
    except Preempted as e:
        launch.tell_launcher(f"vitlarge: {e}", e.exit_status)
        if env.is_main:
            launch.say(f"vitlarge: {e}")
        if e.interrupted and env.local_rank == 0:
            launcher.release_colossalai_run_after_ctrl_c()
        return e.exit_status


def run(args, env, threads: tuple[int, str]) -> int:
    from vitlarge.config.load import load_config
    from vitlarge.distributed import launcher
    from vitlarge.run.training import build_run, check_inputs, is_resume

    launcher.check_split_arguments(args.overrides)
    cfg = load_config(
        args.config, args.overrides, override_files=args.override_files, data__path=args.data, workdir=args.workdir
    )
    if args.dry_run:
        from vitlarge.plan.plan import make_plan
        from vitlarge.run.dry_run import print_plan

        check_inputs(cfg, is_resume(cfg, args.resume))
        if env.is_main:
            print_plan(cfg, make_plan(cfg, env.world_size))
        return 0
    return build_run(cfg, env, resume=args.resume, threads=threads).fit()


if __name__ == "__main__":
    from vitlarge.distributed.launch import main_then_leave

    main_then_leave(main)  # os._exit once a process group was up: the status must not depend on gloo's teardown
