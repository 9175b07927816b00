"""``--dry-run --gpu KIND``: a recipe's expected wall time and GPU-hours on ``--world-size`` GPUs of a kind, from the
images/s the GPU kit measured (``python -m benchmarks.gpu``: benchmarks/results/gpu.json in a checkout, or
``--gpu-results FILE``) and the communication model of docs/PERFORMANCE.md section 7.

Per phase: images/s per GPU from the kit's row for the phase's model, image size, precision and compile setting
(the closest row where that exact one was not measured, said so), scaled by training FLOPs per image where the
size or model differs, and by the dense bf16 datasheet ratio where the kit ran on another kind of GPU (said
so). A step is its compute (global batch / (GPUs x images/s)) plus one ring all-reduce of the fp32 gradients,
2(n-1)/n x their bytes at 150 GB/s inside a node (n <= 8), 20 GB/s across nodes, not overlapped with the
backward: an upper bound for the training steps. Evaluation, checkpoints and start-up are not counted.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from vitlarge.config.schema import Config
from vitlarge.errors import UserError
from vitlarge.plan.plan import Plan, phase_config

DATASHEET = {  # dense bf16/fp16 tensor-core TFLOP/s, NVIDIA's datasheets (no 2:4 sparsity)
    "a100": ("A100 SXM4", 312.0),
    "h100": ("H100 SXM", 989.4),
    "h200": ("H200 SXM", 989.4),
    "b200": ("B200", 2250.0),
}
KINDS = tuple(DATASHEET)
BUSBW = {"inside a node": 150e9, "across nodes": 20e9}
"""Bus bandwidth a ring all-reduce gets per GPU (docs/PERFORMANCE.md section 7: NVLink inside an 8-GPU node, one
200 Gb/s InfiniBand port per GPU across nodes at about 80%)."""
GPUS_PER_NODE = 8
GRAD_BYTES = 4  # fp32 gradients
DEFAULT_RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "gpu.json"


@dataclass(frozen=True)
class Rate:
    """One measured training row of the kit: images/s per GPU for a model at a size and setting."""

    model: str
    image_size: int
    precision: str
    compiled: bool
    recompute: str
    """``train.activation_checkpointing`` of the row (``off``, ``full``, ``selective``)."""
    images_per_s: float
    row: str


def kind_of(name: str) -> str | None:
    """The kind (``h100``...) a CUDA device name is, None for others (``NVIDIA H200`` -> ``h200``)."""
    words = set(re.split(r"[\s\-_]+", name.upper()))
    for kind in ("b200", "h200", "h100", "a100"):
        if kind.upper() in words:
            return kind
    return None


def recompute_of(recipe: dict) -> str:
    """A kit recipe entry's ``activation_checkpointing``; an entry written before the key's rename records
    ``grad_checkpointing`` (true: ``full``)."""
    mode = recipe.get("activation_checkpointing")
    if mode in ("off", "full", "selective"):
        return mode
    return "full" if recipe.get("grad_checkpointing") is True else "off"


def measured_rates(result: dict) -> list[Rate]:
    """The kit's training rows from its gpu.json: ``recipes`` (each recipe's configuration, eager and compiled)
    where the kit wrote them, and the older ``train`` (ViT-B/16) and ``large`` (L/16, H/14) sections."""
    rates = []
    for name, r in (result.get("recipes") or {}).items():
        for row, v in (r.get("rows") or {}).items():
            if v.get("images_per_s"):
                rates.append(
                    Rate(
                        r["model"],
                        int(r["image_size"]),
                        str(v["precision"]),
                        bool(v.get("compiled")),
                        recompute_of(r),
                        float(v["images_per_s"]),
                        f"recipes.{name}.{row}",
                    )
                )
    t = result.get("train")
    if t:
        for row, v in t["results"].items():
            if row.startswith("vitlarge") and v.get("images_per_s"):
                compiled = bool(v.get("compiled", row.startswith("vitlarge_compiled")))
                rates.append(
                    Rate(
                        t["model"],
                        int(t["image_size"]),
                        v["precision"],
                        compiled,
                        "off",
                        v["images_per_s"],
                        f"train.{row}",
                    )
                )
    for name, v in (result.get("large") or {}).items():
        if v.get("images_per_s"):
            rates.append(
                Rate(
                    v["model"],
                    int(v["image_size"]),
                    v["precision"],
                    False,
                    recompute_of(v),
                    v["images_per_s"],
                    f"large.{name}",
                )
            )
    return rates


def load_results(path: Path | None) -> dict:
    p = path or DEFAULT_RESULTS
    try:
        result = json.loads(p.read_bytes()[: 16 * 2**20])
    except FileNotFoundError:
        raise UserError(
            f"--gpu: no GPU kit results at {p}; run python -m benchmarks.gpu on a GPU (it writes benchmarks/results/"
            "gpu.json) or pass --gpu-results FILE"
        ) from None
    except ValueError:
        raise UserError(f"--gpu-results {p}: not JSON; give a gpu.json the GPU kit wrote") from None
    if not isinstance(result, dict) or result.get("device", {}).get("type") != "cuda" or not measured_rates(result):
        raise UserError(f"--gpu-results {p}: no training row measured on a CUDA device; give a GPU run's gpu.json")
    return result


@dataclass(frozen=True)
class PhaseTime:
    index: int
    steps: int
    global_batch: int
    images_per_s: float
    how: str
    compute_s: float
    allreduce_s: float

    @property
    def step_s(self) -> float:
        return self.compute_s + self.allreduce_s


def allreduce_seconds(world_size: int, params: int) -> tuple[float, str]:
    """One ring all-reduce of the fp32 gradients per optimizer step, and the words for it."""
    if world_size == 1:
        return 0.0, "no all-reduce at 1 GPU"
    where = "inside a node" if world_size <= GPUS_PER_NODE else "across nodes"
    volume = 2 * (world_size - 1) / world_size * params * GRAD_BYTES
    return volume / BUSBW[where], (
        f"ring all-reduce of {params * GRAD_BYTES / 1e6:.1f} MB of fp32 gradients, 2x{world_size - 1}/{world_size} of it "
        f"per GPU at {BUSBW[where] / 1e9:.0f} GB/s {where}"
    )


def pick(
    rates: list[Rate], model: str, size: int, precision: str, compiled: bool, recompute: str
) -> tuple[Rate, list[str]]:
    """The measured row closest to the asked setting, and what differs (the words the plan prints)."""

    def score(r: Rate) -> tuple:
        return (
            r.model != model,
            r.image_size != size,
            r.compiled != compiled,
            r.precision != precision,
            r.recompute != recompute,
        )

    best = min(rates, key=score)
    differs = []
    if best.model != model or best.image_size != size:
        differs.append(
            f"{model} at {size} px not measured: {best.model} at {best.image_size} px scaled by FLOPs per image"
        )
    if best.compiled != compiled:
        differs.append(
            f"{'compiled' if compiled else 'eager'} not measured: the {'compiled' if best.compiled else 'eager'} row"
        )
    if best.precision != precision:
        differs.append(f"{precision} not measured: the {best.precision} row")
    if best.recompute != recompute:
        differs.append(f"activation checkpointing {best.recompute} in the row")
    return best, differs


def estimate(
    cfg: Config, plan: Plan, precision: str, compiled: bool, kind: str, result: dict
) -> tuple[list[PhaseTime], list[str]]:
    """Per-phase step times on ``plan.world_size`` GPUs of ``kind``, and the lines that say where the figures
    come from."""
    from vitlarge.model.vit import describe_model  # lazy: keeps torch off train.py until the thread pools are sized

    rates = measured_rates(result)
    device = result["device"]["name"]
    measured_kind = kind_of(device)
    if kind == measured_kind:
        ratio, on = 1.0, f"measured on an {device}"
    else:
        src = measured_kind or "h100"
        ratio = DATASHEET[kind][1] / DATASHEET[src][1]
        on = (
            f"measured on an {device}; {DATASHEET[kind][0]} not measured: x {ratio:.2f}, the dense bf16 datasheet ratio "
            f"{DATASHEET[kind][0]} / {DATASHEET[src][0]} ({DATASHEET[kind][1]:g} / {DATASHEET[src][1]:g} TFLOP/s)"
        )
    params = describe_model(cfg)["params"]
    comm_s, comm_words = allreduce_seconds(plan.world_size, params)
    flops_of: dict[tuple[str, int], float] = {}

    def flops(model: str, size: int) -> float:
        if (model, size) not in flops_of:
            c = phase_config(cfg, plan.phases[0])
            c.model.name, c.data.image_size = model, size
            if model != cfg.model.name:
                c.model.kwargs = {}
            flops_of[(model, size)] = describe_model(c)["fwd_flops"]
        return flops_of[(model, size)]

    out, lines = [], [f"  images/s per GPU from the GPU kit ({on}; {result.get('finished_at', 'date not recorded')}):"]
    for ph in plan.phases:
        size = ph.image_size
        rate, differs = pick(rates, cfg.model.name, size, precision, compiled, cfg.train.activation_checkpointing)
        ips = rate.images_per_s * flops(rate.model, rate.image_size) / flops(cfg.model.name, size) * ratio
        how = (
            f"{rate.row} {rate.images_per_s:,.1f} img/s ({rate.precision}, {'compiled' if rate.compiled else 'eager'})"
        )
        how += "".join(f"; {d}" for d in differs)
        out.append(
            PhaseTime(ph.index, ph.steps, ph.global_batch, ips, how, ph.global_batch / (plan.world_size * ips), comm_s)
        )
        lines.append(f"    phase {ph.index} ({size} px): {ips:,.1f} img/s per GPU from {how}")
    lines.append(f"  all-reduce per step: {comm_s * 1e3:.1f} ms ({comm_words}; not overlapped: an upper bound)")
    return out, lines


def print_gpu_time(cfg: Config, plan: Plan, precision: str, compiled: bool, kind: str, results: Path | None) -> None:
    """The dry run's lines for ``--gpu KIND``: per phase and in total, wall time and GPU-hours."""
    if kind not in DATASHEET:
        raise UserError(f"--gpu {kind}: use one of {', '.join(KINDS)}")
    result = load_results(results)
    phases, lines = estimate(cfg, plan, precision, compiled, kind, result)
    wall = sum(p.steps * p.step_s for p in phases)
    print(
        f"gpu time (--gpu {kind}, {plan.world_size} GPUs, {precision}, {'compiled' if compiled else 'eager'}; "
        f"{results or DEFAULT_RESULTS}):"
    )
    for line in lines:
        print(line)
    for p in phases:
        share = p.allreduce_s / p.step_s if p.step_s else 0.0
        print(
            f"    phase {p.index}: {p.steps:,} steps x ({p.compute_s:.3f} s compute + {p.allreduce_s * 1e3:.1f} ms "
            f"all-reduce, {share:.1%}) = {p.steps * p.step_s / 3600:.2f} h"
        )
    print(
        f"  total: {wall / 3600:.2f} h wall, {wall * plan.world_size / 3600:,.1f} GPU-hours on {plan.world_size} "
        f"{DATASHEET[kind][0]} (training steps only: no evaluation, checkpoints or start-up)"
    )
