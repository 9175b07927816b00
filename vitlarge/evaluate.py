"""Exact top-1 / top-5 / loss over the validation split, and the command that evaluates a checkpoint.

Contract: every rank iterates its own shard of the split, sums are all-reduced in float64, so each
image counts once whatever the world size and batch size. Every rank runs the same number of
forwards (`ValLoader.masked`: batches of DALI's padding are forwarded and counted as nothing), as a
sharded (fsdp) model's forward is collective: a rank with one forward fewer would leave the others
waiting in an all-gather.

    python -m vitlarge.evaluate --config recipes/demo_digits.py --checkpoint runs/demo/checkpoints/step_0000600
    torchrun --nproc_per_node 4 -m vitlarge.evaluate --config ... --checkpoint runs/demo/model
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable

import torch
import torch.distributed as dist


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: Iterable, precision) -> dict:
    """Returns ``val_top1``, ``val_top5`` (fractions), ``val_loss`` (mean CE) and ``val_images``.

    ``batches``: a `ValLoader` (its ``masked()`` pass is used) or any iterable of ``(images, labels)``."""
    model.eval()
    device = next(model.parameters()).device
    sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss, top1, top5, count
    masked = batches.masked() if hasattr(batches, "masked") else ((x, y, len(y)) for x, y in batches)
    for images, labels, keep in masked:
        # A padding-only batch is forwarded for the collectives only; real rows are forwarded alone.
        images, labels = (images, labels[:0]) if keep == 0 else (images[:keep], labels[:keep])
        with precision.autocast():
            logits = model(images)
        logits = logits.float()[: len(labels)]
        k = min(5, logits.shape[1])
        top = logits.topk(k, dim=1).indices
        hit = top.eq(labels[:, None])
        sums[0] += torch.nn.functional.cross_entropy(logits, labels, reduction="sum").double()
        sums[1] += hit[:, 0].sum()
        sums[2] += hit.any(dim=1).sum()
        sums[3] += labels.numel()
    if dist.is_initialized():
        dist.all_reduce(sums)
    loss, top1, top5, n = sums.tolist()
    n = max(n, 1.0)
    return dict(val_top1=top1 / n, val_top5=top5 / n, val_loss=loss / n, val_images=int(sums[3].item()))


def main(argv: list[str] | None = None) -> int:
    from vitlarge import checkpoint, launch
    from vitlarge.build import resolve_precision
    from vitlarge.config import load_config
    from vitlarge.data.build import val_loader
    from vitlarge.errors import cli_main
    from vitlarge.model import build_model
    from vitlarge.precision import Precision

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True)
    p.add_argument(
        "--checkpoint",
        required=True,
        help="a checkpoints/step_* folder, an exported model folder (<workdir>/model) or a model.safetensors file",
    )
    p.add_argument("--data", default=None)
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    args = p.parse_args(argv)
    env = None

    def work() -> None:
        nonlocal env
        cfg = load_config(args.config, args.overrides, data__path=args.data)
        env = launch.detect()
        launch.size_thread_pools()
        device, backend = launch.choose_device(cfg.train.device, env.local_rank)
        resolve_precision(cfg, device)  # as train.py does (vitlarge/build.py)
        launch.init_distributed(env, backend)
        model = build_model(cfg, device)
        checkpoint.load_model_weights(args.checkpoint, model, cfg)
        val = val_loader(cfg, env.rank, env.world_size, device)
        metrics = evaluate(model, val, Precision(cfg.train.precision, device))
        if env.is_main:
            print(json.dumps(metrics))
        dist.destroy_process_group()

    # An error every rank meets is printed once, by rank 0.
    return cli_main(work, prints=lambda e: launch.prints_error(e, env))


if __name__ == "__main__":
    sys.exit(main())
