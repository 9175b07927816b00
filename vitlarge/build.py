"""The one place where a run's parts are combined: model, optimizer, Booster plugin, precision, engine.

train.py, the benchmarks and the tests call `build`, so a benchmark measures exactly what users run.
The rules of how the parts combine live here and nowhere else:

* ``train.precision: auto`` is resolved by device (`vitlarge.precision.resolve`) before anything
  reads it (`resolve_precision`): the model's fused attention, the engine and the checkpoints do.
* The model is built with the same seed on every rank (identical initial weights); fused attention
  follows ``model.fused_attn`` and the resolved precision (`vitlarge.model.build_model`).
* The optimizer's parameter groups (no weight decay and no trust ratio for biases, norms, position
  embeddings and the cls token) come from `vitlarge.optim.build_optimizer`.
* ``train.compile`` is resolved by device (`resolve_compile`: on with CUDA, off on CPU) and, when on, the
  model's forward is compiled in place before the Booster wraps it (`compile_model`): DDP then wraps
  a module whose parameter names, state dict, checkpoints and exports are the plain model's.
* Under FSDP the plugin owns mixed precision (it casts the gathered parameters), so there is no
  autocast and the loss scaler is sharded (`vitlarge.precision.Precision`, ``sharded``).

The process group must be up before `build` (the Booster wraps the model in DDP). A caller on a
machine without Colossal-AI (the GPU measurement kit, benchmarks/gpu.py) passes its own single-device
``booster`` instead; everything else is combined exactly as for train.py.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from vitlarge.config import Config, Plan
from vitlarge.engine import Engine
from vitlarge.precision import Precision, resolve


@dataclass
class Parts:
    """A built run. ``model`` and ``optimizer`` are the Booster's wrappers; ``engine`` holds them all."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    booster: object
    precision: Precision
    engine: Engine


def resolve_precision(cfg: Config, device: torch.device) -> str | None:
    """Replaces ``cfg.train.precision`` ``auto`` by what ``device`` trains in; returns why, or None
    when the recipe named a precision itself."""
    requested = cfg.train.precision
    cfg.train.precision, why = resolve(requested, device)
    return f"precision auto -> {cfg.train.precision}: {why}" if requested == "auto" else None


def resolve_compile(cfg: Config, device: torch.device) -> str:
    """Replaces ``cfg.train.compile`` ``auto`` by ``on`` (CUDA) or ``off`` (CPU); returns the line the run
    logs: which, and why.

    CPU is off because there it does not pay: on 2 cores of an AMD EPYC (AVX2, shared) a compiled
    ViT-S/16 step took 1.25x the eager one and compiling it took minutes (docs/PERFORMANCE.md, section 10).
    On CUDA Inductor fuses the norms, GELUs, residual adds and casts between the matmuls into a few
    kernels, which is where a ViT step spends its non-matmul time."""
    requested = cfg.train.compile
    if requested == "auto":
        cfg.train.compile = "on" if device.type == "cuda" else "off"
        why = (
            "CUDA: Inductor fuses the elementwise work between the matmuls"
            if device.type == "cuda"
            else "CPU: measured slower than eager (ViT-S/16: 0.8x), and compiling takes minutes (docs/PERFORMANCE.md)"
        )
        return f"compile auto -> {cfg.train.compile}: {why}"
    return f"compile {requested}: set by the recipe"


def recompile_limit(plan: Plan) -> int:
    """Graphs the compiled forward may need in one run (static shapes): per phase one for training (its
    image size and micro batch), one for evaluation (no_grad, eval mode, its eval size) and one for the
    last, partial validation batch; two spare. Past the limit Dynamo would run the forward eagerly."""
    return 3 * max(len(plan.phases), 1) + 2


def compile_model(model: torch.nn.Module, plan: Plan) -> None:
    """Compiles ``model``'s forward in place (`nn.Module.compile`): its parameters, their names and its
    state dict stay the plain module's (no ``_orig_mod.`` prefix), so checkpoints, the export and
    ``model.init_from`` see the same keys with compile on or off, and a Booster wraps it as any module.

    ``dynamic=False``: every new input shape or mode (a phase's image size or batch, evaluation) gets its
    own fully specialised graph, compiled once and reused (``recompile_limit`` of them), rather than one
    graph with symbolic sizes that Inductor optimises less. Dynamo's recompile limit is a process-wide
    setting: raised here, never lowered."""
    import warnings

    import torch._dynamo

    with warnings.catch_warnings():
        # torch 2.10's Inductor imports torch.utils.mkldnn, whose classes use the deprecated
        # torch.jit.script_method: torch's own import-time warning, not a call of ours.
        warnings.filterwarnings(
            "ignore", message="`torch.jit.script_method` is deprecated", category=DeprecationWarning
        )
        import torch._inductor.compile_fx  # noqa: F401
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, recompile_limit(plan))
    model.compile(dynamic=False)


def build(cfg: Config, plan: Plan, device: torch.device | str, booster=None, init_from: bool = True) -> Parts:
    """Model, optimizer, Booster, precision and engine for ``cfg`` on ``device`` (precision resolved).

    ``booster``: None makes Colossal-AI's ``Booster`` with the recipe's plugin; anything else must
    offer what the engine uses (``boost(model, optimizer)``, ``no_sync``, ``backward``).
    ``init_from=False`` skips ``model.init_from`` (a resume: the checkpoint's weights replace them)."""
    from vitlarge.model import build_model
    from vitlarge.optim import build_optimizer
    from vitlarge.plugins import build_plugin

    device = torch.device(device)
    resolve_precision(cfg, device)  # no-op when resolved: the model's attention and patch conv depend on it
    torch.manual_seed(cfg.train.seed)  # identical initial weights on every rank
    model = build_model(cfg, device)
    if cfg.model.init_from and init_from:  # fine-tuning: pretrained weights, before the optimizer sees them
        from vitlarge.init_from import load_into

        for note in load_into(model, cfg):
            logging.getLogger("vitlarge").info(note)  # train.py keeps other ranks at WARNING
    logging.getLogger("vitlarge").info(resolve_compile(cfg, device))
    if cfg.train.compile == "on":  # after init_from: the weights are in place; before the Booster wraps it
        compile_model(model, plan)
    o = cfg.optim
    optimizer = build_optimizer(
        model,
        o.name,
        lr=o.lr,
        weight_decay=o.weight_decay,
        betas=tuple(o.betas),
        eps=o.eps,
        bias_correction=o.bias_correction,
    )
    if booster is None:
        from colossalai.booster import Booster

        booster = Booster(plugin=build_plugin(cfg, device))
    model, optimizer, *_ = booster.boost(model, optimizer)
    precision = Precision(
        cfg.train.precision,
        device,
        cfg.train.init_loss_scale,
        cfg.train.loss_scale_growth_interval,
        sharded=cfg.train.plugin == "fsdp",
    )
    return Parts(model, optimizer, booster, precision, Engine(cfg, plan, booster, model, optimizer, precision))
