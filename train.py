"""Large-batch ViT pretraining: the training command of a checkout (installed: ``vitlarge-train``, ``python -m
vitlarge``). The code is vitlarge/run/cli.py; it wires a recipe, the data, the model and the optimizer, and this file
hands it the hooks.

    colossalai run --nproc_per_node 4 train.py --config recipes/vit_b16.py --data /data/imagenet-tfrecord
    srun python train.py --config recipes/vit_b16.py --data /data/imagenet-tfrecord --workdir runs/b16
    python train.py --config recipes/demo_digits.py optim.lr=0.01      # dotted overrides
    colossalai run --nproc_per_node 4 train.py --config recipes/vit_b16.py --dry-run
    torchrun --nproc_per_node 8 train.py --config recipes/vit_b16.py data.source=synthetic   # no data set
    python -m vitlarge.run --nproc_per_node 4 train.py --config recipes/vit_b16.py ...  # torchrun keeping the status

A rerun with the same ``--workdir`` resumes from its newest checkpoint that passes its check
(``--resume`` picks another; see vitlarge/checkpoint/resume.py). Exit status: 0 done, 2 bad input (one line
says what to fix), 3 stopped by the NaN guard, 75 checkpointed on SIGTERM/SIGUSR1, 130 checkpointed on Ctrl-C
(SIGINT; a second Ctrl-C leaves at once, without it): run the same command to continue; 124 a collective timed
out on CPU/gloo (one line names the rank that stalled; under NCCL the watchdog aborts instead, 134). Launchers change some of these (docs/CLUSTERS.md).
"""

from hooks import build_hooks  # the observers: the library is handed them here (no torch is loaded by this)
from vitlarge.run import cli
from vitlarge.run.cli import parse_args  # noqa: F401 (tests call train.parse_args)


def main(argv: list[str] | None = None) -> int:
    """The training command with the standard hooks (hooks/); its exit status. Tests and wrappers call it."""
    return cli.main(argv, build_hooks)


if __name__ == "__main__":
    from vitlarge.distributed.process import main_then_leave

    main_then_leave(main)
