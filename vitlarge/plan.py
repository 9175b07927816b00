"""``--dry-run``: the resolved config and what it will do, computed without data or a process group."""

from __future__ import annotations

import json

from vitlarge.config import Config, Plan
from vitlarge.model import describe_model, memory_estimate


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def print_plan(cfg: Config, plan: Plan) -> None:
    print("resolved config:")
    print(json.dumps(cfg.to_dict(), indent=2))
    info = describe_model(cfg)
    mem = memory_estimate(info, plan.micro_batch, cfg.train.precision, cfg.model.grad_checkpointing,
                          cfg.train.plugin == "fsdp", plan.world_size)
    train_flops = 3 * info["fwd_flops"]  # backward costs about twice the forward
    print("plan:")
    print(f"  {plan.describe()}")
    print(f"  {plan.global_batch} = {plan.micro_batch} x {plan.accum_steps} x {plan.world_size}")
    print(f"  model {cfg.model.name}: {info['params'] / 1e6:.2f}M parameters, "
          f"{info['fwd_flops'] / 1e9:.2f} GFLOPs/image forward, {train_flops / 1e9:.2f} GFLOPs/image train step")
    print(f"  epochs {cfg.train.epochs} over {plan.num_train_examples} images; "
          f"total {train_flops * plan.global_batch * plan.total_steps:.3g} FLOPs")
    print(f"  memory per device (rough, train.plugin={cfg.train.plugin}, {plan.world_size} devices): "
          f"weights {_gib(mem['weights'])}, grads {_gib(mem['grads'])}, LAMB states {_gib(mem['optimizer'])}, "
          f"activations {_gib(mem['activations'])}, total {_gib(mem['total'])}")
    every = cfg.train.checkpoint_every_steps
    evals = f"every {plan.eval_every_steps} steps" if plan.eval_every_steps else "at the end only"
    print(f"  eval {evals}, checkpoint "
          f"{f'every {every} steps' if every else 'at the end only'} into {cfg.workdir}/checkpoints")
