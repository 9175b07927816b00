"""The one place where a run's parts are combined: model, optimizer, Booster plugin, precision, engine.

train.py, the benchmarks and the tests call `build`, so a benchmark measures exactly what users run.
The rules of how the parts combine live here and nowhere else:

* ``train.precision: auto`` and ``train.compile: auto`` are resolved by device once, by the caller
  (`vitlarge.train.settings.resolve_settings`), and handed in: the model's fused attention, the plugin, the
  loss scaler and the engine take the `Settings`' choices; the config is not rewritten.
* The model is built with the same seed on every rank (identical initial weights); fused attention
  follows ``model.fused_attn`` and the resolved precision (`vitlarge.model.vit.build_model`).
* The optimizer's parameter groups (no weight decay and no trust ratio for biases, norms, position
  embeddings and the cls token; per layer with an ``lr_scale`` under ``optim.layer_decay``) come from
  `vitlarge.optim.lamb.build_optimizer`, before the Booster (FSDP keeps the groups, `vitlarge.distributed.fsdp`).
* When compile is on (CUDA by default, `vitlarge.train.settings.compile_choice`), the model's forward, or each of its
  transformer blocks (``train.compile_scope``), is compiled in place before the Booster wraps it (`compile_model`):
  DDP then wraps, and FSDP shards, a module whose parameter names, state dict, checkpoints and exports are the
  plain model's.
* With ``train.ema_decay`` the engine holds a model EMA (`vitlarge.model.ema`), made after the Booster from the
  wrapped model's weights (sharded under fsdp).
* Under FSDP the plugin owns mixed precision (it casts the gathered parameters), so there is no
  autocast and the loss scaler is sharded (`vitlarge.model.precision.Precision`, ``sharded``).

The process group must be up before `build` (the Booster wraps the model in DDP). A caller on a
machine without Colossal-AI (the GPU measurement kit, benchmarks/gpu/) passes its own single-device
``booster`` instead; everything else is combined exactly as for train.py.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch

from vitlarge.checkpoint.init_from import load_into
from vitlarge.config.schema import Config
from vitlarge.distributed.plugins import build_plugin, unwrap
from vitlarge.errors import UserError
from vitlarge.model.attention import AttentionChoice, choose_attention
from vitlarge.model.blocks import transformer_blocks
from vitlarge.model.ema import ModelEma
from vitlarge.model.precision import Precision
from vitlarge.model.vit import build_model
from vitlarge.optim.lamb import build_optimizer, import_inductor
from vitlarge.plan.plan import Plan
from vitlarge.train.engine import Engine
from vitlarge.train.settings import Settings

if TYPE_CHECKING:
    from vitlarge.distributed.booster import Booster


@dataclass
class Parts:
    """A built run. ``model`` and ``optimizer`` are the Booster's wrappers; ``engine`` holds them all."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    booster: Booster
    precision: Precision
    engine: Engine
    cfg: Config
    """The config the parts were built from, as the recipe wrote it."""
    settings: Settings
    """What they were built for: device, precision, compile (`vitlarge.train.settings`)."""
    attention: AttentionChoice | None = None
    """The attention kernel chosen for the model (`vitlarge.model.attention.choose_attention`), logged at build."""


def recompile_limit(plan: Plan) -> int:
    """Graphs the compiled forward may need in one run (static shapes): per phase one for training (its
    image size and micro batch), one for evaluation (no_grad, eval mode, its eval size) and one for the
    last, partial validation batch; two spare. Past the limit Dynamo would run the forward eagerly."""
    return 3 * max(len(plan.phases), 1) + 2


def compile_model(model: torch.nn.Module, plan: Plan, scope: str = "model") -> None:
    """Compiles ``model``'s forward in place (`nn.Module.compile`), the whole model (``scope="model"``) or each
    transformer block on its own (``"blocks"``, `vitlarge.model.blocks.transformer_blocks`; the rest runs eager):
    parameters, their names and the state dict stay the plain module's (no ``_orig_mod.`` prefix), so checkpoints,
    the export and ``model.init_from`` see the same keys with compile on or off, and a Booster wraps it as any module.

    Per block, before the Booster: under fsdp `vitlarge.distributed.fsdp.wrap` then shards each compiled block, and
    FSDP2's all-gather and reshard hooks run between the blocks' graphs instead of breaking one model graph at
    every block (torchtitan's order: compile, then ``fully_shard``); under ddp each block's backward is its own
    graph, so the gradients of the later blocks are ready, and their buckets all-reduced, while the earlier blocks
    still run their backward. The blocks share one graph per input shape and mode (same code, same shapes: Dynamo
    reuses it for every block), so the recompile limit is the same as for the whole model.

    ``dynamic=False``: every new input shape or mode (a phase's image size or batch, evaluation) gets its
    own fully specialised graph, compiled once and reused (``recompile_limit`` of them), rather than one
    graph with symbolic sizes that Inductor optimises less. Dynamo's recompile limit is a process-wide
    setting: raised here, never lowered."""
    import torch._dynamo  # lazy: Dynamo's and Inductor's modules load only for a compiled run

    units = [model] if scope == "model" else transformer_blocks(model)
    if not units:
        raise UserError(
            f"train.compile_scope=blocks compiles transformer blocks one by one; {type(model).__name__} has no "
            "timm Block: use train.compile_scope=model"
        )
    import_inductor()
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, recompile_limit(plan))
    for unit in units:
        unit.compile(dynamic=False)


def build(cfg: Config, plan: Plan, settings: Settings, booster=None, init_from: bool = True) -> Parts:
    """Model, optimizer, Booster, precision and engine for ``cfg`` with ``settings`` (what the caller resolved
    for its device, `vitlarge.train.settings.resolve_settings`: train.py logs it first).

    ``booster``: None makes Colossal-AI's ``Booster`` with the recipe's plugin; anything else must
    offer what the engine uses (``boost(model, optimizer)``, ``no_sync``, ``backward``).
    ``init_from=False`` skips ``model.init_from`` (a resume: the checkpoint's weights replace them)."""
    device = settings.device
    torch.manual_seed(cfg.train.seed)  # identical initial weights on every rank
    model = build_model(cfg, device, settings.precision)  # its attention and patch conv follow the precision
    if cfg.model.init_from and init_from:  # fine-tuning: pretrained weights, before the optimizer sees them
        for note in load_into(model, cfg):
            logging.getLogger("vitlarge").info(note)  # train.py keeps other ranks at WARNING
    attention = choose_attention(model, device, settings.precision, cfg.model.attn_drop_rate)
    logging.getLogger("vitlarge").info(attention.line)
    logging.getLogger("vitlarge").info(settings.compile_why)
    if settings.compile:  # after init_from: the weights are in place; before the Booster wraps (or shards) it
        compile_model(model, plan, settings.compile_scope)
    optimizer = build_optimizer(model, cfg.optim, settings.lamb_implementation)
    if booster is None:
        # lazy: Colossal-AI loads only where no booster is handed in (the GPU kit runs without it)
        from vitlarge.distributed.booster import Booster

        booster = Booster(plugin=build_plugin(cfg, device, settings.precision))
    boosted = booster.boost(model, optimizer)
    model, optimizer = cast(torch.nn.Module, boosted[0]), cast(torch.optim.Optimizer, boosted[1])  # the wrappers
    precision = Precision(
        settings.precision,
        device,
        cfg.train.init_loss_scale,
        cfg.train.loss_scale_growth_interval,
        sharded=cfg.train.plugin == "fsdp",
    )
    ema = None
    if cfg.train.ema_decay > 0:  # after the Booster: under fsdp the average is sharded like the weights
        ema = ModelEma(unwrap(model), cfg.train.ema_decay, cfg.train.ema_warmup)
    engine = Engine(cfg, plan, booster, model, optimizer, precision, settings, ema=ema)
    return Parts(model, optimizer, booster, precision, engine, cfg, settings, attention)
