"""The GPU kit's ``recipes`` section: each recipe as it trains, one GPU, synthetic data on the device.

For vit_b16, deit3_b16, vit_l16 and vit_h14 (`ORDER`): the recipe's model, image size, micro-batch, precision
(``auto`` resolved for the device), dropouts, stochastic depth, activation checkpointing and determinism, at
accumulation 1 (what a GPU does per optimizer step at 128 GPUs), built by train.py's builder (`train.EngineRun`).
Rows per recipe (`rows_for`; measured by rank: every recipe's first row, then every second row...): ``compiled_<p>`` (what train.py runs on CUDA:
``train.compile=auto``), ``eager_<p>``, ``compiled_bf16`` beside a recipe's fp16, ``compiled_<p>_nodrop`` (the
recipe with its attention, projection and position dropout at 0: what dropout 0.1 costs, recipes that have it)
and, for vit_b16, ``bare_compiled_<p>``: a plain PyTorch loop (`benchmarks.harness.loop.BareLoop`, timm's Lamb) over
the same compiled model. Each row: images/s (median of rounds), step time, peak memory, MFU against the measured
matmul peak and the datasheet, the attention backend chosen (`vitlarge.model.attention`) and the one whose
kernels ran, where the step's time goes (`benchmarks.gpu.profile.breakdown`), the GPU's clock and power while it
was timed. Per recipe, the GEMM reference (`benchmarks.gpu.profile.gemm_reference`).

``overrides`` (the kit's ``--set KEY=VALUE``, train.py's syntax) apply to every row after the recipe, before the
row's own settings: ``train.compile=...``, ``train.activation_checkpointing=...`` pass straight through to the
builder. ``rows`` (``recipe.row`` names) limits what runs; a time budget leaves the
rest recorded as not run, with the ``--only recipes --rows ...`` that finishes them.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import torch

from benchmarks.gpu import device as dev
from benchmarks.gpu import profile as prof
from benchmarks.gpu.request import Request
from benchmarks.harness import timing

ORDER = ("vit_b16", "deit3_b16", "vit_l16", "vit_h14")
DROPOUTS = ("model.attn_drop_rate", "model.proj_drop_rate", "model.pos_drop_rate")
TINY_KWARGS = dict(depth=2, embed_dim=64, num_heads=2)
COMPILE_SECONDS_PER_BLOCK = 8.0
"""Budget kept for a compiled row before it starts: whole-model compiling grows with depth (about 1.5 min for
ViT-B/16's 12 blocks on an H200 with Inductor's caches cold)."""


def recipe_config(
    recipe: str,
    precision: str | None,
    compile: bool,
    micro: int | None,
    tiny: bool,
    overrides: list[str],
    nodrop: bool = False,
):
    """``recipes/<recipe>.py`` as the kit trains it: ``overrides`` applied, then the row's precision and compile,
    accumulation 1, Mixup/CutMix off, plugin ddp; ``nodrop``: attention, projection and position dropout 0."""
    from benchmarks.harness.recipe import ROOT
    from vitlarge.config.load import load_recipe, validate
    from vitlarge.config.overrides import apply_override
    from vitlarge.constants import IMAGENET_TRAIN_EXAMPLES

    cfg = load_recipe(ROOT / "recipes" / f"{recipe}.py")
    for item in overrides:
        apply_override(cfg, item, "the kit's --set")
    if tiny:
        patch = 14 if "patch14" in cfg.model.name else 16
        cfg.model.kwargs = dict(TINY_KWARGS)
        cfg.data.image_size = 2 * patch
    micro = micro or (4 if tiny else cfg.train.micro_batch)
    cfg.augment.mixup_alpha = cfg.augment.cutmix_alpha = 0.0
    cfg.train.plugin = "ddp"
    cfg.train.compile = "on" if compile else "off"
    if precision:
        cfg.train.precision = precision
    cfg.train.micro_batch = cfg.train.global_batch = micro
    cfg.data.num_train_examples = IMAGENET_TRAIN_EXAMPLES
    cfg.train.phases = []
    if nodrop:
        for key in DROPOUTS:
            section, name = key.split(".")
            setattr(getattr(cfg, section), name, 0.0)
    validate(cfg, f"benchmarks.gpu ({recipe})")
    return cfg


def resolved_precision(recipe: str, device: torch.device, overrides: list[str], tiny: bool) -> str:
    from vitlarge.model.precision import choose_precision

    cfg = recipe_config(recipe, None, False, None, tiny, overrides)
    if device.type == "cpu" and tiny:
        return "fp32"  # the smoke run: fp16 on a CPU is an emulation, not what is measured
    return choose_precision(cfg.train.precision, device).name


def rows_for(recipe: str, precision: str, has_dropout: bool) -> list[tuple[str, dict]]:
    """The rows of one recipe, most important first: ``(name, {precision, compiled, nodrop, bare})``."""
    rows = [
        (f"compiled_{precision}", dict(precision=precision, compiled=True)),
        (f"eager_{precision}", dict(precision=precision, compiled=False)),
    ]
    if precision == "fp16":
        rows.append(("compiled_bf16", dict(precision="bf16", compiled=True)))
    if has_dropout:
        rows.append((f"compiled_{precision}_nodrop", dict(precision=precision, compiled=True, nodrop=True)))
    if recipe == "vit_b16":
        rows.append((f"bare_compiled_{precision}", dict(precision=precision, compiled=True, bare=True)))
    return rows


def _make(cfg, device: torch.device, path: str, bare: bool):
    from benchmarks.gpu.train import EngineRun
    from benchmarks.harness.loop import BareLoop, timm_lamb

    if not bare:
        return EngineRun(cfg, device, path)
    loop = BareLoop(cfg, device, timm_lamb)
    if cfg.train.compile == "on":
        loop.model.compile(dynamic=False)
    return loop


def measure_row(cfg, spec: dict, device: torch.device, path: str, s: dict, peak: dict, flops_per_image: float) -> dict:
    """One row: build, warm up (compiling), time ``s['rounds']`` rounds of ``s['steps']`` steps under the clock
    sampler, then profile ``s['profile_steps']`` steps."""
    dev.free_memory(device)
    base = dev.allocated(device)
    dev.reset_peak(device)
    t0 = time.perf_counter()
    trainer = _make(cfg, device, path, spec.get("bare", False))
    for _ in range(s["warmup"]):
        trainer.step()
    dev.synchronize(device)
    warm_s = time.perf_counter() - t0
    memory = dev.peak_since_reset(device, base)
    with prof.ClockSampler(device.index or 0) as clocks:
        t = [
            timing.device_seconds(lambda: [trainer.step() for _ in range(s["steps"])], device) / s["steps"]
            for _ in range(s["rounds"])
        ]
    step_s = timing.median(t)
    ips = cfg.train.micro_batch / step_s
    chosen = getattr(trainer, "attention", None)
    row = {
        "precision": spec["precision"],
        "compiled": cfg.train.compile == "on",
        "bare": bool(spec.get("bare")),
        "dropout": {k.split(".")[1]: getattr(cfg.model, k.split(".")[1]) for k in DROPOUTS},
        "step_s": timing.summary(t),
        "images_per_s": round(ips, 3),
        "build_and_warmup_s": round(warm_s, 1),
        "peak_memory_bytes": memory,
        "mfu": dev.mfu(ips * flops_per_image, peak, spec["precision"] if spec["precision"] != "fp32" else "bf16"),
        "attention_chosen": chosen.backend if chosen else "not chosen by vitlarge (the bare loop)",
        "clocks": clocks.summary(),
        "breakdown": prof.breakdown(trainer.step, device, s["profile_steps"]),
    }
    return row  # the trainer goes with this frame; the next row frees the memory first


def run(
    device: torch.device,
    path: str,
    s: dict,
    peak: dict,
    request: Request,
    deadline: float | None,
    done: Callable[[dict], None],
) -> dict:
    """``request``'s recipe rows (its ``--tiny``, ``--set`` and ``--rows``) by rank, none started past ``deadline``
    (a ``time.perf_counter`` value; None: no budget): each recipe's first row (`ORDER`), then each one's second, and
    so on, so a time budget cuts the variants before any recipe's headline row; a recipe's GEMM reference after its
    first row. ``done(result so far)`` after each row (the kit saves it)."""
    from vitlarge.model.vit import build_model, describe_model

    tiny, overrides, only_rows = request.tiny, list(request.overrides), request.rows
    out: dict = {}
    queue = []  # (rank, recipe, row name, spec, depth)
    for recipe in ORDER:
        precision = resolved_precision(recipe, device, overrides, tiny)
        base = recipe_config(recipe, precision, False, None, tiny, overrides)
        has_dropout = any(getattr(base.model, k.split(".")[1]) > 0 for k in DROPOUTS)
        info = describe_model(base)
        out[recipe] = {
            "model": base.model.name,
            "model_kwargs": base.model.kwargs,
            "image_size": base.data.image_size,
            "micro_batch": base.train.micro_batch,
            "recipe_precision": precision,
            "activation_checkpointing": base.train.activation_checkpointing,
            "drop_path_rate": base.model.drop_path_rate,
            "deterministic": base.train.deterministic,
            "overrides": overrides,
            "params": info["params"],
            "train_flops_per_image": 3 * info["fwd_flops"],
            "rows": {},
            "not_run": {},
        }
        rows = rows_for(recipe, precision, has_dropout)
        if tiny and not only_rows and recipe != ORDER[0]:  # the smoke run: every kind of row once, on vit_b16
            rows = rows[:1]
        depth = len(getattr(build_model(base, "meta"), "blocks", [])) or 12
        queue += [
            (rank, recipe, n, spec, depth)
            for rank, (n, spec) in enumerate(rows)
            if not only_rows or f"{recipe}.{n}" in only_rows
        ]
    for _, recipe, name, spec, depth in sorted(queue, key=lambda q: (q[0], ORDER.index(q[1]))):
        entry = out[recipe]
        need = (COMPILE_SECONDS_PER_BLOCK * depth if spec["compiled"] and not tiny else 0) + 20
        if deadline is not None and time.perf_counter() + need > deadline:
            left = max(0, deadline - time.perf_counter())
            entry["not_run"][name] = f"time budget: {left:.0f} s left, about {need:.0f} s needed"
            continue
        compiled = spec["compiled"] and not tiny  # --tiny: the compiled rows run eager (minutes of compiling on a CPU)
        cfg = recipe_config(recipe, spec["precision"], compiled, None, tiny, overrides, spec.get("nodrop", False))
        try:
            entry["rows"][name] = measure_row(cfg, spec, device, path, s, peak, entry["train_flops_per_image"])
        except torch.cuda.OutOfMemoryError:
            dev.free_memory(device)
            entry["not_run"][name] = "out of memory at the recipe's micro-batch"
        done(out)
        if "gemm_reference" not in entry:
            base = recipe_config(recipe, entry["recipe_precision"], False, None, tiny, overrides)
            model = build_model(base, device)
            dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(entry["recipe_precision"], torch.float32)
            entry["gemm_reference"] = prof.gemm_reference(model, base.train.micro_batch, dtype, device, s["gemm_iters"])
            del model
            dev.free_memory(device)
            done(out)
    return out


ROW_NAME = re.compile(r"(bare_)?(compiled|eager)_(fp16|bf16|fp32)(_nodrop)?")


def check_arguments(overrides: list[str], rows: list[str], tiny: bool) -> None:
    """``--set`` and ``--rows`` checked before anything runs: a bad one is one line (UserError)."""
    from vitlarge.errors import UserError

    for recipe in ORDER:
        recipe_config(recipe, None, False, None, tiny, overrides)
    for r in rows:
        recipe, _, row = r.partition(".")
        if recipe not in ORDER or not ROW_NAME.fullmatch(row):
            raise UserError(
                f"--rows {r}: expected RECIPE.ROW with RECIPE one of {', '.join(ORDER)} (vit_b16.compiled_fp16)"
            )


def finish_command(out: dict) -> str | None:
    """The kit's command line that runs the rows a time budget left out, or None."""
    left = [
        f"{r}.{n}" for r, e in out.items() for n in e.get("not_run", {}) if e["not_run"][n].startswith("time budget")
    ]
    return f"python -m benchmarks.gpu --only recipes --rows {' '.join(left)}" if left else None
