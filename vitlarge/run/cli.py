"""The training command: ``python train.py`` in a checkout, ``vitlarge-train`` or ``python -m vitlarge`` where
vitlarge is installed (usage: train.py's docstring). `main` returns the exit status; `console` leaves with it.

The hooks are handed in: train.py passes hooks/'s `build_hooks`, and `console`, the installed command's entry,
looks the same function up (installed, hooks/ is ``vitlarge.hooks``); nothing else in vitlarge/ names hooks/."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from vitlarge import beside
from vitlarge.config.key_docs import keys_help
from vitlarge.config.load import add_override_arguments, load_config
from vitlarge.distributed import launcher, process, quiet, threads
from vitlarge.distributed.process import main_then_leave
from vitlarge.plan.plan import make_plan
from vitlarge.run.gpu_hours import gpu_time_lines
from vitlarge.run.job import build_run, init_from_notes, init_from_warnings, is_resume
from vitlarge.text import plural
from vitlarge.train import memory
from vitlarge.train.command import exit_status
from vitlarge.train.profile import check_window

if TYPE_CHECKING:
    from vitlarge.distributed.threads import ThreadPools
    from vitlarge.run.job import MakeHooks


class _Parser(argparse.ArgumentParser):
    """The command's parser: ``--help`` also lists the config keys with their docstrings
    (`vitlarge.config.key_docs`), read only when asked for."""

    def format_help(self) -> str:
        return f"{super().format_help()}\n{keys_help()}"


def parse_args(argv=None) -> argparse.Namespace:
    p = _Parser(description="vitlarge: large-batch ViT pretraining on Colossal-AI")
    p.add_argument(
        "--config", required=True, help="recipe file (recipes/vit_b16.py) or a shipped recipe's name (vit_b16)"
    )
    p.add_argument(
        "--data", help="TFRecord directory with dataset.json (sets data.path; none with data.source=synthetic)"
    )
    p.add_argument("--workdir", help="logs, checkpoints and the exported model (sets workdir)")
    p.add_argument("--resume", help="a checkpoints/step_* folder; default: the newest one in the workdir")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan (batch, steps, memory); reads the data's dataset.json alone, where it is here",
    )
    p.add_argument(
        "--world-size",
        type=int,
        metavar="N",
        help="with --dry-run: plan for N processes without starting them (default: the launcher's)",
    )
    p.add_argument("--show-config", action="store_true", help="with --dry-run: the resolved config first, as JSON")
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        help="with --dry-run: plan for this device (default: the recipe's train.device; auto plans for cuda)",
    )
    p.add_argument(
        "--gpu",
        choices=("h100", "h200", "a100", "b200"),
        help="with --dry-run: the expected wall time and GPU-hours on --world-size GPUs of this kind, from the GPU "
        "kit's measured images/s (vitlarge/run/gpu_hours.py)",
    )
    p.add_argument(
        "--gpu-results",
        type=Path,
        metavar="FILE",
        help="with --gpu: the kit's gpu.json (default: the checkout's benchmarks/results/gpu.json)",
    )
    add_override_arguments(p)
    args = p.parse_intermixed_args(argv)
    if (args.world_size is not None or args.show_config) and not args.dry_run:
        p.error("--world-size and --show-config go with --dry-run")
    if args.device and not args.dry_run:
        p.error("--device goes with --dry-run (a run takes train.device)")
    if (args.gpu or args.gpu_results) and not args.dry_run:
        p.error("--gpu and --gpu-results go with --dry-run")
    if args.gpu_results and not args.gpu:
        p.error("--gpu-results goes with --gpu KIND")
    if args.gpu and args.device == "cpu":
        p.error("--gpu plans GPUs: leave out --device cpu")
    if args.world_size is not None and args.world_size < 1:
        p.error(f"--world-size must be at least 1, got {args.world_size}")
    return args


def main(argv: list[str] | None, make_hooks: MakeHooks) -> int:
    """The command on ``argv`` (None: the command line's), with the hooks ``make_hooks`` makes; the exit status."""
    args = parse_args(argv)

    process.quiet_imports()
    quiet.quiet_checkpoint_writer()

    def work(env) -> int:
        # Our lines at INFO on the main rank; every other library stays at WARNING (matplotlib's
        # "generated new fontManager" and the like are not the user's business).
        logging.basicConfig(level=logging.WARNING, format="%(message)s")
        logging.getLogger("vitlarge").setLevel(logging.INFO if env.is_main else logging.WARNING)
        pools = threads.size_thread_pools()  # before torch loads: its pool, OpenMP's, DALI's (data.num_threads=0)
        memory.configure_allocator()  # before torch loads too: its CUDA allocator reads the setting once
        return plan_or_train(args, env, pools, make_hooks)

    return exit_status(work)


def plan_or_train(args, env, threads: ThreadPools, make_hooks: MakeHooks | None = None) -> int:
    """``--dry-run``: the plan, printed by the main rank; otherwise the training run, built with the hooks
    ``make_hooks`` makes (a dry run needs none), to its end. The exit status (0; a stop raises)."""
    launcher.check_split_arguments(args.overrides)
    cfg = load_config(
        args.config, args.overrides, override_files=args.override_files, data__path=args.data, workdir=args.workdir
    )
    if args.dry_run:
        from vitlarge.data.sources import planning_manifest  # lazy: keeps torch off train.py --help
        from vitlarge.run.dry_run import print_plan  # lazy: keeps torch and timm off train.py --help

        resuming = is_resume(cfg, args.resume)
        warnings = init_from_warnings(cfg, resuming, dry_run=True)
        init_notes = init_from_notes(cfg, resuming)
        if env.is_main:
            for line in warnings:
                process.say(f"warning: {line}")
            manifest = planning_manifest(cfg)  # the data set's counts where it is here, as the run takes them
            n = manifest.num_examples("train") if manifest is not None else None
            plan = make_plan(cfg, args.world_size or env.world_size, n)
            if manifest is not None and n is not None:
                images, classes = plural(n, "training image", grouped=True), plural(manifest.num_classes, "class")
                print(f"data: {cfg.data.path}/dataset.json: {images}, {classes} (the plan's counts)")
            check_window(cfg, plan)  # as the run's preflight would
            print_plan(cfg, plan, show_config=args.show_config, device=args.device, init_from=init_notes)
            if args.gpu:
                from vitlarge.train.settings import plan_settings  # lazy: keeps torch off train.py --help

                settings = plan_settings(cfg, "cuda")
                lines = gpu_time_lines(
                    cfg, plan, settings.precision, settings.compile, args.gpu, args.gpu_results, manifest
                )
                print("\n".join(lines))
        return 0
    if cfg.data.source == "tfrecord":  # a data set that is not there: one line now, not after those 10-20 s
        from vitlarge.data.manifest import load_manifest  # lazy: keeps numpy (0.2 s) off train.py --help

        load_manifest(cfg.data.path)  # every rank: one without it names itself (report_before_group)
    if env.is_main:  # what the next 10-20 s of imports and rendezvous are, before the first line of the run's own
        print(
            f"vitlarge: {args.config} on {env.world_size} process{'es' if env.world_size > 1 else ''}: loading "
            "PyTorch and Colossal-AI, then joining the process group (10-20 s)",
            flush=True,
        )
    if make_hooks is None:
        raise TypeError("a training run needs make_hooks (train.py passes hooks' build_hooks)")
    return build_run(cfg, env, make_hooks, resume=args.resume, threads=threads).fit()


def console() -> NoReturn:
    """The ``vitlarge-train`` command: `main` with the standard hooks, left by ``os._exit`` once a process group
    was up (the status must not depend on gloo's teardown)."""
    main_then_leave(lambda: main(None, beside("hooks").build_hooks))
