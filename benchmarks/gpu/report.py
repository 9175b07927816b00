"""The GPU kit's section of docs/PERFORMANCE.md, from ``gpu.json`` (benchmarks/gpu/kit.py).

Contract: `section(result)` returns markdown lines; ``result`` None (no GPU run recorded in
benchmarks/results) gives the commands and a table that says nothing was measured, never numbers.
`benchmarks.report.performance.generate` appends it to the document; the kit also writes it as
``gpu.md`` next to ``gpu.json``.
"""

from __future__ import annotations

TITLE = "## 8. GPU measurement kit\n"
NOT_MEASURED = "not measured yet: no GPU lent on 2026-11-22"

HOW = [
    "`python -m benchmarks.gpu` (`benchmarks/gpu/kit.py`): on the CUDA device present, synthetic data already on the "
    "device (the compute side only). By default it measures the bf16/fp16 matmul peak, the optimizer step alone (3, "
    "below), then the `recipes` section "
    "(`benchmarks/gpu/recipes.py`): vit_b16, deit3_b16, vit_l16 and vit_h14 in their own configuration (micro-batch, "
    "precision, dropouts, stochastic depth, activation checkpointing, determinism; accumulation 1), each compiled "
    "and eager, bf16 beside a recipe's fp16, without dropout (what dropout 0.1 costs), and for vit_b16 a compiled "
    "bare PyTorch loop; per row images/s, memory, MFU, the attention kernel vitlarge chose and the one that ran, "
    "where the step's time goes by kernel class (GEMM, attention, norms and element-wise, optimizer, "
    "communication, idle: `benchmarks/gpu/profile.py`), the SM clock and power from `nvidia-smi`; per recipe the "
    "GEMM reference (the model's own GEMMs at its micro-batch, timed alone). `--time-budget S` starts no row that "
    "would end past S seconds and prints the `--only recipes --rows ...` command that finishes them; `--set "
    "KEY=VALUE` passes train.py overrides (`train.compile=...`) to every row. The "
    "first kit's sections (`--only train large`): (1) the bf16/fp16 peak of an "
    "8192^3 matmul and, for H100/H200/GH200/A100, the datasheet's dense peak (scaled by the multiprocessors of a MIG "
    "slice); (2) ViT-B/16 at 224 px, micro-batch 256 "
    "(halved until it fits), accumulation 4: vitlarge's engine (autocast, GradScaler for fp16, clipping after "
    "unscale, vitlarge's LAMB with the no-decay groups) in fp16 and bf16 against a bare PyTorch loop with timm's "
    "Lamb on the same no-decay groups, and the bf16 engine with `train.compile=on` (`vitlarge_compiled_bf16`, compiled during its warm-up; left eager under `--tiny`, where the row says so): images/s, step time, peak memory, optimizer steps skipped by the fp16 scaler "
    "among the timed ones, MFU (model FLOPs = 3 x the forward FLOPs `vitlarge.model.vit.describe_model` "
    "counts, attention included, recomputation not); (3) the optimizer step alone: vitlarge's LAMB, timm's and "
    "Colossal-AI's (where it imports), ms, kernel launches and host syncs (device-to-host waits) per step; (4) ViT-L/16 and ViT-H/14 with activation "
    "checkpointing in bf16: the largest micro-batch that fits, images/s and memory, next to the recipe's micro-batch. "
    "The engine runs under Colossal-AI's Booster when Colossal-AI imports, else under a plain single-device booster "
    "(`benchmarks/gpu/train.py`); the output names the path. `gpu.json` and `gpu.md` are rewritten after each "
    "section, marked incomplete until the end, so a failure or a time limit keeps what finished.\n",
    "On a bare CUDA machine with torch, timm and numpy (no DALI, no Colossal-AI, no network):\n",
    "```",
    "scripts/gpu_bundle.sh /tmp/vitlarge-gpu          # here: the project's Python files, < 64 MiB",
    "cd /tmp/vitlarge-gpu && python -m benchmarks.gpu --out results   # there: gpu.json + gpu.md",
    "```\n",
    "Through this workplace's device tool (it copies the checkout and returns what is written under `$OUT`): "
    "`run` with the command `PYTHONUNBUFFERED=1 python3 -m benchmarks.gpu --out $OUT`, then copy the returned "
    "`gpu.json` to `benchmarks/results/` and run `python -m benchmarks.report`. The smoke run, on any machine: "
    "`python -m benchmarks.gpu --device cpu --tiny` (numbers mean nothing). A run cut short (a failed section, "
    "the device tool's 10-minute limit) leaves what finished in both files, marked incomplete; run the rest "
    "with `--only` (e.g. `--only large`) into another `--out` (each run writes its own `gpu.json`). Exit status: 0 complete, 1 a section failed, 2 a bad `--device`.\n",
]


def _gib(b) -> str:
    return "n/a" if b is None else f"{b / 2**30:.1f} GiB"


def _flops(x: float) -> str:
    return f"{x / 1e12:.1f} TFLOP/s" if x >= 1e12 else f"{x / 1e9:.1f} GFLOP/s"


def _count(x) -> str:
    return "n/a" if x is None else f"{x:.0f}"


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def section(r: dict | None) -> list[str]:
    lines = [TITLE] + HOW
    if not r:
        return lines + [
            "| device | ViT-B/16 bf16 img/s | fp16 img/s | MFU (bf16) | ViT-L/16 | ViT-H/14 |",
            "|---|---:|---:|---:|---:|---:|",
            f"| {NOT_MEASURED} | - | - | - | - | - |",
            "",
        ]
    d, peak = r["device"], r["peak"]
    sheet = peak.get("datasheet")
    if not r.get("complete", True):
        failed = r.get("failed") or {}
        lines.append(
            "**Incomplete run**: "
            + (
                ", ".join(f"{k} failed ({v})" for k, v in failed.items())
                if failed
                else "stopped or still running after the sections below"
            )
            + ".\n"
        )
    lines += [
        f"Device: {d['name']} ({d['type']}), torch {d['torch']}"
        + (f", CUDA {d.get('cuda')}" if d["type"] == "cuda" else "")
        + f"; path: **{r['path']}** ({r['path_why']}){'; --tiny: the numbers mean nothing' if r['tiny'] else ''}"
        + {True: "; train.deterministic on, as the recipes run", False: "; train.deterministic off"}.get(
            r.get("deterministic"), "; train.deterministic not applied (a kit before it was)"
        )
        + ".\n",
        "Peak: "
        + ", ".join(f"{k} matmul {v['n']}^3 {_flops(v['flops_per_s'])}" for k, v in peak["measured"].items())
        + (
            f"; datasheet {sheet['board']} dense {_flops(sheet['dense_bf16_fp16_flops'])}"
            if sheet
            else "; no datasheet entry for this device"
        )
        + ".\n",
    ]
    if "recipes" in r:
        lines += recipes_lines(r["recipes"])
    if "train" in r:
        t = r["train"]
        lines += [
            f"{t['model']} at {t['image_size']} px, micro-batch {t['micro_batch']} (asked {t['micro_batch_requested']})"
            f" x accumulation {t['accum_steps']}, {t['rounds']} rounds of {t['steps_per_round']} steps:\n",
            "| contender | optimizer | step (s) | images/s | vs bare | skipped steps | peak memory | MFU vs matmul | MFU vs datasheet |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        lines += [
            f"| `{k}`{' (not compiled: --tiny)' if v.get('compiled') is False else ''} | {v['optimizer']} | {v['step_s']['median']:.4f} | {v['images_per_s']:.1f} | "
            f"{v.get('vs_bare', 1.0):.3f} | {v['skipped_steps']} of {t['rounds'] * t['steps_per_round']} | "
            f"{_gib(v['peak_memory_bytes'])} | {_pct(v['mfu']['vs_measured_matmul'])} | "
            f"{_pct(v['mfu']['vs_datasheet'])} |"
            for k, v in t["results"].items()
        ]
        lines.append("")
    if "optimizer" in r:
        o = r["optimizer"]
        lines += [
            f"Optimizer step alone, {o['num_params']:,} fp32 parameters in {o['num_tensors']} tensors:\n",
            "| optimizer | ms per step | launches per step | host syncs per step | counted as |",
            "|---|---:|---:|---:|---|",
        ]
        lines += [
            f"| `{k}` | {v['ms_per_step']['median']:.3f} | {_count(v['launches_per_step'])} | "
            f"{_count(v.get('syncs_per_step'))} | {v['launch_kind']} |"
            for k, v in o["results"].items()
        ]
        lines += [f"| `{k}` | left out | | | {why} |" for k, why in o["left_out"].items()]
        lines.append("")
    if "large" in r:
        lines += [
            "Large models, bf16, activation checkpointing, accumulation 1"
            + (f" ({r['large_run']['note']})" if "large_run" in r else "")
            + ":\n",
            "| model | recipe micro-batch | largest that fits (cap) | images/s | peak memory | MFU vs matmul | MFU vs datasheet |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for v in r["large"].values():
            m = v.get("mfu", {})
            fit = f"{v['micro_batch']} ({v['search_cap']})" + (
                ", stepped down to time it" if v.get("timed_lower") else ""
            )
            ips = "does not fit" if not v["micro_batch"] else f"{v['images_per_s']:.1f}"
            lines.append(
                f"| {v['name']} | {v['recipe_micro_batch']} | {fit} | {ips} | {_gib(v.get('peak_memory_bytes'))} | "
                f"{_pct(m.get('vs_measured_matmul'))} | {_pct(m.get('vs_datasheet'))} |"
            )
        lines.append("")
    return lines


def _ms(x) -> str:
    return "n/a" if x is None else f"{x:.1f}"


def recipes_lines(recipes: dict) -> list[str]:
    """The recipes section (benchmarks/gpu/recipes.py): rows, where their time goes, the GEMM reference."""
    lines = [
        "Recipes as they train (one GPU, synthetic data on the device, accumulation 1, the recipe's dropouts and "
        "determinism; `_nodrop`: attention, projection and position dropout 0; `bare_`: a plain PyTorch loop):\n",
        "| recipe | row | micro-batch | images/s | step (ms) | peak memory | MFU vs matmul | MFU vs datasheet | "
        "attention chosen / ran | SM clock, power |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    prof_lines, gemm_lines, left = [], [], []
    for name, e in recipes.items():
        for row, v in e["rows"].items():
            c = v.get("clocks") or {}
            clock = f"{c['sm_mhz_median']:.0f} MHz, {c['power_w_median']:.0f} W" if c else "n/a"
            b = v["breakdown"]
            note = "" if v["compiled"] or not row.startswith(("compiled", "bare_compiled")) else " (eager: --tiny)"
            lines.append(
                f"| {name} | `{row}`{note} | {e['micro_batch']} | {v['images_per_s']:.1f} | {1e3 * v['step_s']['median']:.1f} | "
                f"{_gib(v['peak_memory_bytes'])} | {_pct(v['mfu']['vs_measured_matmul'])} | "
                f"{_pct(v['mfu']['vs_datasheet'])} | {v['attention_chosen']} / {b['attention_backend_ran']} | {clock} |"
            )
            k = b["classes_ms"]
            prof_lines.append(
                f"| {name} `{row}` | {b['step_ms']:.1f} | {_ms(k['gemm'])} | {_ms(k['attention'])} | "
                f"{_ms(k['norms and element-wise'])} | {_ms(k['optimizer'])} | {_ms(k['communication'])} | {_ms(b['idle_ms'])} |"
            )
        left += [f"{name}.{row} ({why})" for row, why in e.get("not_run", {}).items()]
        g = e.get("gemm_reference")
        if g:
            ran = [v["breakdown"]["classes_ms"]["gemm"] for v in e["rows"].values() if v["compiled"]]
            gemm_lines.append(
                f"| {name} | {e['micro_batch']} | {g['ms_per_micro_step']:.1f} | "
                + (_flops(g["flops_per_s"]) if g.get("flops_per_s") else "n/a")
                + f" | {_ms(ran[0]) if ran else 'n/a'} |"
            )
    lines += [
        "",
        "Where a step's time goes, ms per step (torch.profiler over the timed row; GEMM, attention, norms and "
        "element-wise, optimizer, communication by kernel name; idle: the GPU waiting for the host):\n",
        "| row | step | GEMM | attention | norms and element-wise | optimizer | communication | idle |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *prof_lines,
        "",
        "GEMM reference: the model's own linear-layer GEMMs at the micro-batch (forward, input and weight gradient), "
        "each shape timed alone, against the GEMM kernels of the first compiled row:\n",
        "| recipe | micro-batch | GEMMs alone (ms per step) | their rate | in the compiled step (ms) |",
        "|---|---:|---:|---:|---:|",
        *gemm_lines,
        "",
    ]
    if left:
        lines += ["Not run: " + "; ".join(left) + ".", ""]
    return lines
