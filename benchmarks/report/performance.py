"""Regenerates docs/PERFORMANCE.md and docs/img/*.png from benchmarks/results/*.json.

    python -m benchmarks.report            # after python -m benchmarks.run (which calls it)

Contract: reads only the result files (a missing one becomes "not run" in the table), and the
scaling section is computed here from the constants below, so the document is reproducible from
the repository alone. Needs matplotlib (plots are skipped with a note if it is missing).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from benchmarks.gpu import report as gpu_report
from benchmarks.harness import results as harness_results
from benchmarks.report import compile_matrix
from vitlarge.config.load import load_config
from vitlarge.constants import IMAGENET_TRAIN_EXAMPLES
from vitlarge.plan.plan import make_plan
from vitlarge.run.gpu_hours import gpu_time_lines
from vitlarge.train.settings import plan_settings

DOCS = Path(__file__).resolve().parent.parent.parent / "docs"

# ---- Scaling on paper: the inputs, stated once ---------------------------------------------------
IMAGENET_TRAIN = IMAGENET_TRAIN_EXAMPLES
GLOBAL_BATCH = 32768
GPUS = (4, 8, 32, 128, 512)
# name -> (parameters (timm, 1000 classes), recipe micro-batch, training FLOPs relative to B/16)
MODELS = {
    "ViT-B/16": (86_567_656, 256, 1.0),
    "ViT-L/16": (304_326_632, 128, 3.5),  # 61.6 vs 17.6 GFLOPs forward per image
}
# Images/s per A100 for ViT-B/16: Colossal-AI's 78.58 h for 300 epochs on 4 GPUs is ~340 img/s per
# GPU; 660 is a well-tuned target (fused kernels, bf16, no accumulation overhead).
IMG_PER_S = {"Colossal-AI measured": 340, "well-tuned target": 660}
# Bus bandwidth a ring all-reduce gets per GPU (assumed, not measured here): NVLink inside an
# 8-GPU node, one 200 Gb/s InfiniBand port per GPU across nodes at ~80% efficiency.
BUSBW_GBPS = {"intra-node (NVLink)": 150.0, "inter-node (IB, 200 Gb/s per GPU)": 20.0}
GRAD_BYTES = 4  # fp32 gradients (fp32 master weights; autocast leaves grads in fp32)
DATA_SHARE = 0.05  # data loading may cost at most 5% of the step
DRY_RUNS = (("a100", 4), ("h100", 32))
"""The ``--dry-run --gpu KIND --world-size N`` of vit_b16 that section 7 and README.md quote
(tests/unit/run/test_gpu_hours.py checks that both print what the dry run prints)."""


def micro_accum(n: int, micro: int) -> tuple[int, int]:
    """The recipe's micro-batch unless n x micro exceeds the global batch; then fewer images per GPU."""
    micro = min(micro, GLOBAL_BATCH // n)
    return micro, GLOBAL_BATCH // (micro * n)


def ring_bytes(n: int, params: int) -> float:
    """Bytes each GPU sends (and receives) in one ring all-reduce of the gradients."""
    return 2 * (n - 1) / n * params * GRAD_BYTES


def scaling_rows() -> list[dict]:
    steps_per_epoch = IMAGENET_TRAIN // GLOBAL_BATCH
    rows = []
    for model, (params, micro0, rel) in MODELS.items():
        for n in GPUS:
            micro, accum = micro_accum(n, micro0)
            bw = BUSBW_GBPS["intra-node (NVLink)"] if n <= 8 else BUSBW_GBPS["inter-node (IB, 200 Gb/s per GPU)"]
            vol = ring_bytes(n, params)
            row = dict(
                model=model,
                gpus=n,
                micro=micro,
                accum=accum,
                allreduce_gb=vol / 1e9,
                allreduce_s=vol / (bw * 1e9),
                busbw=bw,
            )
            for label, ips in IMG_PER_S.items():
                step = GLOBAL_BATCH / (n * ips / rel)
                row[f"step_s[{label}]"] = step
                row[f"epoch_h[{label}]"] = steps_per_epoch * step / 3600
                row[f"comm_share[{label}]"] = row["allreduce_s"] / step
            rows.append(row)
    return rows


# ---- Helpers -------------------------------------------------------------------------------------


def _load(results: Path, name: str) -> dict | None:
    path = results / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def installed_torch() -> str:
    """The torch version requirements.txt pins: the stack a checkout installs (``make install``)."""
    for line in (DOCS.parent / "requirements.txt").read_text().splitlines():
        if line.split("#", 1)[0].strip().startswith("torch=="):
            return line.split("==", 1)[1].split("#", 1)[0].strip()
    return "?"


def _torch_of(d: dict | None) -> str | None:
    return ((d or {}).get("machine") or {}).get("torch")


def stamp(lines: list[str], d: dict | None, pinned: str) -> list[str]:
    """``lines`` (a section) with, under its title, the torch its figures were measured on, marked stale
    where that is not the installed stack's (the figures stay until the benchmark is rerun)."""
    measured = _torch_of(d)
    if not measured or not lines:
        return lines
    note = f"_Measured on torch {measured}._\n"
    if measured.split("+")[0] != pinned:
        note = (
            f"_Measured on torch {measured}; the installed stack is torch {pinned} (requirements.txt): these figures are "
            "stale until this benchmark is rerun (`python -m benchmarks.run --quick`)._\n"
        )
    return [lines[0], note, *lines[1:]]


def stacks_line(results: dict[str, dict | None], pinned: str) -> str:
    """Which torch (and CPU) each result file was measured on, grouped; the header's summary."""
    groups: dict[tuple[str, str], list[str]] = {}
    for name, d in sorted(results.items()):
        if _torch_of(d):
            groups.setdefault((_torch_of(d), d["machine"].get("cpu", "?")), []).append(name)
    parts = [
        f"torch {t} on {cpu} ({', '.join(names)})"
        + ("" if t.split("+")[0] == pinned else ": **stale**, measured before the move to torch " + pinned)
        for (t, cpu), names in sorted(groups.items())
    ]
    return (
        f"Stacks: the installed one is torch {pinned} (requirements.txt); the results were measured on "
        + "; ".join(parts)
        + ". Each section below names its torch; rerun `python -m benchmarks.run --quick` to refresh a stale one.\n"
    )


def _yes(ok: bool | None) -> str:
    return "not run" if ok is None else ("**met**" if ok else "**not met**")


def _fmt(x, digits=2) -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}f}"


def _plt():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        return plt
    except ImportError:
        return None


def _barh(plt, path: Path, labels, series: dict, xlabel: str, title: str, goal_line: float | None = None):
    import numpy as np

    fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(labels) * max(1, len(series)) / 1.4 + 1.4))
    y = np.arange(len(labels))
    h = 0.8 / len(series)
    for i, (name, values) in enumerate(series.items()):
        bars = ax.barh(y + (i - (len(series) - 1) / 2) * h, values, h, label=name)
        ax.bar_label(bars, fmt="%.3g", fontsize=7, padding=2)
    if goal_line is not None:
        ax.axvline(goal_line, color="k", ls="--", lw=1)
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    if len(series) > 1:
        ax.legend(fontsize=8, loc="lower right")
    ax.margins(x=0.15)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- Sections ------------------------------------------------------------------------------------


def data_section(d: dict | None, img: Path, plt) -> tuple[list[str], list[tuple]]:
    if not d:
        return ["## 1. Data loading\n", "not run\n"], [
            ("Data: DALI train loader vs torchvision", ">= 2x", "not run", None),
            ("Data: % of decode-only", ">= 60%", "not run", None),
        ]
    w, c = d["images_per_s_median"], d.get("images_per_cpu_s_median", {})
    ratio, ratio_c = d["trainloader_vs_torchvision"], d.get("trainloader_vs_torchvision_per_cpu_s")
    pct, pct_c = d["trainloader_pct_of_decode_only"], d.get("trainloader_pct_of_decode_only_per_cpu_s")
    if plt:
        names = list(w)
        series = {"images / wall s": [w[k] for k in names]}
        if c:
            series["images / CPU s"] = [c.get(k, 0) for k in names]
        _barh(
            plt,
            img / "data.png",
            names,
            series,
            "images/s (higher is better)",
            f"Train input, batch {d['batch_size']} at {d['image_size']} px, {d['threads_or_workers']} threads/workers",
        )
    lines = [
        "## 1. Data loading\n",
        f"`benchmarks/bench_data.py`: {d['batch_size']}-image batches at {d['image_size']} px with random-resized-crop, "
        f"flip and normalisation, {d['threads_or_workers']} DALI threads vs {d['threads_or_workers']} DataLoader workers, "
        f"{d['repeats']} interleaved repeats of {d['timed_batches']} batches (medians). Load average at the end: "
        f"{_fmt(d['load_average_at_end'][0], 1)}.\n",
        "| contender | images/s (wall) | images per CPU-second |",
        "|---|---:|---:|",
    ]
    lines += [f"| `{k}` | {w[k]:.0f} | {c.get(k, float('nan')):.0f} |" for k in w]
    lines += [
        "",
        f"DALI train loader vs torchvision: **{ratio:.2f}x** wall, **{_fmt(ratio_c)}x** per CPU-second; "
        f"{pct:.0f}% of decode-only wall ({_fmt(pct_c, 0)}% per CPU-second).\n",
        "![data](img/data.png)\n",
    ]
    goals = [
        (
            "Data: DALI train loader vs torchvision",
            ">= 2x",
            f"{ratio:.2f}x wall, {_fmt(ratio_c)}x per CPU-s",
            ratio >= 2 or (ratio_c or 0) >= 2,
        ),
        (
            "Data: % of decode-only",
            ">= 60%",
            f"{pct:.0f}% wall, {_fmt(pct_c, 0)}% per CPU-s",
            pct >= 60 or (pct_c or 0) >= 60,
        ),
    ]
    return lines, goals


def convert_section(d: dict | None, img: Path, plt):
    if not d:
        return ["## 2. Conversion\n", "not run\n"], [("Conversion vs `cp -r`", ">= 0.5x", "not run", None)]
    mb = d["mb_per_s"]
    if plt:
        _barh(
            plt,
            img / "convert.png",
            list(mb),
            {"MB/s of source JPEGs": list(mb.values())},
            "MB/s (higher is better)",
            f"ImageNet folder -> TFRecord, {d['images']} JPEGs ({d['source_mb']} MB), {d['workers']} workers",
        )
    r = d["ratio_vs_cp"]["convert header-check"]
    lines = [
        "## 2. Conversion\n",
        f"`benchmarks/bench_convert.py`: {d['images']} JPEGs ({d['source_mb']} MB, page-cached), {d['workers']} workers, "
        f"{d['repeats']} interleaved repeats (medians). The converter fsyncs every shard; `cp -r` is followed by `sync`.\n",
        "| contender | median s | MB/s | vs `cp -r` |",
        "|---|---:|---:|---:|",
    ]
    lines += [
        f"| `{k}` | {d['median_seconds'][k]:.2f} | {mb[k]:.1f} | {d['ratio_vs_cp'].get(k, 1.0):.2f}x |" for k in mb
    ]
    lines += ["", "![convert](img/convert.png)\n"]
    return lines, [("Conversion (header check) vs `cp -r`", ">= 0.5x", f"{r:.2f}x", r >= 0.5)]


def parquet_section(d: dict | None) -> tuple[list[str], list[tuple]]:
    """``benchmarks/bench_parquet.py``: a Hugging Face parquet set copied into TFRecords against ``cp -r`` of its
    files, per set, with the folder converter on the same images beside it."""
    goal = ("Parquet -> TFRecord copy vs `cp -r`", ">= 0.8x")
    if not d:  # not in benchmarks.run's suite: no section and no goal row rather than "not run" (as section 9)
        return [], []
    lines = [
        "### Hugging Face parquet\n",
        f"`benchmarks/bench_parquet.py`: each set written as the Hub lays it out (`data_tools.make_parquet_dataset`: 4 "
        f"files a split, 100 rows a row group), page-cached; `python -m data_tools.imagenet_to_tfrecord --src <parquet "
        f"folder>` with {d['workers']} workers, 16 training and 2 validation shards, against `cp -r` of the same parquet "
        f"files and the folder converter on the same images; {d['repeats']} interleaved repeats (medians; MB/s of the "
        f"parquet files). Machine: {d.get('machine', {}).get('cpu', 'n/a')}, {d['cpu_count']} CPUs, shared (load average "
        f"{d['load_average_at_end'][0]:.1f} at the end).\n",
        "| set | MB | contender | median s | MB/s | vs `cp -r` | vs `cp -r + sync` | CPU s |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    worst, measured = None, []
    for name, r in d["sets"].items():
        cpu = r.get("median_cpu_seconds", {})
        for k, mb in r["mb_per_s"].items():
            ratio, synced = r["ratio_vs_cp"].get(k, 1.0), r["ratio_vs_cp_sync"].get(k, 1.0)
            lines.append(
                f"| {name} | {r['source_mb']} | `{k}` | {r['median_seconds'][k]:.2f} | {mb:.1f} | {ratio:.2f}x | "
                f"{synced:.2f}x | {f'{cpu[k]:.2f}' if k in cpu else 'n/a'} |"
            )
        parquet = r["ratio_vs_cp"]["convert parquet"]
        worst = parquet if worst is None else min(worst, parquet)
        measured.append(f"{name} {parquet:.2f}x ({r['ratio_vs_cp_sync']['convert parquet']:.2f}x of `cp -r + sync`)")
    lines += [
        "",
        _parquet_floor_note(d),
    ]
    return lines, [(*goal, ", ".join(measured), worst is not None and worst >= 0.8)]


def _parquet_floor_note(d: dict) -> str:
    """What section 2's parquet table shows: the goal against the floor of any copy through pyarrow, and what the
    plain read saves."""
    big = d["sets"].get("imagenet-shaped") or next(iter(d["sets"].values()))
    floor, dictionary, ratio, synced = (
        "pyarrow floor",
        "convert parquet, dictionary read",
        big["ratio_vs_cp"],
        big["ratio_vs_cp_sync"],
    )
    cpu = big["median_cpu_seconds"]
    if floor not in ratio or dictionary not in cpu:  # a result from before these were measured
        return "Not met.\n"
    of_floor = big["median_seconds"][floor] / big["median_seconds"]["convert parquet"]
    saved = 1 - cpu["convert parquet"] / cpu[dictionary]
    rate = big["source_mb"] / cpu["convert parquet"]
    return (
        "Not met, and out of reach of any copy through pyarrow on this machine: the floor of one (`pyarrow floor`, "
        "`benchmarks/parquet_floor.py`: the converter's own reader, its two CRC32Cs, the writes and fsyncs, with "
        f"nothing else) runs at {ratio[floor]:.2f}x of `cp -r` and {synced[floor]:.2f}x of `cp -r + sync` on the "
        f"ImageNet-shaped set, and the converter at {of_floor:.2f}x of that floor. `cp -r` moves page-cached bytes "
        "inside the kernel, in one process with nothing to start; a Python copy starts an interpreter and pyarrow "
        "(~0.2 s) and brings each image through user space. What the converter adds to the floor: the JPEG header "
        "checks, the `tf.train.Example` framing (`tfrecord_io.example_parts`), the seeded shuffle, the validation "
        "split spilled once to sort it by aspect ratio, the DALI index and the done-records. `CPU s` is the user + "
        "system time of the processes a contender ran (the converter's workers included). The image bytes are "
        "read plain where the file stores them so (`datasets`' writer: uncompressed, no dictionary page; "
        "`parquet_source.plain_bytes`) and dictionary-encoded elsewhere, where a value many rows share is then held "
        f"once; `{dictionary}` is the same command with every row group read so: read plain, the whole copy takes "
        f"{saved:.0%} less CPU. At ImageNet's size (140 GB) Python's start-up vanishes and the copy's rate is what "
        f"its workers do: {rate:.0f} MB per CPU-second here (page-cached, start-up included), so 16 workers would "
        f"copy ~{16 * rate / 1000:.1f} GB/s where the disks keep up: a projection from this 2-core machine, not a "
        "measurement. What the copy saves is the other side of the ledger: no second copy of ImageNet as JPEG "
        "files, no decode, one write.\n"
    )


def train_section(d: dict | None, img: Path, plt):
    if not d:
        return ["## 3. Training loop and MFU\n", "not run\n"], [
            ("Train loop vs bare PyTorch", ">= 0.97x", "not run", None),
            ("MFU (bf16)", ">= 30%", "not run", None),
        ]
    r, m = d["results"], d["mfu"]
    th = d["threads"]
    if plt:
        names = list(r)
        _barh(
            plt,
            img / "train.png",
            names,
            {
                "wall s / step": [r[k]["step_s"]["median"] for k in names],
                "CPU s / step / threads": [r[k]["cpu_s_per_step"]["median"] / th for k in names],
            },
            "seconds per optimizer step (lower is better)",
            f"{d['model']} {d['image_size']} px, micro-batch {d['micro_batch']}, {d['precision']}",
        )
        frac = m["profile"]["fraction"]
        _barh(
            plt,
            img / "mfu_profile.png",
            list(frac),
            {"share of step time": [100 * v for v in frac.values()]},
            "% of one bare bf16 step (torch.profiler self time)",
            "Where the bf16 training step's time goes",
        )
    peak = m["peak"]
    lines = [
        "## 3. Training loop and MFU\n",
        f"`benchmarks/bench_train.py`: `{d['model']}` at {d['image_size']} px ({d['micro_batch']} images per step, "
        f"{d['precision']} autocast, LAMB, clip 1.0, {th} threads), fed from the same in-memory tensors on both sides. "
        "`vitlarge` is train.py's path: Booster(TorchDDPPlugin) on a gloo group of 1, `Engine`, `Trainer.fit` with the "
        "default hooks (metrics.jsonl, TensorBoard, NaN guard) and the per-step loss all-reduce. `bare` is model + "
        f"autocast + GradScaler + `clip_grad_norm_` + `step()`. {d['rounds']} interleaved rounds of "
        f"{d['steps_per_round']} steps after a warm-up step; medians of the per-round mean.\n",
        "| loop | s/step (wall) | CPU s/step | images/s (wall) | images/s (CPU time / threads) |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| `{k}` | {v['step_s']['median']:.3f} | {v['cpu_s_per_step']['median']:.3f} | {v['images_per_s']:.1f} | "
        f"{v['images_per_s_cpu']:.1f} |"
        for k, v in r.items()
    ]
    lines += [
        "",
        f"vitlarge / bare: **{d['speed_vs_bare']:.3f}x** wall, **{d['speed_vs_bare_cpu']:.3f}x** by CPU time.\n",
        "![train](img/train.png)\n",
        "### MFU on this CPU\n",
        f"FLOPs of one training step (forward + backward, `FlopCounterMode`): {m['train_flops_per_step'] / 1e9:.1f} GFLOP "
        f"(3x forward: {m['three_x_forward_flops'] / 1e9:.1f}). Matmuls are {100 * m['model_matmul_share_of_flops']:.0f}% "
        f"of them, of which attention's (SDPA) {100 * m['attention_share_of_flops']:.1f}% of the total.\n",
        "| | FLOP/s (wall) | FLOP/s (per CPU-second x threads) |",
        "|---|---:|---:|",
        f"| bf16 matmul {peak['bf16']['n']}^3 (peak) | {peak['bf16']['flops_per_s'] / 1e9:.0f} G | "
        f"{peak['bf16']['flops_per_cpu_s_x_threads'] / 1e9:.0f} G |",
        f"| fp32 matmul {peak['fp32']['n']}^3 | {peak['fp32']['flops_per_s'] / 1e9:.0f} G | "
        f"{peak['fp32']['flops_per_cpu_s_x_threads'] / 1e9:.0f} G |",
        f"| bf16 training step (vitlarge) | {m['achieved_flops_per_s'] / 1e9:.0f} G | "
        f"{m['achieved_flops_per_cpu_s_x_threads'] / 1e9:.0f} G |",
        f"| the step's own matmuls (profiled bare step) | {_fmt((m['model_matmul_flops_per_s'] or 0) / 1e9, 0)} G | |",
        "",
        f"MFU vs bf16 matmul: **{100 * m['mfu_vs_bf16_matmul']:.0f}%** wall, "
        f"**{100 * m['mfu_vs_bf16_matmul_cpu']:.0f}%** by CPU time "
        f"({100 * m['mfu_vs_fp32_matmul_cpu']:.0f}% of the fp32 matmul rate).\n",
        "| share of the bf16 step (profiler self time) | % |",
        "|---|---:|",
    ]
    lines += [f"| {k} | {100 * v:.1f} |" for k, v in m["profile"]["fraction"].items()]
    frac = m["profile"]["fraction"]
    bf16_vs_fp32 = peak["bf16"]["flops_per_cpu_s_x_threads"] / peak["fp32"]["flops_per_cpu_s_x_threads"]
    lines += [
        "",
        "![mfu](img/mfu_profile.png)\n",
        f"Why it is what it is: {100 * frac.get('matmul', 0):.0f}% of the step is matmul, running at about the rate "
        "of the large bf16 matmul, so the bf16 MFU is high; the rest is elementwise and autograd work "
        f"({100 * frac.get('other (elementwise, autograd)', 0):.0f}%), autocast's casts "
        f"({100 * frac.get('casts and copies', 0):.0f}%), GELU, layer norm and the optimizer, each a few percent. "
        "Attention is small at 37 tokens. But the reference is low: this CPU has AVX512-BF16 and no AMX, so a bf16 "
        f"matmul runs at {100 * bf16_vs_fp32:.0f}% of the fp32 rate, and against the fp32 matmul rate the bf16 step "
        f"reaches {100 * m['mfu_vs_fp32_matmul_cpu']:.0f}%. On this CPU bf16 is slower than fp32 (section 6); on a GPU "
        "(tensor cores) or an AMX CPU the order reverses. No cheap fix is left on the framework side: the loop "
        "already matches the bare one, and the matmuls run at the machine's bf16 rate.\n",
    ]
    mfu = max(m["mfu_vs_bf16_matmul"], m["mfu_vs_bf16_matmul_cpu"])
    goals = [
        (
            "Train loop vs bare PyTorch",
            ">= 0.97x",
            f"{d['speed_vs_bare']:.3f}x wall, {d['speed_vs_bare_cpu']:.3f}x CPU",
            d["speed_vs_bare"] >= 0.97 or d["speed_vs_bare_cpu"] >= 0.97,
        ),
        (
            "MFU, bf16 step vs bf16 matmul",
            ">= 30%",
            f"{100 * m['mfu_vs_bf16_matmul']:.0f}% wall, {100 * m['mfu_vs_bf16_matmul_cpu']:.0f}% CPU",
            mfu >= 0.30,
        ),
    ]
    return lines, goals


def optimizer_section(d: dict | None, img: Path, plt):
    if not d:
        return ["## 4. Optimizer\n", "not run\n"], [("LAMB vs Colossal-AI's", ">= 3x", "not run", None)]
    r = d["results"]
    if plt:
        _barh(
            plt,
            img / "optimizer.png",
            list(r),
            {"wall ms": [v["median_ms"] for v in r.values()], "CPU ms": [v["median_cpu_ms"] for v in r.values()]},
            "ms per optimizer step (lower is better)",
            f"Optimizer step on ViT-B/16's {d['num_params'] / 1e6:.1f}M parameters",
        )
    lines = [
        "## 4. Optimizer\n",
        f"`benchmarks/bench_optimizer.py`: one step over ViT-B/16's {d['num_params']:,} parameters in {d['num_tensors']} "
        f"tensors, fp32, {d['repeats']} interleaved repeats (medians).\n",
        "| optimizer | ms (wall) | ms (CPU) | vs Colossal-AI's LAMB (wall / CPU) |",
        "|---|---:|---:|---:|",
    ]
    lines += [
        f"| `{k}` | {v['median_ms']:.0f} | {v['median_cpu_ms']:.0f} | {v['speedup_vs_colossalai']:.2f}x / "
        f"{v['cpu_speedup_vs_colossalai']:.2f}x |"
        for k, v in r.items()
    ]
    lines += ["", "![optimizer](img/optimizer.png)\n"]
    lines += optimizer_floor_lines(d)
    ours = r["vitlarge_lamb"]
    s = max(ours["speedup_vs_colossalai"], ours["cpu_speedup_vs_colossalai"])
    return lines, [
        (
            "Our LAMB vs Colossal-AI's",
            ">= 3x",
            f"{ours['speedup_vs_colossalai']:.2f}x wall, {ours['cpu_speedup_vs_colossalai']:.2f}x CPU",
            s >= 3,
        )
    ]


def comm_section(d: dict | None, img: Path, plt):
    if not d:
        return ["## 5. Communication\n", "not run\n"], [
            ("All-reduces per step independent of accumulation", "= buckets", "not run", None)
        ]
    steady = d["steady_per_step"]
    accs = sorted(steady, key=int)
    if plt:
        import numpy as np

        fig, ax = plt.subplots(figsize=(6.5, 3.2))
        x = np.arange(len(accs))
        vs = (d.get("vit_s16_32px") or {}).get("steady_per_step")
        w = 0.8 / (3 if vs else 2)
        ax.bar(x - w, [int(a) for a in accs], w, label="micro-steps (forward/backward) per optimizer step")
        ax.bar(x, [steady[a]["calls"] for a in accs], w, label="all-reduce calls per step, demo model (1 bucket)")
        if vs:
            ax.bar(
                x + w,
                [vs[a]["calls"] for a in accs],
                w,
                label=f"all-reduce calls per step, ViT-S/16 ({d['vit_s16_32px']['predicted_buckets']} buckets)",
            )
        ax.set_yscale("log")
        ax.set_xticks(x, [f"accumulation {a}" for a in accs])
        ax.set_title(f"Gradient all-reduces per optimizer step, {d['world_size']} gloo processes", fontsize=10)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(img / "comm.png", dpi=110)
        plt.close(fig)
    demo = d["demo_model"]
    lines = [
        "## 5. Communication\n",
        f"`benchmarks/bench_comm.py`: {d['world_size']} real gloo processes (`torch.multiprocessing.spawn`), the Engine as "
        f"train.py builds it (bucket cap {d['bucket_cap_mb']} MB), {d['steps']} optimizer steps per accumulation; the "
        "Engine's `CommCounter` DDP comm hook counts calls and bytes. The Trainer adds one 8-byte all-reduce per step "
        "(loss and stop flag).\n",
        "| model | accumulation | all-reduce calls per step (each step) | bytes per step |",
        "|---|---:|---|---:|",
    ]
    for a in accs:
        lines.append(
            f"| demo ({demo['params']:,} params) | {a} | {steady[a]['calls']} ({d['measured'][a]['calls_per_step']}) | "
            f"{steady[a]['bytes']:,} |"
        )
    vs = d.get("vit_s16_32px")
    if vs:
        for a in accs:
            lines.append(
                f"| ViT-S/16, 32 px ({vs['params']:,} params) | {a} | {vs['steady_per_step'][a]['calls']} "
                f"({vs['measured'][a]['calls_per_step']}) | {vs['steady_per_step'][a]['bytes']:,} |"
            )
    for name, c in d["computed"].items():
        lines.append(f"| {name} ({c['params']:,} params; computed) | any | {c['buckets']} | {c['bytes_per_step']:,} |")
    lines += [
        "",
        f"Calls independent of accumulation: **{d['calls_independent_of_accumulation']}**; DDP's bucket assignment "
        f"computed for the measured models ({demo['predicted_buckets']} bucket for the demo"
        + (f", {vs['predicted_buckets']} for ViT-S/16" if vs else "")
        + ") matches the measured count: "
        f"**{d['prediction_matches_measurement']}**. ViT-B/16 and ViT-L/16 are computed with the same function "
        "(their bytes are the fp32 gradient bytes, whatever the bucketing). The very first step sends one all-reduce: DDP "
        "starts with a single bucket and rebuilds its buckets in gradient-ready order after it.\n",
        "![comm](img/comm.png)\n",
    ]
    ok = d["calls_independent_of_accumulation"] and d["prediction_matches_measurement"]
    got = f"demo {steady[accs[0]]['calls']}" + (f", ViT-S/16 {vs['steady_per_step'][accs[0]]['calls']}" if vs else "")
    return lines, [
        (
            "Gradient all-reduces per optimizer step",
            "= DDP buckets at any accumulation",
            f"{got} call(s) per step at accumulation {', '.join(accs)}",
            ok,
        )
    ]


DATASHEET_BANDWIDTH = {"H100 SXM": 3.35e12, "H200": 4.8e12}
"""HBM bandwidth from NVIDIA's datasheets, bytes/s: what the floor below is computed at (a copy reaches ~90%)."""


def optimizer_floor_lines(d: dict) -> list[str]:
    """The LAMB step's memory-traffic floor for ViT-B/16 (`benchmarks.bench_optimizer.traffic`), computed, with the
    GPU's measured step beside it where section 8 has one."""
    t = d.get("traffic")
    if not t:
        return []
    per, total = t["bytes_per_parameter"], t["vit_b16_bytes"]
    at = {gpu: {form: total[form] / bw * 1e3 for form in total} for gpu, bw in DATASHEET_BANDWIDTH.items()}
    rows = [
        f"| {form} | {per[form]} | {total[form] / 1e9:.2f} GB | "
        + " | ".join(f"{at[gpu][form]:.2f} ms" for gpu in DATASHEET_BANDWIDTH)
        + " |"
        for form in per
    ]
    return [
        "The step's memory-traffic floor (computed, `benchmarks.bench_optimizer.LAMB_BYTES_PER_PARAMETER`): a step "
        "with two fp32 moments reads weight, gradient and both moments once and writes weight and moments once, 28 "
        "bytes per parameter. LAMB needs a second pass (its trust ratio needs the norm of each whole update before any "
        "weight changes): the `compiled` form moves 40 bytes (moments and norms; then the update, the direction "
        "recomputed), the eager forms (`chunked`, `foreach`) 56 (the direction stored, the fused Adam kernel, two norms, "
        "the update). At the datasheets' HBM bandwidth, for ViT-B/16's parameters:\n",
        "| form | bytes per parameter | ViT-B/16 | " + " | ".join(DATASHEET_BANDWIDTH) + " |",
        "|---|---:|---:|" + "---:|" * len(DATASHEET_BANDWIDTH),
        *rows,
        "",
        "On a GPU the step is measured against it: each form's step time (`optim.implementation`; section 8's "
        "`vitlarge_lamb` row is the chunked form) beside the floor at the bandwidth a device-to-device copy reaches on "
        "that GPU, `benchmarks.bench_optimizer.floor_ms`.\n",
    ]


def launch_section(d: dict | None):
    """srun vs colossalai run (benchmarks/bench_launch.py, run on its own: it needs root and Slurm);
    nothing when it has no result."""
    title = "## 9. srun vs colossalai run\n"
    if not d:  # not in benchmarks.run's suite: no section rather than a "not run" one
        return [], []
    im, cpu = d["images_per_s"], d["images_per_cpu_s"]
    lines = [
        title,
        f"`benchmarks/bench_launch.py` (needs root and Slurm; not part of `benchmarks.run`): the demo recipe, "
        f"{d['processes']} processes on the same {d['cores']} cores, {d['steps']} steps per run; images/s = median "
        "of the steps after the second; images per CPU-second = those steps' images over the CPU time the workers "
        f"spent in them; {d['repeats']} interleaved rounds (medians). Machine: {d['machine']['cpu']}, "
        f"{d['machine']['os_cpus']} CPUs, load average at the end {d['machine']['load_average'][0]}.\n",
        "| contender | images/s | images per CPU-s | every round (images/s) |",
        "|---|---:|---:|---|",
    ]
    names = {
        "srun": "`srun -N 1 -n 2` (pools sized by vitlarge.distributed.process)",
        "colossalai": "`colossalai run --nproc_per_node 2`",
        "srun_full_pools": "`srun -N 1 -n 2`, OMP_NUM_THREADS = all cores (the pools before)",
    }
    lines += [
        f"| {names.get(n, n)} | {v['median']} | {cpu[n]['median']} | {', '.join(str(x) for x in v['all'])} |"
        for n, v in im.items()
    ]
    lines += [
        "",
        f"srun / colossalai run: **{d['srun_vs_colossalai']:.2f}x** wall, "
        f"**{d['srun_vs_colossalai_cpu']:.2f}x** per CPU-second.\n",
    ]
    return lines, [
        (
            "srun vs colossalai run, demo on 2 processes",
            ">= 0.9x",
            f"{d['srun_vs_colossalai']:.2f}x wall, {d['srun_vs_colossalai_cpu']:.2f}x CPU",
            d["met"],
        )
    ]


def tfds_section(d: dict | None) -> tuple[list[str], list[tuple]]:
    """TFDS read in place against the converter's TFRecords of the same images (benchmarks/bench_tfds.py, run on its
    own); nothing when it has no result."""
    if not d:
        return [], []
    im, cpu, ratio, ratio_cpu = (
        d["images_per_s_median"],
        d["images_per_cpu_s_median"],
        d["tfds_vs_tfrecord"],
        d["tfds_vs_tfrecord_per_cpu_s"],
    )
    sizes = d["image_size"]
    lines = [
        "## 14. TFDS read in place\n",
        "`benchmarks/bench_tfds.py` (not part of `benchmarks.run`): `vitlarge.data.TrainLoader` as train.py builds it "
        f"(random-resized crop, flip, normalize; batch {d['batch_size']}, {d['threads']} DALI threads) from the "
        "converter's TFRecords and from the same images in TFDS's layout (`data_tools.tfds_layout.tfds_from_tfrecords`: "
        "the same JPEG bytes, shards and order; TFDS's names, features and dataset_info.json) read in place through "
        f"`make_index --out`; {d['repeats']} interleaved rounds, each a loader made afresh timed over "
        + ", ".join(f"{n} batches of {k}" for k, n in d.get("timed_batches_per_set", {}).items())
        + f" (medians). Machine: "
        f"{d['machine']['cpu']}, {d['machine']['os_cpus']} CPUs, shared with other work (load average at the end "
        f"{d['machine']['load_average'][0]}): read the per-CPU-second column.\n",
        "| set | image size | TFRecords images/s | TFDS images/s | TFDS / TFRecords | per CPU-s: TFRecords | TFDS | TFDS / TFRecords |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {n} | {sizes[n]} | {im[n + '_tfrecord']} | {im[n + '_tfds']} | **{ratio[n]:.2f}x** | "
        f"{cpu[n + '_tfrecord']} | {cpu[n + '_tfds']} | **{ratio_cpu[n]:.2f}x** |"
        for n in ratio
    ]
    mi = d.get("make_index_imagenet_shaped")
    if mi:
        lines += [
            "",
            f"`make_index --workers 1` of the ImageNet-shaped TFDS folder ({mi['records']:,} records, {mi['mb']} MB; "
            f"every byte read once, each JPEG header through PIL): {mi['seconds']} s, {mi['records_per_s']} records/s, "
            f"{mi['mb_per_s']} MB/s on one core; at that rate TFDS's ImageNet (~155 GB) takes ~"
            f"{mi['imagenet_minutes_one_core']} minutes on one core, divided by `--workers` (where the disk keeps up).",
        ]
    lines.append("")
    worst = min(min(ratio[n], ratio_cpu[n]) for n in ratio)
    best = min(max(ratio[n], ratio_cpu[n]) for n in ratio)
    return lines, [("TFDS in place vs its TFRecords, images/s", ">= 0.95x", f"{worst:.2f}-{best:.2f}x", d["met"])]


COMPILE_NOTES = [
    "What `train.compile=on` does and guarantees (`vitlarge/train/assemble.py`, tests/unit/train/test_compile.py): the model's forward is "
    "compiled in place (`nn.Module.compile`, before the Booster), so parameter names, checkpoints, the export and "
    "`model.init_from` are the plain model's; shapes are static (`dynamic=False`): one graph per phase for training and "
    "two for evaluation (full and last partial batch), compiled once each and reused (a 2-phase run with 3 evaluations: "
    "4 graphs), Dynamo's recompile limit raised to 3 per phase + 2. Compiled and eager fp32 losses of a 1-block ViT agree "
    "to 1e-4 over 300 steps (2.4e-7 measured; not bitwise: Inductor reorders the norms' and softmax's reductions); a compiled run stopped "
    "and resumed equals an uninterrupted compiled run bit for bit; DDP over 2 gloo processes wraps the compiled module.\n",
    "`train.compile=auto` is off on CPU (the table: no faster here, and minutes of compiling) and on with CUDA, where "
    "Inductor fuses the LayerNorms, GELUs, residual adds and casts between the matmuls; the GPU kit's "
    "`vitlarge_compiled_bf16` row (section 8) measures it when a GPU is lent.\n",
    "`train.compile_scope` says what is compiled: `model` (the whole forward, one graph) or `blocks` (each transformer "
    "block on its own, before the Booster and so before FSDP shards it: torchtitan's `apply_compile` order; the patch "
    "embedding, tokens, final norm and head stay eager). The blocks share their graphs (one per input shape and mode, "
    "as the whole model has) and keep the plain model's parameter names. `auto` is `blocks` under fsdp, where a "
    "whole-model graph breaks at every block (the table below), and `model` under ddp, the form measured on the H200; "
    "per block, DDP's buckets all-reduce while the earlier blocks still run their backward (one backward graph per "
    "block instead of one for the model), against the fusion of the edges: which is faster is the GPU kit's to "
    "measure, with `train.compile_scope=blocks`.\n",
]


def compile_matrix_section(d: dict | None) -> list[str]:
    """Section 10's second half: every combination the recipes turn on, compiled (bench_compile_matrix)."""
    title = "### Combinations the recipes turn on, compiled, in train.py runs\n"
    if not d:  # not in benchmarks.run's suite: no section rather than a "not run" one (as section 9)
        return []
    return [title, *compile_matrix.table(d), *COMPILE_MATRIX_NOTES]


COMPILE_MATRIX_NOTES = [
    "Reading it: every combination trains, resumes bit for bit after `kill -9` (losses after the resume and the exported "
    "weights), and follows eager's losses well inside the tolerance (`TOLERANCE` in the benchmark: fp32 1e-4, the compile "
    "tests' bound; fp16 1e-2 and bf16 5e-2, a few units in the last place of the logits, allowing for Inductor keeping a "
    "fused elementwise chain in fp32 where eager rounds each result). No combination had to be refused. The data is "
    "random, so the loss stays near ln 10 = 2.30: the comparison checks that the compiled run follows eager's step by "
    "step, not that it learns (tests/e2e/test_compile_runs.py's 300-step fp32 comparison learns).\n",
    "DDP: 1 graph after step 1, 0 breaks; at the end 2 graphs and 1 recompile, the final evaluation's forward under "
    "`torch.no_grad` (guard `GLOBAL_STATE changed: grad_mode`); the counts the H200 gave for vit_b16's combination (ddp, "
    "fp16 with the scaler, deterministic). Activation checkpointing adds no break (Dynamo traces "
    "`torch.utils.checkpoint` as one higher-order op).\n",
    "FSDP, the whole model compiled: 2 graph breaks after step 1 and 4 at the end, on CPU as on the H200 (fsdp + checkpointing + bf16: 3 graphs, 2 "
    "breaks, then 6 graphs, 4 breaks, 4 recompiles: the H200's counts for vit_h14's combination on the demo model), so "
    "they are not the device's. Cause (`TORCH_LOGS=graph_breaks`, one run): FSDP2 runs the hooks of each `fully_shard`ed "
    "block (the pre-forward all-gather of its parameters, the post-forward reshard) outside Dynamo: "
    "`torch/distributed/fsdp/_fully_shard/_fsdp_state.py` wraps them in `torch._dynamo.disable` while "
    '`torch._dynamo.config.skip_fsdp_hooks` is True (the default), and Dynamo reports the call as "Attempted to call '
    'function marked as skipped" (function `disable`). Compiling the root over sharded blocks therefore splits its '
    "graph at the block boundary, in training and again in evaluation. The way out taken: compile each block before "
    "`fully_shard` (`train.compile_scope=blocks`, `auto` under fsdp; torchtitan's order), so the hooks sit between "
    "compiled regions: the `/blocks` rows.\n",
    "Step times: eager and compiled runs of a combination ran one after the other, not interleaved, on a CPU that "
    "other jobs loaded (load average 3 to 8 during the matrix): the ratios are rough. At this size a step is "
    "overhead (a few ms of matmuls): what compile removes (Python and autocast's casts) or adds (the graph breaks' "
    "trips through Python under FSDP) dominates it.\n",
]


def compile_section(d: dict | None) -> list[str]:
    title = "## 10. torch.compile\n"
    if not d:
        return [title, "not run\n"] + COMPILE_NOTES
    r = d["results"]
    lines = [
        title,
        f"`benchmarks/bench_compile.py`: {d['model']} at {d['image_size']} px, micro-batch {d['micro_batch']}, "
        f"{d['precision']}, LAMB, one process, {d['threads']} threads, engines built by `vitlarge.train.assemble.build` with "
        f"`train.compile` off and on; {d['rounds']} interleaved rounds of {d['steps_per_round']} step(s), medians. "
        f"Compiling ({d['graphs']} graph, forward and backward) took **{d['compile_s']:.0f} s** (the compiled "
        "engine's first step minus the eager one's). "
        f"Machine: {d['machine']['cpu']}, {d['machine']['os_cpus']} cores "
        f"({'AVX-512' if any(f.startswith('avx512') for f in d['machine']['cpu_flags']) else 'no AVX-512'}), torch "
        f"{d['machine']['torch']}; shared: load average {d['machine']['load_average'][1]} over the run's last 5 "
        "minutes (other jobs' tests), so the compile time is longer than on an idle machine and the step "
        "ratios are the figure to read.\n",
        "| contender | s/step (wall) | CPU s/step | images/s (wall) | vs eager (wall / CPU) | first step (s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| `{k}` | {v['step_s']['median']:.3f} | {v['cpu_s_per_step']['median']:.3f} | {v['images_per_s']:.1f} | "
        f"{v['speed_vs_eager']:.2f}x / {v['speed_vs_eager_cpu']:.2f}x | {v['first_step_s']:.1f} |"
        for k, v in r.items()
    ]
    return lines + [""] + COMPILE_NOTES


def recompute_section(d: dict | None) -> list[str]:
    """``train.activation_checkpointing`` off / full / selective side by side (bench_activation_checkpointing), run
    on its own: no section without a result."""
    if not d:
        return []
    m = d["machine"]
    lines = [
        "## 13. Activation checkpointing\n",
        f"`benchmarks/bench_activation_checkpointing.py`: {d['model']} at {d['image_size']} px, micro-batch "
        f"{d['micro_batch']}, {d['precision']}, attention and projection dropout and stochastic depth {d['dropout']}, "
        f"one process, the three modes interleaved over {d['rounds']} rounds (medians), on {m['cpu']} "
        f"({m['os_cpus']} cores, shared: load average {m['load_average'][1]} over the last 5 minutes). *Held after "
        "forward*: the bytes of what the forward made that is alive when it returns, i.e. kept for backward "
        "(`benchmarks.harness.activations`); *peak RSS growth*: the process's peak resident memory during one forward "
        "and backward above its resident memory before; *step*: one forward and backward.\n",
        "| `train.activation_checkpointing` | held after forward | vs off | peak RSS growth | vs off | step (s) | vs off "
        "(wall / CPU) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| `{mode}` | {r['held_after_forward_bytes'] / 2**20:.1f} MiB | {r['held_vs_off']:.3f} | "
        f"{r['peak_rss_growth_bytes'] / 2**20:.0f} MiB | {r['rss_growth_vs_off']:.2f} | {r['step_s']['median']:.3f} | "
        f"{r['step_vs_off']:.2f}x / {r['cpu_vs_off']:.2f}x |"
        for mode, r in d["modes"].items()
    ]
    return lines + [""] + RECOMPUTE_NOTES


RECOMPUTE_NOTES = [
    "Every mode trains the same numbers: losses and weights after 3 LAMB steps with dropout and stochastic depth on "
    "equal `off`'s bit for bit here (tests/unit/model/test_recompute.py allows 1e-6), and under fsdp at 3 ranks a "
    "step with `selective` or `full` equals the plain one (tests/e2e/test_fsdp.py). `full` keeps each block's input "
    "and reruns the block's forward in backward; `selective` keeps the outputs of the matmuls and attention "
    "(`vitlarge.model.recompute.SAVED_OPS`) and recomputes the LayerNorms, GELU, dropout and residual adds, so its "
    "recompute is elementwise work, no GEMM. On a GPU the kit measures vit_l16 and vit_h14 at their recipes' "
    "micro-batches under each mode; the recipes keep `full` until then.\n",
]


def timm_parity_section(named: dict[str, dict | None]) -> tuple[list[str], list[tuple]]:
    """`benchmarks/bench_timm_parity.py`'s results (``timm_parity``, and ``timm_parity_ls01`` where run): per
    variant, each seed's top-1 on both sides, the medians and their differences; the goal is issue 35's."""
    title = "## 11. Against timm's train.py: DeiT III's pieces\n"
    found = {n: d for n, d in named.items() if d}
    if not found:  # not in benchmarks.run's suite: no section and no goal row rather than "not run" (as section 9)
        return [], []
    first = next(iter(found.values()))
    m = first["machine"]
    lines = [
        title,
        "`benchmarks/bench_timm_parity.py` (issue 35): vitlarge (`colossalai run`, recipes/demo_digits.py) against "
        f"timm's own train.py ({first['timm']}, patched only for DDP on CPU) on the digits demo, both sides reading "
        "the same JPEGs, 2 gloo processes each, fp32, the same 660 optimizer updates, sides interleaved per seed, one "
        f"run at a time. Machine: {m['cpu']}, {m['os_cpus']} cores shared with other work (load average "
        f"{m['load_average'][1]} over the last run's 5 minutes). The ablation (label smoothing, "
        'the order of random erasing and Mixup) is in docs/DATA.md, "Against timm\'s train.py".\n',
    ]
    goals, ok_all, measured = [], True, []
    for name, d in found.items():
        for variant, e in d["summary"].items():
            runs = [r for r in d["runs"] if r["variant"] == variant]
            lines += [
                f"`{name}.json`, variant `{variant}` ({', '.join(runs[0]['pieces']) or 'no pieces'}), label "
                f"smoothing {d['smoothing']:g} on both sides"
                + (f", vitlarge also {' '.join(d['vitlarge_set'])}" if d["vitlarge_set"] else "")
                + (f", timm also {' '.join(d['timm_args'])}" if d["timm_args"] else "")
                + ":\n",
                "| seed | vitlarge top-1 / EMA (%) | timm train.py top-1 / EMA (%) | s per run vitlarge / timm |",
                "|---|---:|---:|---:|",
            ]
            by_seed: dict[int, dict] = {}
            for r in runs:
                by_seed.setdefault(r["seed"], {})[r["side"]] = r
            for seed, sides in by_seed.items():
                v, t = sides.get("vitlarge", {}), sides.get("timm", {})
                lines.append(
                    f"| {seed} | {_fmt(v.get('top1'))} / {_fmt(v.get('top1_ema'))} | "
                    f"{_fmt(t.get('top1'))} / {_fmt(t.get('top1_ema'))} | "
                    f"{_fmt(v.get('wall_s'), 0)} / {_fmt(t.get('wall_s'), 0)} |"
                )
            v, t = e["vitlarge"], e["timm"]
            lines.append(
                f"| **median** | **{_fmt(v['top1'])} / {_fmt(v['top1_ema'])}** | **{_fmt(t['top1'])} / "
                f"{_fmt(t['top1_ema'])}** | {_fmt(v['wall_s'], 0)} / {_fmt(t['wall_s'], 0)} |"
            )
            gaps = [None if v[k] is None or t[k] is None else round(v[k] - t[k], 2) for k in ("top1", "top1_ema")]
            lines.append(
                f"\nDifference of the medians (vitlarge - timm): {_fmt_signed(gaps[0])} / {_fmt_signed(gaps[1])} "
                f"points (raw / EMA); median of the per-seed differences: {_fmt_signed(e['diff_top1_median'])} / "
                f"{_fmt_signed(e['diff_top1_ema_median'])}.\n"
            )
            if variant == "all":
                ok = None if None in gaps else all(abs(g) <= 1.0 for g in gaps)
                ok_all = None if ok is None or ok_all is None else ok_all and ok
                measured.append(
                    f"{_fmt_signed(gaps[0])} / {_fmt_signed(gaps[1])} "
                    f"(smoothing {d['smoothing']:g}, {len(by_seed)} seeds)"
                )
    if measured:
        goals.append(
            (
                "DeiT III pieces vs timm's train.py",
                "median top-1 within 1 point, raw and EMA",
                "; ".join(measured),
                ok_all,
            )
        )
    return lines, goals


STARTUP_LIGHT = (
    "What stays light, each checked in a fresh interpreter (`tests/e2e/test_process_start.py::test_light_paths`): "
    "`train.py --help` and a bad argument, the data tools, `vitlarge-plot` and `vitlarge-evaluate`'s argument errors "
    "load none of torch, DALI, Colossal-AI, timm, TensorBoard, MLflow, W&B (matplotlib: the plot alone); a run loads "
    "nothing of torch until its thread pools are sized (their size is read as torch loads); the dry run loads torch "
    "and timm, none of the rest; the supervisor's parent (`python -m vitlarge.run`) torch alone. A run's pre-flight "
    "data checks come before timm and DALI load, so a bad data set fails before those seconds. An import inside a "
    "function of vitlarge/, hooks/ or data_tools/ is there for one of these and says which (`# lazy: keeps torch off "
    "train.py until the thread pools are sized`; `tests/unit/test_layout.py`); every other import is at its module's "
    "top.\n"
)


def startup_section(d: dict | None) -> tuple[list[str], list[tuple]]:
    """`benchmarks/bench_startup.py`'s result (``startup``): each phase's median, wall and rank 0's CPU seconds, per
    contender; the goal: vitlarge's time outside the loop at most timm's, under timm's own launcher (torchrun), with
    what `colossalai run` adds beside it."""
    if not d:  # not in benchmarks.run's suite: no section and no goal row rather than "not run" (as section 11)
        return [], []
    m, wall, cpu = d["machine"], d["summary"], d["cpu_summary"]
    names = list(wall)
    loads = [r["load_avg"] for r in d["runs"]]
    baseline = ""
    if d.get("baseline"):
        baseline = f" `baseline`: {d.get('baseline_rev') or 'another checkout'} (`--baseline`), side by side."
    lines = [
        "## 12. Start-up against timm's train.py\n",
        "`benchmarks/bench_startup.py` (issue 46): the time a run spends outside its training loop, by phase, on the "
        f"digits demo for {d['steps']} optimizer steps on 2 gloo processes, each rank under "
        "`benchmarks/harness/startup_probe.py`; vitlarge as `make demo` starts it (`colossalai run`; "
        f"`(torchrun)`: under torchrun, as timm's), timm's own train.py ({d['timm']}) under torchrun; contenders "
        f"interleaved, medians of {min(s['rounds'] for s in wall.values())} rounds.{baseline} Machine: {m['cpu']}, "
        f"{m['os_cpus']} cores shared with other work (load average {min(loads):.1f} to {max(loads):.1f} during the "
        "runs): read the CPU seconds.\n",
    ]
    for title, table in (("wall seconds", wall), ("rank 0's CPU seconds", cpu)):
        keys = list(dict.fromkeys(k for v in table.values() for k in v if k != "rounds"))
        lines += [f"| {title} (median) | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
        rows = [[table[n].get(k) for n in names] for k in keys]  # None: a phase that contender has not
        lines += [f"| {k} | " + " | ".join("-" if v is None else _fmt(v) for v in r) + " |" for k, r in zip(keys, rows)]
        lines.append("")
    goals = []
    ours = "vitlarge (torchrun)" if "vitlarge (torchrun)" in wall else "vitlarge"
    if "timm" in wall and ours in wall:
        lines.append(_startup_reading(d, ours))
        goals.append(_startup_goal(d, ours))
    lines.append(STARTUP_LIGHT)
    return lines, goals


def _startup_goal(d: dict, ours: str) -> tuple:
    """The start-up goal row: ``ours`` (vitlarge under torchrun where measured so) against timm's train.py outside the
    loop, wall and rank 0's CPU (met where either is at most timm's, as every goal here); CPU "even" where timm's
    median lies inside ``ours``' rounds; `colossalai run` beside it, with its launcher's seconds."""
    wall, cpu, key = d["summary"], d["cpu_summary"], "outside the loop"
    w, c = wall[ours][key] / wall["timm"][key], cpu[ours][key] / cpu["timm"][key]
    rounds = [r["cpu_phases"][key] for r in d["runs"] if r["contender"] == ours]
    even = c > 1.0 and min(rounds) <= cpu["timm"][key] <= max(rounds)
    torchrun = ours != "vitlarge"
    where = "under torchrun, as timm's: " if torchrun else ""
    measured = (
        f"{where}{w:.2f}x wall, {c:.2f}x rank 0's CPU (rounds {min(rounds):.1f}-{max(rounds):.1f} s against "
        f"{cpu['timm'][key]:.1f})"
    )
    met = min(w, c) <= 1.0
    verdict = _yes(met)
    if met and (w <= 1.0) != (c <= 1.0):
        verdict += " in wall time" if w <= 1.0 else " in CPU time"
    if torchrun:
        verdict += " under the same launcher"
    verdict += "; CPU even" if even else ""
    if torchrun and "vitlarge" in wall:
        w2, c2 = wall["vitlarge"][key] / wall["timm"][key], cpu["vitlarge"][key] / cpu["timm"][key]
        launcher = _launcher_seconds(wall["vitlarge"])
        own = f" (its launcher's {sum(launcher):.1f} s)" if launcher else ""
        measured += f"; under `colossalai run`: {w2:.2f}x wall{own}, {c2:.2f}x CPU"
        verdict += "; not under `colossalai run`" if min(w2, c2) > 1.0 else "; under `colossalai run` too"
    return ("Start-up: time outside the training loop vs timm's train.py", "<= 1x", measured, verdict)


def _launcher_seconds(phases: dict) -> tuple[float, float] | None:
    """`colossalai run`'s own wall seconds: before it starts torchrun, and from torchrun's exit to its own; None for a
    result that did not time them (bench_startup before the launcher phases)."""
    before, after = (
        phases.get("launch: until torchrun starts"),
        phases.get("launch: torchrun exit to the command's exit"),
    )
    return None if before is None or after is None else (before, after)


def _startup_reading(d: dict, ours: str) -> str:
    """The section's reading of its tables, every figure taken from them: ``ours`` against timm's train.py, what of
    it is end-of-run work timm's train.py does not do, and what `colossalai run` adds."""
    wall, cpu, key = d["summary"], d["cpu_summary"], "outside the loop"
    rounds = [r["cpu_phases"][key] for r in d["runs"] if r["contender"] == ours]
    ow, tw, oc, tc = wall[ours][key], wall["timm"][key], cpu[ours][key], cpu["timm"][key]

    def compared(a: float, b: float) -> str:
        return "less" if a < b else "more"

    if min(rounds) <= tc <= max(rounds):
        cpu_words = f"the same of rank 0's CPU ({oc:.1f} s against {tc:.1f} s, inside the rounds' spread)"
    else:
        cpu_words = f"{compared(oc, tc)} of rank 0's CPU ({oc:.1f} s against {tc:.1f} s)"
    extra = [
        cpu[ours].get(k) or 0.0
        for k in (
            "end: the hooks' on_train_end (the picture, TensorBoard's close)",
            "end: timm export",
            "end: import matplotlib",
        )
    ]
    text = (
        f"{'Under the launcher timm uses (torchrun)' if ours != 'vitlarge' else 'Under `colossalai run`'}, vitlarge "
        f"spends {compared(ow, tw)} wall time outside its loop than timm's train.py ({ow:.1f} s against {tw:.1f} s) "
        f"and {cpu_words}, with the Booster and with end-of-run work timm's train.py does not do: the picture of the "
        f"run, TensorBoard's close and the timm export ({sum(extra[:2]):.1f} to {sum(extra):.1f} CPU s; without them "
        f"{oc - sum(extra):.1f} s against {tc:.1f} s)."
    )
    launcher = _launcher_seconds(wall["vitlarge"]) if ours != "vitlarge" and "vitlarge" in wall else None
    if launcher:
        before, after = launcher
        own_cpu = wall["vitlarge"].get("CPU of colossalai run (all its processes)")
        text += (
            f" Under `colossalai run`, as `make demo` starts it, the run is the same and the launcher adds "
            f"{before + after:.1f} s of wall time: Colossal-AI's command takes {before:.1f} s before it starts torchrun "
            f"and {after:.1f} s after torchrun exits (its own imports and the per-host runner it starts torchrun "
            f"through{f': {own_cpu:.1f} CPU s in all its processes' if own_cpu is not None else ''}), which vitlarge "
            "does not control; `srun` and torchrun start vitlarge without it (section 9)."
        )
    return text + (
        " A phase moves when a package's first importer changes (an import early in one contender loads shared "
        "dependencies that another loads later); compare the totals.\n"
    )


def wds_section(d: dict | None) -> tuple[list[str], list[tuple]]:
    """`benchmarks/bench_wds.py`'s result (``wds``): TrainLoader images/s from WebDataset tars in place against the
    same images as TFRecords, per set; the goal: >= 0.95x on each set (wall or CPU)."""
    if not d:  # not in benchmarks.run's suite: no section and no goal row rather than "not run"
        return [], []
    m, wall, cpu = d["machine"], d["images_per_s_median"], d["images_per_cpu_s_median"]
    sets = list(d["webdataset_vs_tfrecord"])
    lines = [
        "## 15. WebDataset in place against TFRecords\n",
        "`benchmarks/bench_wds.py` (issue 54): `vitlarge.data.TrainLoader` images/s, batch "
        f"{d['batch_size']}, {d['threads']} DALI threads, on each set as TFRecords and as its WebDataset copy in "
        "timm's layout (`data_tools.make_wds_copy`: the same records, tar for shard; read in place by DALI's "
        "webdataset reader): the digits demo (32-pixel crops) and the ImageNet-shaped set of section 1 (224). "
        f"Contenders interleaved, medians of {d['repeats']} repeats of {d['timed_batches']} batches. Machine: "
        f"{m['cpu']}, {m['os_cpus']} cores shared with other work (load average {d['load_average_at_end'][0]:.1f} "
        "at the end).\n",
        "| set | TFRecord images/s | WebDataset images/s | ratio | per CPU-second: TFRecord | WebDataset | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in sets:
        tf, wd = f"{s}/tfrecord", f"{s}/webdataset"
        lines.append(
            f"| {s} | {_fmt(wall[tf], 1)} | {_fmt(wall[wd], 1)} | {_fmt(d['webdataset_vs_tfrecord'][s])} | "
            f"{_fmt(cpu[tf], 1)} | {_fmt(cpu[wd], 1)} | {_fmt(d['webdataset_vs_tfrecord_per_cpu_s'][s])} |"
        )
    lines += [
        "",
        "The label is the `.cls` member's ASCII integer. It leaves the pipeline as its bytes (one DALI operator, a "
        "pad to 16 bytes) and is parsed a batch at a time in torch (`vitlarge.data.wds_shards.ascii_labels`, which "
        "also refuses a `.cls` that is no integer). Parsed inside the pipeline it took ~20 DALI operators a batch, "
        "and the digits, whose 32-pixel images cost little to decode, ran at 0.55-0.67x wall on a quiet machine "
        "(0.13x parsed a digit at a time); with a constant label in its place, 1.08x (Intel Xeon, 2 cores, one "
        "session). At 224 pixels the tars cost what TFRecords do; ImageNet's images are that case.\n",
    ]
    best = [max(d["webdataset_vs_tfrecord"][s], d["webdataset_vs_tfrecord_per_cpu_s"][s]) for s in sets]
    measured = ", ".join(
        f"{s} {d['webdataset_vs_tfrecord'][s]:.2f}x wall, {d['webdataset_vs_tfrecord_per_cpu_s'][s]:.2f}x CPU"
        for s in sets
    )
    return lines, [("WebDataset in place vs TFRecords (training images/s)", ">= 0.95x", measured, min(best) >= 0.95)]


def _fmt_signed(x) -> str:
    return "-" if x is None else f"{x:+.2f}"


def precision_section(d: dict | None, img: Path, plt):
    if not d:
        return ["## 6. Precision\n", "not run\n"]
    r = d["results"]
    if plt:
        _barh(
            plt,
            img / "precision.png",
            list(r),
            {
                "images/s (wall)": [v["images_per_s"] for v in r.values()],
                "images/s (CPU time / threads)": [v["images_per_s_cpu"] for v in r.values()],
            },
            "images/s (higher is better)",
            f"{d['model']} {d['image_size']} px, micro-batch {d['micro_batch']}, by precision",
        )
    lines = [
        "## 6. Precision\n",
        f"`benchmarks/bench_precision.py`: the same model and Engine as section 3, {d['rounds']} interleaved rounds of "
        f"{d['steps_per_round']} step(s) (medians). `fp16` is what vitlarge builds for fp16 on CPU: unfused attention "
        "(`model.fused_attn=auto`) and the patch-embedding conv in fp32 (`vitlarge.model.vit.Fp32Conv2d`); "
        "`fp16_conv_in_fp16` leaves that conv to autocast, as before the fix: PyTorch 2.5's fp16 convolution "
        "backward on CPU is a slow fallback that took 78% of the step.\n",
        "| precision | s/step (wall) | CPU s/step | images/s (wall) | images/s (CPU) | vs fp32 (wall / CPU) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| `{k}` | {v['step_s']['median']:.3f} | {v['cpu_s_per_step']['median']:.3f} | {v['images_per_s']:.1f} | "
        f"{v['images_per_s_cpu']:.1f} | {v['speed_vs_fp32']:.2f}x / {v['speed_vs_fp32_cpu']:.2f}x |"
        for k, v in r.items()
    ]
    lines += ["", "![precision](img/precision.png)\n"]
    if "fp16_conv_in_fp16" in r:
        a, b = r["fp16"], r["fp16_conv_in_fp16"]
        lines.append(
            f"The fp32 patch-embedding conv makes fp16 steps {a['images_per_s'] / b['images_per_s']:.1f}x faster "
            f"(wall; {a['images_per_s_cpu'] / b['images_per_s_cpu']:.1f}x by CPU time). bf16 has no AMX here "
            "and pays autocast's casts, so it trails fp32; fp16 matmuls ran about as fast as fp32 in a side probe "
            "(the CPU has AVX512-FP16).\n"
        )
    return lines


def dry_run_quote(kind: str, world: int) -> tuple[str, list[str]]:
    """vit_b16's dry run on ``world`` GPUs of ``kind`` (the checkout's GPU kit results, ImageNet's sizes): its
    command, and its input pipeline, evaluation, checkpoint and total lines."""
    recipe = "recipes/vit_b16.py"
    cfg = load_config(Path(__file__).resolve().parents[2] / recipe)
    settings = plan_settings(cfg, "cuda")
    lines = gpu_time_lines(cfg, make_plan(cfg, world), settings.precision, settings.compile, kind, None)
    keep = ("input pipeline", "evaluation:", "checkpoints:", "total:")
    return (
        f"python train.py --config {recipe} --dry-run --gpu {kind} --world-size {world}",
        [line for line in lines if line.strip().startswith(keep)],
    )


def run_time_quotes() -> list[str]:
    """What section 7 says of how long vit_b16 takes: the dry run's figures, and why the others differ."""
    lines = [
        "### How long vit_b16 takes: the dry run\n",
        "The estimate to use is the dry run's (`--dry-run --gpu KIND`, `vitlarge/run/gpu_hours.py` and "
        "`vitlarge/run/run_costs.py`): the GPU kit's measured images/s (section 8), scaled where the GPU kind or the "
        "precision was not measured (it names the ratio and its source), the all-reduce below, the validation passes "
        "and checkpoints of the recipe's schedule, and the CPU cores and storage bytes/s each GPU needs at that rate; "
        "each figure is named measured, scaled, assumed or stated. For vit_b16 (extracts; the whole output names each "
        "source):\n",
        "```",
    ]
    for kind, world in DRY_RUNS:
        command, quoted = dry_run_quote(kind, world)
        lines += [f"$ {command}", "...", *quoted]
    lines += [
        "```\n",
        "Why the other figures differ. Colossal-AI's 78.58 h on 4 A100 (README.md's recipe table) is their report of "
        "their own run (their engine and data pipeline, evaluation and checkpoints included), not a vitlarge "
        "measurement. vitlarge has run on one H200 only (the kit, section 8): every A100 or H100 figure is that "
        "measurement scaled by datasheet ratios, never run. The table above takes two stated rates (340 img/s, "
        "Colossal-AI's report; 660 img/s, a target) to show how the all-reduce share grows with the GPU count: its "
        "hours (40-78 h on 4 GPUs, 5-9.8 h on 32) are at those rates, not an estimate of a run.\n",
    ]
    return lines


def scaling_section(img: Path, plt, data: dict | None) -> list[str]:
    rows = scaling_rows()
    labels = list(IMG_PER_S)
    if plt:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
        for label in labels:
            b16 = [r for r in rows if r["model"] == "ViT-B/16"]
            a1.plot(
                [r["gpus"] for r in b16],
                [r[f"epoch_h[{label}]"] * 60 for r in b16],
                "o-",
                label=f"ViT-B/16 at {IMG_PER_S[label]} img/s/GPU",
            )
        a1.set_xscale("log", base=2)
        a1.set_yscale("log")
        a1.set_xlabel("GPUs")
        a1.set_ylabel("minutes per epoch")
        a1.set_title("Time per ImageNet epoch (32K batch)", fontsize=10)
        a1.legend(fontsize=8)
        for model, style in zip(MODELS, ("o-", "s--")):
            mr = [r for r in rows if r["model"] == model]
            for label in labels:
                a2.plot(
                    [r["gpus"] for r in mr],
                    [100 * r[f"comm_share[{label}]"] for r in mr],
                    style,
                    label=f"{model}, B/16 at {IMG_PER_S[label]} img/s/GPU",
                )
        a2.axhline(100, color="k", ls=":", lw=1)
        a2.set_xscale("log", base=2)
        a2.set_yscale("log")
        a2.set_xlabel("GPUs")
        a2.set_ylabel("% of step time")
        a2.set_title(
            "Gradient all-reduce time / step time, if not overlapped\n(L/16: 3.5x the bytes, 3.5x the step)", fontsize=9
        )
        a2.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(img / "scaling.png", dpi=110)
        plt.close(fig)
    lines = [
        "## 7. Scaling on paper\n",
        f"Computed by `benchmarks/report/performance.py` from the constants at its top, not measured. Global batch {GLOBAL_BATCH}; "
        f"{IMAGENET_TRAIN // GLOBAL_BATCH} optimizer steps per ImageNet epoch ({IMAGENET_TRAIN:,} images, last partial "
        f"batch dropped). Throughput per GPU for ViT-B/16: {IMG_PER_S['Colossal-AI measured']} img/s (Colossal-AI's "
        f"reported 78.58 h for 300 epochs on 4x A100) and {IMG_PER_S['well-tuned target']} img/s (a well-tuned target); "
        "ViT-L/16 at 1/3.5 of that (its FLOPs per image). The all-reduce is a ring over fp32 gradients: each GPU "
        f"sends 2(n-1)/n x gradient bytes per optimizer step, at an assumed bus bandwidth of "
        f"{BUSBW_GBPS['intra-node (NVLink)']:.0f} GB/s inside a node (n <= 8) and "
        f"{BUSBW_GBPS['inter-node (IB, 200 Gb/s per GPU)']:.0f} GB/s across nodes. The micro-batch is the recipe's "
        "(256 for B/16, 128 for L/16) until micro x GPUs would exceed 32K.\n",
        "| model | GPUs | micro x accumulation | all-reduce per GPU per step | its time | step time at 340 / 660 img/s | "
        "all-reduce share at 340 / 660 | epoch at 340 / 660 img/s | 300 epochs at 340 / 660 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        a, b = labels
        lines.append(
            f"| {r['model']} | {r['gpus']} | {r['micro']} x {r['accum']} | {r['allreduce_gb']:.2f} GB | {1e3 * r['allreduce_s']:.0f} ms | "
            f"{r[f'step_s[{a}]']:.2f} / {r[f'step_s[{b}]']:.2f} s | {100 * r[f'comm_share[{a}]']:.1f} / "
            f"{100 * r[f'comm_share[{b}]']:.1f}% | {60 * r[f'epoch_h[{a}]']:.1f} / {60 * r[f'epoch_h[{b}]']:.1f} min | "
            f"{300 * r[f'epoch_h[{a}]']:.1f} / {300 * r[f'epoch_h[{b}]']:.1f} h |"
        )
    lines += [
        "",
        "![scaling](img/scaling.png)\n",
        "Reading it: the all-reduce volume per GPU is almost constant in n (2(n-1)/n -> 2), while the step time falls "
        "as 1/n, so the communication share grows linearly with the GPU count. With accumulation DDP sends once per "
        "optimizer step (section 5), so up to 128 GPUs the all-reduce is a few percent of a step and overlaps the last "
        "micro-step's backward anyway; at 512 GPUs (micro 64, no accumulation) ViT-B/16's 0.69 GB per step is a "
        "large share of a ~0.1-0.2 s step unless it overlaps backward (DDP's 25 MB buckets do) or the gradients are "
        "reduced in bf16 (half the bytes).\n",
    ]
    lines += run_time_quotes()
    lines += data_scaling(data)
    return lines


def data_scaling(d: dict | None) -> list[str]:
    """What the input pipeline must deliver per GPU so waiting for data stays under DATA_SHARE of the step."""
    lines = [
        "### Data loading at scale\n",
        f"Waiting for data stays under {100 * DATA_SHARE:.0f}% of the step if the loader, running ahead with its "
        "prefetch queue, sustains at least the training rate per GPU and whatever it takes from the GPU is under "
        f"{100 * DATA_SHARE:.0f}% of the step. Per GPU that is {IMG_PER_S['Colossal-AI measured']} / "
        f"{IMG_PER_S['well-tuned target']} img/s for ViT-B/16 "
        f"({8 * IMG_PER_S['Colossal-AI measured']:,} / {8 * IMG_PER_S['well-tuned target']:,} per 8-GPU node), "
        "independent of the GPU count: data loading is per-GPU work and scales with the nodes.\n",
    ]
    if d and d.get("images_per_cpu_s_median"):
        per_core = d["images_per_cpu_s_median"]["dali_trainloader"]
        lines.append(
            f"- **CPU decode** (DALI on the CPU, measured in section 1 at 224 px): {per_core:.0f} images per CPU-second, "
            f"so {IMG_PER_S['Colossal-AI measured'] / per_core:.1f} / {IMG_PER_S['well-tuned target'] / per_core:.1f} "
            f"cores per GPU, {8 * IMG_PER_S['Colossal-AI measured'] / per_core:.0f} / "
            f"{8 * IMG_PER_S['well-tuned target'] / per_core:.0f} cores per 8-GPU node just for decoding and augmenting "
            "(this machine's cores; server cores are faster). More than most nodes have to spare at the tuned rate."
        )
    lines += [
        f"- **DALI GPU decode** (`mixed` decoder: Huffman decoding on the CPU or the A100's hardware JPEG decoder, the "
        "rest on the GPU) moves the cost off the CPU. The GPU share must stay under "
        f"{100 * DATA_SHARE:.0f}% of the step: decode + crop + resize on the GPU at >= "
        f"{IMG_PER_S['Colossal-AI measured'] / DATA_SHARE:,.0f} / {IMG_PER_S['well-tuned target'] / DATA_SHARE:,.0f} img/s "
        "per GPU (20x the training rate), or on the hardware decoder, which runs beside the SMs and then only needs "
        "to keep up with the training rate.",
        "- Storage: ImageNet-1k's ~140 GB of TFRecords per epoch at the tuned rate on 32 GPUs (one epoch in ~1 min) is "
        "~2.3 GB/s across the job: local NVMe copies or a page cache that holds the data set, not a shared network "
        "file system read every epoch.\n",
    ]
    return lines


# ---- The document --------------------------------------------------------------------------------


def generate(results: Path | None = None, out: Path | None = None, img: Path | None = None) -> Path:
    results = results or harness_results.results_dir()
    out = out or DOCS / "PERFORMANCE.md"
    img = img or out.parent / "img"
    img.mkdir(parents=True, exist_ok=True)
    plt = _plt()
    r = {n: _load(results, n) for n in ("data", "convert", "train", "optimizer", "comm", "precision", "launch")}
    pinned = installed_torch()
    sections, goals = [], []
    for fn, name in (
        (data_section, "data"),
        (convert_section, "convert"),
        (train_section, "train"),
        (optimizer_section, "optimizer"),
        (comm_section, "comm"),
    ):
        lines, g = fn(r[name], img, plt)
        sections += stamp(lines, r[name], pinned)
        goals += g
        if name == "convert":
            parquet = _load(results, "parquet")
            lines, g = parquet_section(parquet)
            sections += stamp(lines, parquet, pinned)
            goals += g
    sections += stamp(precision_section(r["precision"], img, plt), r["precision"], pinned)
    sections += scaling_section(img, plt, r["data"])
    sections += gpu_report.section(_load(results, "gpu"))  # benchmarks/gpu/, run on a GPU machine
    lines, g = launch_section(r["launch"])
    sections += stamp(lines, r["launch"], pinned)
    goals += g
    compiled = _load(results, "compile")
    sections += stamp(compile_section(compiled), compiled, pinned)
    matrix = _load(results, "compile_matrix")
    sections += stamp(compile_matrix_section(matrix), matrix, pinned)
    parity = {n: _load(results, n) for n in ("timm_parity", "timm_parity_ls01")}
    lines, g = timm_parity_section(parity)
    sections += stamp(lines, next((d for d in parity.values() if d), None), pinned)
    goals += g
    startup = _load(results, "startup")
    lines, g = startup_section(startup)
    sections += stamp(lines, startup, pinned)
    goals += g
    recomputed = _load(results, "activation_checkpointing")
    sections += stamp(recompute_section(recomputed), recomputed, pinned)
    tfds = _load(results, "tfds")
    lines, g = tfds_section(tfds)
    sections += stamp(lines, tfds, pinned)
    goals += g
    tars = _load(results, "wds")
    lines, g = wds_section(tars)
    sections += stamp(lines, tars, pinned)
    goals += g
    machine = next((v["machine"] for v in r.values() if v and "machine" in v), None)
    head = [
        "# Performance\n",
        "Generated by `python -m benchmarks.run --quick` (`benchmarks/report/performance.py`); do not edit by hand. Every comparison "
        "runs its contenders in one process, interleaved, and reports medians of >= 3 repeats. The machine is shared "
        "with other work, so wall-clock numbers are noisy: where the benchmark records CPU time, the ratio of CPU "
        "times (what an idle machine would show) is given too, and a goal counts as met if either measure meets it.\n",
    ]
    if machine:
        head.append(
            f"Machine: {machine['cpu']}, {machine['os_cpus']} CPUs ({', '.join(machine.get('cpu_flags', [])) or 'flags n/a'}; "
            f"{'AMX' if any(f.startswith('amx') for f in machine.get('cpu_flags', [])) else 'no AMX'}), torch {machine['torch']}, Python {machine['python']}, OpenMP wait policy "
            f"{machine.get('omp_wait_policy', 'default')}; load average at the end of the last benchmark "
            f"{machine['load_average'][0]}.\n"
        )
    head.append(stacks_line({**r, "compile": compiled, "compile_matrix": matrix}, pinned))
    head += [
        "Findings that changed code or settings:\n",
        "- **fp16 on CPU: the patch-embedding convolution now runs in fp32** (`vitlarge.model.vit.Fp32Conv2d`). PyTorch "
        "2.5's fp16 convolution backward on CPU is a slow fallback: it took 78% of an fp16 ViT-S/16 step; with the "
        "conv in fp32 the step is ~5x faster (section 6). This affects `make demo` (fp16 on 2 CPU processes).",
        "- **OpenMP wait policy on a shared CPU.** With libgomp's default policy, 2 threads on 2 cores that other "
        "processes also use wait for a descheduled thread at every parallel region: a tiny ViT step took 0.74 s "
        "instead of 0.01 s. The benchmarks set `OMP_WAIT_POLICY=PASSIVE` (before torch loads); an oversubscribed "
        "CPU run of train.py benefits from the same setting.",
        "- `model.fused_attn=auto` (unfused attention for fp16 on CPU) is confirmed: without attention dropout, an fp16 "
        "ViT-S/16 step with the fused SDPA kernel took ~33 CPU-s against ~1.6 unfused (a one-off measurement). With "
        "the recipes' attention dropout 0.1 the CPU kernel falls back to the math path anyway.",
        "- **Start-up** (section 12, where measured): importing Colossal-AI's Booster loaded peft, transformers, "
        "scikit-learn and bitsandbytes, which the DDP and FSDP plugins never use; `vitlarge.distributed.booster` "
        "imports it without them, W&B (which timm imports at its own import) waits for its first use, and DALI's "
        "conditionals (AutoGraph) are on only for graphs that branch per sample.\n",
        "## Goals\n",
        "| goal | target | measured | status |",
        "|---|---|---|---|",
    ]
    head += [
        f"| {name} | {target} | {measured} | {ok if isinstance(ok, str) else _yes(ok)} |"
        for name, target, measured, ok in goals
    ]
    head.append("")
    if plt is None:
        head.append("_matplotlib is not installed: plots were not regenerated._\n")
    text = "\n".join(head + sections).rstrip() + "\n"
    tmp = out.with_suffix(".md.tmp")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_text(text)
    tmp.replace(out)
    return out


def main() -> None:
    print(f"wrote {generate()}")
