"""``--dry-run --gpu KIND``: a recipe's expected wall time and GPU-hours on ``--world-size`` GPUs of a kind, from the
images/s the GPU kit measured (``python -m benchmarks.gpu``: benchmarks/results/gpu.json in a checkout, or
``--gpu-results FILE``) and the communication model of docs/PERFORMANCE.md section 7.

Per phase: images/s per GPU from the kit's row for the phase's model, image size, precision and compile setting
(the closest row where that exact one was not measured, said so), scaled by training FLOPs per image where the
size or model differs, by the kit's own measured ratio between the precisions where only the other one was
measured in that setting, and where the kit ran on another kind of GPU by the lower of the two datasheet ratios
(dense bf16 TFLOP/s, HBM bandwidth: `kind_ratio`). A step is its compute (global batch /
(GPUs x images/s)) plus one ring all-reduce of the fp32 gradients, 2(n-1)/n x their bytes at 150 GB/s inside a
node (n <= 8), 20 GB/s across nodes, not overlapped with the backward: an upper bound for the training steps.
Then `vitlarge.run.run_costs`: the input pipeline that rate needs, the validation passes and checkpoints of the
recipe's schedule. Start-up and compilation are not counted. Each figure is said to be measured, scaled or
assumed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vitlarge import fileio
from vitlarge.checkpoint.trust.meta import is_number
from vitlarge.config.schema import IMAGE_SIZE, Config
from vitlarge.errors import UserError
from vitlarge.plan.plan import Plan, phase_config
from vitlarge.run.run_costs import PhaseRate, data_figures, forwards_per_step, pipeline_lines, run_costs, span

if TYPE_CHECKING:  # numpy, which the manifest module imports, stays off train.py --help
    from vitlarge.data.manifest import Manifest

DATASHEET = {  # dense bf16/fp16 tensor-core TFLOP/s (no 2:4 sparsity) and HBM TB/s, NVIDIA's datasheets
    "a100": ("A100 SXM4", 312.0, 2.039),  # the 80 GB board's HBM2e
    "h100": ("H100 SXM", 989.4, 3.35),
    "h200": ("H200 SXM", 989.4, 4.8),
    "b200": ("B200", 2250.0, 8.0),
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
    model_at: str = ""
    """The file and key that name ``model``, for the line that refuses a model vitlarge cannot build."""


def kind_of(name: str) -> str | None:
    """The kind (``h100``...) a CUDA device name is, None for others (``NVIDIA H200`` -> ``h200``)."""
    words = set(re.split(r"[\s\-_]+", name.upper()))
    for kind in ("b200", "h200", "h100", "a100"):
        if kind.upper() in words:
            return kind
    return None


def kind_ratio(kind: str, measured: str) -> tuple[float, str]:
    """The factor from a rate measured on a ``measured`` GPU to one on a ``kind``, and the words for it: the lower
    of the dense bf16 datasheet ratio and the HBM bandwidth ratio. A step's time is partly math and partly memory
    traffic, each scaling by its own ratio, so the step speeds up by at least the lower one: the time it gives is an
    upper bound. Scaled, not measured."""
    (name, tflops, hbm), (src, src_tflops, src_hbm) = DATASHEET[kind], DATASHEET[measured]
    compute, memory = tflops / src_tflops, hbm / src_hbm
    return min(compute, memory), (
        f"{name} not measured: scaled x {min(compute, memory):.2f}, the lower of its datasheet ratios to the "
        f"{src}: dense bf16 {tflops:g} / {src_tflops:g} TFLOP/s = {compute:.2f}, HBM {hbm:g} / {src_hbm:g} TB/s "
        f"= {memory:.2f}; the time an upper bound"
    )


def precision_ratio(rates: list[Rate], best: Rate, precision: str) -> tuple[float, str] | None:
    """Where ``best`` is in another precision than ``precision``: the kit's measured ratio between the two in a
    setting where it measured both (same model, size and recomputation; ``best``'s compile setting first), and
    the words for it. None where it measured no such pair."""
    same = [r for r in rates if (r.model, r.image_size, r.recompute) == (best.model, best.image_size, best.recompute)]
    for compiled in (best.compiled, not best.compiled):
        asked = [r for r in same if r.compiled == compiled and r.precision == precision]
        other = [r for r in same if r.compiled == compiled and r.precision == best.precision]
        if asked and other:
            a, b = asked[0], other[0]
            ratio = a.images_per_s / b.images_per_s
            return ratio, (
                f"{precision} not measured {'compiled' if best.compiled else 'eager'}: scaled x {ratio:.3f}, the kit's "
                f"{'compiled' if compiled else 'eager'} {precision} / {best.precision} ({a.row} {a.images_per_s:,.1f} / "
                f"{b.row} {b.images_per_s:,.1f} img/s)"
            )
    return None


def recompute_of(recipe: dict) -> str:
    """A kit recipe entry's ``activation_checkpointing``; an entry written before the key's rename records
    ``grad_checkpointing`` (true: ``full``)."""
    mode = recipe.get("activation_checkpointing")
    if mode in ("off", "full", "selective"):
        return mode
    return "full" if recipe.get("grad_checkpointing") is True else "off"


RESULTS_CAP = 16 << 20
"""The most bytes of a gpu.json read (the kit's is ~50 kB): a file from elsewhere never costs more."""
MAX_RATE = 1e9
"""The largest images/s per GPU a kit row may state: far above any ViT on any GPU; with the smallest, 1e-3, the
hours it gives stay a number to print."""
PRECISIONS = ("fp16", "bf16", "fp32")


def _refused(where: str, key: str, value: object, rule: str) -> UserError:
    return UserError(
        f"{where}: {key} is {str(value)[:80]}, not {rule}; the file was edited or damaged: give a gpu.json the GPU "
        "kit wrote"
    )


def _section(where: str, key: str, value: object) -> dict:
    """``value``, a JSON object, or the one line naming ``key``; a missing or null section is empty."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _refused(where, key, value, "a JSON object")
    return value


def _rate(
    where: str, key: str, label: str, row: dict, setting: dict, model: object, size: object, recompute: str
) -> Rate | None:
    """The `Rate` of kit row ``row`` (at ``key``; ``label``: its name in the printed lines) of ``model`` at ``size``
    px (``setting``: the keys of those two, for the lines), None where the row measured nothing (no images_per_s, or 0: a failed or skipped
    row). Each value checked before any figure is made of it: a file from elsewhere is data."""
    ips = row.get("images_per_s")
    if ips is None or ips == 0:
        return None
    if not (is_number(ips) and 1e-3 <= ips <= MAX_RATE):
        raise _refused(where, f"{key}.images_per_s", ips, f"a rate in images/s from 0.001 to {MAX_RATE:g}")
    if not isinstance(model, str) or not 0 < len(model) <= 200:
        raise _refused(where, setting["model"], model, "a timm model name")
    if not (isinstance(size, int) and not isinstance(size, bool) and IMAGE_SIZE.test(size)):
        raise _refused(where, setting["image_size"], size, f"an image side {IMAGE_SIZE.words}")
    precision = row.get("precision")
    if precision not in PRECISIONS:
        raise _refused(where, f"{key}.precision", precision, f"one of {', '.join(PRECISIONS)}")
    compiled = row.get("compiled", False)
    if not isinstance(compiled, bool):  # "false" is a true string: the row would be taken as compiled
        raise _refused(where, f"{key}.compiled", compiled, "true or false")
    return Rate(model, size, precision, compiled, recompute, float(ips), label, f"{where}: {setting['model']}")


def measured_rates(result: dict, where: str) -> list[Rate]:
    """The kit's training rows from its gpu.json: ``recipes`` (each recipe's configuration, eager and compiled)
    where the kit wrote them, and the older ``train`` (ViT-B/16) and ``large`` (L/16, H/14) sections. A value of
    another type or out of its range is one `UserError` naming ``where`` (the file) and its key."""
    rates: list[Rate | None] = []
    for name, r in _section(where, "recipes", result.get("recipes")).items():
        r = _section(where, f"recipes.{name}", r)
        at = {"model": f"recipes.{name}.model", "image_size": f"recipes.{name}.image_size"}
        for row, v in _section(where, f"recipes.{name}.rows", r.get("rows")).items():
            key = f"recipes.{name}.rows.{row}"
            v = _section(where, key, v)
            label = f"recipes.{name}.{row}"
            rates.append(_rate(where, key, label, v, at, r.get("model"), r.get("image_size"), recompute_of(r)))
    t = _section(where, "train", result.get("train"))
    at = {"model": "train.model", "image_size": "train.image_size"}
    for row, v in _section(where, "train.results", t.get("results")).items():
        if row.startswith("vitlarge"):
            v = _section(where, f"train.results.{row}", v)
            v = {**v, "compiled": v.get("compiled", row.startswith("vitlarge_compiled"))}
            key, label = f"train.results.{row}", f"train.{row}"
            rates.append(_rate(where, key, label, v, at, t.get("model"), t.get("image_size"), "off"))
    for name, v in _section(where, "large", result.get("large")).items():
        v = _section(where, f"large.{name}", v)
        at = {"model": f"large.{name}.model", "image_size": f"large.{name}.image_size"}
        v = {**v, "compiled": False}
        key = f"large.{name}"
        rates.append(_rate(where, key, key, v, at, v.get("model"), v.get("image_size"), recompute_of(v)))
    return [r for r in rates if r is not None]


def results_name(path: Path | None) -> str:
    """How the lines name the gpu.json read (``path``, or the checkout's)."""
    return f"--gpu-results {path or DEFAULT_RESULTS}"


def load_results(path: Path | None) -> dict:
    """The gpu.json at ``path`` (default: the checkout's), read up to `RESULTS_CAP` and checked (`measured_rates`,
    its ``device``): what the dry run's figures are made of."""
    p = path or DEFAULT_RESULTS
    where = results_name(p)
    try:
        result = json.loads(fileio.read_capped(p, RESULTS_CAP))
    except FileNotFoundError:
        raise UserError(
            f"--gpu: no GPU kit results at {p}; run python -m benchmarks.gpu on a GPU (it writes benchmarks/results/"
            "gpu.json) or pass --gpu-results FILE"
        ) from None
    except OSError as e:  # fileio.UnsafeFile among them: a FIFO, a folder, a file over the cap
        raise UserError(f"{where} {e.strerror}; give a gpu.json the GPU kit wrote") from None
    except (ValueError, RecursionError):
        raise UserError(f"{where}: not JSON; give a gpu.json the GPU kit wrote") from None
    if not isinstance(result, dict):
        raise UserError(f"{where}: no training row measured on a CUDA device; give a GPU run's gpu.json")
    device = _section(where, "device", result.get("device"))
    if device.get("type") != "cuda" or not measured_rates(result, where):
        raise UserError(f"{where}: no training row measured on a CUDA device; give a GPU run's gpu.json")
    if not isinstance(device.get("name"), str) or not 0 < len(device["name"]) <= 200:
        raise _refused(where, "device.name", device.get("name"), "the GPU's name")
    if kind_of(device["name"]) is None:  # scaled as an H100's: a slower GPU's rates, or a faster one's, said nothing
        raise UserError(
            f"{where}: measured on an {device['name'][:80]}, a GPU of none of the kinds whose datasheet figures scale "
            f"its rates ({', '.join(KINDS)}); run python -m benchmarks.gpu on one of them and give its gpu.json"
        )
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
    """The measured row closest to the asked setting, and what differs in model, size, compile setting and
    recomputation (the words the plan prints; `estimate` scales and words a precision that differs)."""

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
    if best.recompute != recompute:
        differs.append(f"activation checkpointing {best.recompute} in the row")
    return best, differs


def estimate(
    cfg: Config, plan: Plan, precision: str, compiled: bool, kind: str, result: dict, flops: ModelFlops, where: str
) -> tuple[list[PhaseTime], list[str]]:
    """Per-phase step times on ``plan.world_size`` GPUs of ``kind``, and the lines that say where the figures
    come from (``where``: the file ``result`` was read from, `results_name`)."""
    rates = measured_rates(result, where)
    device = result["device"]["name"]
    measured_kind = kind_of(device)
    when = result.get("finished_at", "date not recorded")
    if kind == measured_kind:
        ratio, on = 1.0, f"measured on an {device}, {when}"
    else:
        assert measured_kind is not None  # load_results refuses a GPU of another kind
        ratio, words = kind_ratio(kind, measured_kind)
        on = f"measured on an {device}, {when}; {words}"
    comm_s, comm_words = allreduce_seconds(plan.world_size, flops.params)
    out, lines = [], [f"  images/s per GPU from the GPU kit ({on}):"]
    for ph in plan.phases:
        size = ph.image_size
        rate, differs = pick(rates, cfg.model.name, size, precision, compiled, cfg.train.activation_checkpointing)
        try:
            measured = flops.forward(rate.model, rate.image_size)
        except UserError:  # its line names model.name and model.kwargs: keys of no recipe here
            raise UserError(
                f"{rate.model_at} is {rate.model[:80]}, not a ViT vitlarge builds at {rate.image_size} px; the file "
                "was edited or damaged: give a gpu.json the GPU kit wrote"
            ) from None
        ips = ratio * rate.images_per_s * measured / flops.forward(cfg.model.name, size)
        if rate.precision != precision:
            scaled = precision_ratio(rates, rate, precision)
            if scaled:
                ips *= scaled[0]
                differs.append(scaled[1])
            else:
                differs.append(f"{precision} not measured: the {rate.precision} row as it is")
        how = (
            f"{rate.row} {rate.images_per_s:,.1f} img/s ({rate.precision}, "
            f"{'compiled' if rate.compiled else 'eager'}; measured)"
        )
        how += "".join(f"; {d}" for d in differs)
        out.append(
            PhaseTime(ph.index, ph.steps, ph.global_batch, ips, how, ph.global_batch / (plan.world_size * ips), comm_s)
        )
        lines.append(f"    phase {ph.index} ({size} px): {ips:,.1f} img/s per GPU from {how}")
    lines.append(
        f"  all-reduce per step: {comm_s * 1e3:.1f} ms ({comm_words}, assumed bandwidth; not overlapped: an upper "
        "bound)"
    )
    return out, lines


class ModelFlops:
    """The recipe's parameter count and forward FLOPs per image of a model at a size, each counted once
    (`vitlarge.model.vit.describe_model` builds the model to count them)."""

    def __init__(self, cfg: Config, plan: Plan) -> None:
        self.cfg, self.plan, self._flops = cfg, plan, {}
        self.params = self._describe(cfg.model.name, cfg.data.image_size)["params"]

    def _describe(self, model: str, size: int) -> dict:
        from vitlarge.model.vit import describe_model  # lazy: keeps torch off train.py until the thread pools are sized

        c = phase_config(self.cfg, self.plan.phases[0])
        c.model.name, c.data.image_size = model, size
        if model != self.cfg.model.name:
            c.model.kwargs = {}
        info = describe_model(c)
        self._flops[(model, size)] = info["fwd_flops"]
        return info

    def forward(self, model: str, size: int) -> float:
        """Forward FLOPs per image of ``model`` at ``size`` px (the recipe's model with its kwargs, another
        without)."""
        if (model, size) not in self._flops:
            self._describe(model, size)
        return self._flops[(model, size)]


def gpu_time_lines(
    cfg: Config,
    plan: Plan,
    precision: str,
    compiled: bool,
    kind: str,
    results: Path | None,
    manifest: Manifest | None = None,
) -> list[str]:
    """The dry run's lines for ``--gpu KIND``: per phase and in total, wall time and GPU-hours of the training
    steps, the validation passes and the checkpoints, and the input pipeline each GPU needs (``manifest``: the
    data set's dataset.json where it is here, for its record sizes and validation count). docs/PERFORMANCE.md
    quotes them (benchmarks/report/performance.py)."""
    if kind not in DATASHEET:
        raise UserError(f"--gpu {kind}: use one of {', '.join(KINDS)}")
    result = load_results(results)
    flops = ModelFlops(cfg, plan)
    phases, lines = estimate(cfg, plan, precision, compiled, kind, result, flops, results_name(results))
    steps_s = sum(p.steps * p.step_s for p in phases)
    out = [
        f"gpu time (--gpu {kind}, {plan.world_size} GPUs, {precision}, {'compiled' if compiled else 'eager'}; "
        f"{results or DEFAULT_RESULTS}):",
        *lines,
    ]
    for p in phases:
        share = p.allreduce_s / p.step_s if p.step_s else 0.0
        out.append(
            f"    phase {p.index}: {p.steps:,} steps x ({p.compute_s:.3f} s compute + {p.allreduce_s * 1e3:.1f} ms "
            f"all-reduce, {share:.1%}) = {p.steps * p.step_s / 3600:.2f} h"
        )
    fastest = max(p.images_per_s for p in phases)
    data = data_figures(cfg, plan, manifest)
    out += pipeline_lines(fastest, plan.world_size, data, cfg.data.hw_decoder_load)
    rates = [
        PhaseRate(
            p.images_per_s,
            flops.forward(cfg.model.name, ph.image_size),
            flops.forward(cfg.model.name, ph.eval_size),
            forwards_per_step(cfg.train.activation_checkpointing),
        )
        for p, ph in zip(phases, plan.phases)
    ]
    costs = run_costs(cfg, plan, rates, flops.params, data.val_images)
    out += costs.lines
    wall = steps_s + costs.eval_s + costs.checkpoint_s
    out.append(
        f"  total: {wall / 3600:.2f} h wall, {wall * plan.world_size / 3600:,.1f} GPU-hours on {plan.world_size} "
        f"{DATASHEET[kind][0]} (training steps {span(steps_s)}, evaluation {span(costs.eval_s)}, checkpoints "
        f"{span(costs.checkpoint_s)}; not start-up or compilation)"
    )
    out.append(
        "  figures: measured: the kit's images/s (on its GPU, in its precision), the CPU decode rate; scaled: "
        "another GPU, precision, model or size, evaluation from training; assumed: network and checkpoint "
        "bandwidths; stated: ImageNet's bytes and validation images where its dataset.json is not here"
    )
    return out
