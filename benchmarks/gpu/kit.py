"""GPU measurement kit: ViT training images/s, step time, memory and MFU per GPU from one command.

    python -m benchmarks.gpu                        # on the CUDA device present (~5 min on one H100)
    python -m benchmarks.gpu --out $OUT             # results elsewhere (the device tool returns $OUT)
    python -m benchmarks.gpu --device cpu --tiny    # the same code on CPU at toy sizes (the test suite)

On synthetic data already on the device (the compute side only), one process, contenders interleaved
round by round, medians:

1. ``peak``: bf16 and fp16 FLOP/s of an 8192^3 matmul (128^3 under ``--tiny``), and the dense
   datasheet peak where the device's name is an H100, H200, GH200 or A100, a MIG slice's share of
   it (`device.datasheet_peak`).
2. ``train``: ViT-B/16 at 224 px, micro-batch 256 (halved until it fits, reported), accumulation 4:
   vitlarge's engine (`train.EngineRun`) in fp16 and bf16 against a bare loop with timm's Lamb
   (`benchmarks.harness.loop.BareLoop`), and the bf16 engine with ``train.compile=on`` (``vitlarge_compiled_bf16``;
   compiled in its warm-up, not under ``--tiny``): images/s, step time, peak memory (each contender's own, above what the
   others hold), MFU. Model FLOPs: 3 x the forward FLOPs that `vitlarge.model.vit.describe_model` counts
   (``FlopCounterMode`` on the meta device: every matmul, attention included); recomputation is
   not counted, as usual for MFU.
3. ``optimizer``: the step alone (`benchmarks.gpu.optim`): ms per step, kernel launches and host syncs per step.
4. ``large``: ViT-L/16 and ViT-H/14 with activation checkpointing, bf16, accumulation 1: the
   largest micro-batch that fits (doubling until out of memory, then bisection), its images/s and
   peak memory, next to the recipe's micro-batch.

The engine's Booster is Colossal-AI's (`vitlarge.train.assemble.build`, TorchDDPPlugin at world size 1) when
Colossal-AI imports with the torch present, else `train.PlainBooster`; the output names the path.
Nothing imported at module load needs Colossal-AI, DALI, TFRecord or crc32c. Writes ``gpu.json``
(atomically, `benchmarks.results.write_result`) and ``gpu.md`` (the docs/PERFORMANCE.md section,
`benchmarks.gpu.report`) into ``--out``: benchmarks/results by default, a temp dir under ``--tiny``;
both after every section (``"complete": false`` until the end: `run`). Exit 0 when complete, 1 when
a section failed (its traceback printed, the other sections measured), 2 for a bad ``--device``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import torch

from benchmarks.gpu import device as dev
from benchmarks.gpu.request import Request
from benchmarks.harness import results, timing  # noqa: I001  (first: it sets OMP_WAIT_POLICY before torch loads)
from vitlarge.errors import UserError, cli_main

SECTIONS = ("peak", "optimizer", "recipes", "train", "large")  # run in this order
DEFAULT_SECTIONS = ("optimizer", "recipes")  # train and large: the first kit's sections, on request


def choose_path(requested: str) -> tuple[str, str]:
    """``("colossalai" | "plain", why)``: Colossal-AI's Booster if it imports (``auto``), or as told."""
    if requested == "plain":
        return "plain", "--path plain"
    try:
        from vitlarge.distributed.booster import Booster  # noqa: F401  (without peft, transformers, bitsandbytes)
    except Exception as e:  # ImportError, or its torch version pin failing at import
        if requested == "colossalai":
            raise UserError(
                f"--path colossalai: Colossal-AI does not import ({type(e).__name__}: {e}); use --path auto or plain"
            ) from None
        return "plain", (
            f"Colossal-AI does not import with torch {torch.__version__} "
            f"({type(e).__name__}: {str(e)[:120]}): vitlarge's Engine/LAMB/Precision without a Booster"
        )
    return "colossalai", "Colossal-AI imports: vitlarge.train.assemble.build with Booster(TorchDDPPlugin), world size 1"


def init_process_group(device: torch.device) -> None:
    """World size 1 through vitlarge.distributed.process, as train.py does (DDP needs a process group)."""
    from vitlarge.distributed import launcher, process

    env = launcher.DistEnv(0, 1, 0, "127.0.0.1", launcher.free_port(), "single")
    process.init_distributed(env, "nccl" if device.type == "cuda" else "gloo")


def sizes(tiny: bool) -> dict:
    if tiny:
        return dict(
            matmul_n=128,
            micro=4,
            accum=2,
            rounds=2,
            steps=1,
            warmup=1,
            opt_rounds=2,
            profile_steps=1,
            large_start=2,
            large_cap=4,
            gemm_iters=2,
        )
    return dict(
        matmul_n=8192,
        micro=256,
        accum=4,
        rounds=5,
        steps=3,
        warmup=2,
        opt_rounds=10,
        profile_steps=3,
        large_start=16,
        large_cap=1024,
        gemm_iters=10,
    )


def peak_section(device: torch.device, n: int) -> dict:
    measured = {}
    for _ in range(2):  # alternate so both dtypes see the same clocks
        for name, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
            measured.setdefault(name, []).append(
                timing.matmul_peak(n, dt, 5, device, iters=10, warmup=3)["flops_per_s"]
            )
    info = dev.device_info(device)
    return {
        "measured": {k: {"n": n, "flops_per_s": timing.median(v)} for k, v in measured.items()},
        "datasheet": dev.datasheet_peak(info["name"], info["multiprocessors"]) if device.type == "cuda" else None,
    }


COMPILE_SKIPPED = "not compiled under --tiny (compiling takes about a minute on a CPU): the eager engine's code"


def build_contenders(micro: int, s: dict, device, path: str, tiny: bool) -> tuple[dict, dict]:
    """All five training contenders at ``micro``, each warmed up (the compiled one compiles in its warm-up,
    outside the timing); its own peak memory measured then. ``vitlarge_compiled_bf16`` is the bf16 engine
    with ``train.compile=on`` (what ``auto`` gives on CUDA), except under ``--tiny`` (`COMPILE_SKIPPED`)."""
    from benchmarks.gpu.train import EngineRun, kit_config
    from benchmarks.harness.loop import BareLoop, timm_lamb

    made, memory = {}, {}
    for prec, side in (
        ("bf16", "vitlarge"),
        ("bf16", "bare"),
        ("fp16", "vitlarge"),
        ("fp16", "bare"),
        ("bf16", "vitlarge_compiled"),
    ):
        cfg = kit_config("vit_b16", prec, micro, s["accum"], tiny, compile=side.endswith("compiled") and not tiny)
        base = dev.allocated(device)
        dev.reset_peak(device)
        c = EngineRun(cfg, device, path) if side.startswith("vitlarge") else BareLoop(cfg, device, timm_lamb)
        for _ in range(s["warmup"]):
            c.step()
        dev.synchronize(device)
        made[f"{side}_{prec}"], memory[f"{side}_{prec}"] = c, dev.peak_since_reset(device, base)
    return made, memory


def train_section(device: torch.device, path: str, s: dict, peak: dict, tiny: bool) -> dict:
    from benchmarks.gpu.train import kit_config
    from vitlarge.model.vit import describe_model

    micro, tries, made = s["micro"], [], None
    while micro >= 1:
        box = {}
        ok = dev.fits(
            lambda: box.update(zip(("made", "memory"), build_contenders(micro, s, device, path, tiny))), device
        )
        tries.append({"micro_batch": micro, "fits": ok})
        if ok:
            made, memory = box["made"], box["memory"]
            break
        box.clear()
        dev.free_memory(device)
        micro //= 2
    if made is None:
        raise RuntimeError("ViT-B/16 does not fit at micro-batch 1")
    cfg = kit_config("vit_b16", "bf16", micro, s["accum"], tiny)
    info = describe_model(cfg)
    per_image = 3 * info["fwd_flops"]
    images = micro * s["accum"]
    skipped_before = {n: c.skipped for n, c in made.items()}  # warm-up steps; read outside the timing
    times = timing.interleaved(
        {
            n: (lambda c=c: timing.device_seconds(lambda: [c.step() for _ in range(s["steps"])], device) / s["steps"])
            for n, c in made.items()
        },
        s["rounds"],
    )
    res = {}
    for name, t in times.items():
        step_s = timing.median(t)
        ips = images / step_s
        res[name] = {
            "precision": name.rsplit("_", 1)[1],
            "optimizer": "vitlarge Lamb" if name.startswith("vitlarge") else "timm Lamb",
            "step_s": timing.summary(t),
            "images_per_s": round(ips, 3),
            "peak_memory_bytes": memory[name],
            "skipped_steps": made[name].skipped - skipped_before[name],
            "mfu": dev.mfu(ips * per_image, peak, name.rsplit("_", 1)[1]),
        }
    for prec in ("bf16", "fp16"):
        res[f"vitlarge_{prec}"]["vs_bare"] = round(
            res[f"vitlarge_{prec}"]["images_per_s"] / res[f"bare_{prec}"]["images_per_s"], 4
        )
    compiled = res["vitlarge_compiled_bf16"]
    compiled.update(
        vs_bare=round(compiled["images_per_s"] / res["bare_bf16"]["images_per_s"], 4),
        vs_eager=round(compiled["images_per_s"] / res["vitlarge_bf16"]["images_per_s"], 4),
        compiled=not tiny,
        **({"note": COMPILE_SKIPPED} if tiny else {}),
    )
    return {
        "model": cfg.model.name,
        "model_kwargs": cfg.model.kwargs,
        "image_size": cfg.data.image_size,
        "micro_batch_requested": s["micro"],
        "micro_batch": micro,
        "accum_steps": s["accum"],
        "fit_tries": tries,
        "params": info["params"],
        "train_flops_per_image": per_image,
        "six_params_tokens_flops_per_image": 6 * info["params"] * info["tokens"],
        "rounds": s["rounds"],
        "steps_per_round": s["steps"],
        "skipped_steps_note": "optimizer steps skipped (non-finite gradients, fp16 scale dropped) among the "
        "timed ones: a skipped step does no update and is cheaper",
        "results": res,
    }


def largest_fit(make, cfg, device, start: int, cap: int) -> tuple[int, list, object]:
    """Largest micro-batch in [1, cap] for which one step of the run ``make()`` builds fits, 0 if none: doubling
    from ``start`` (halving if ``start`` fails) to the first size that fails, then 3 bisection steps
    between the last size that fit and it (to within 1/8 of that interval). Returns the size, the tries and
    the run to time it with.

    After each out-of-memory step the run is built afresh: a step that ran out of memory in its backward
    leaves DDP's reducer waiting for the gradients it never got, and that run's next forward raises
    "Expected to have finished reduction in the prior iteration" (a RuntimeError, not an out-of-memory)."""
    from benchmarks.gpu.train import synthetic_batch

    runs = [make()]

    def ok(b: int) -> bool:
        runs[-1].set_batch(synthetic_batch(cfg, device, b))
        fit = dev.fits(runs[-1].step, device)
        tries.append({"micro_batch": b, "fits": fit})
        if not fit:
            runs[-1] = None  # its memory goes before the new run takes any
            dev.free_memory(device)
            runs[-1] = make()
        return fit

    tries, bad = [], None
    if ok(start):
        good = start
        while good * 2 <= cap:
            if not ok(good * 2):
                bad = good * 2
                break
            good *= 2
    else:  # even the start failed: go down, then bisect up from what fits
        bad, good = start, start // 2
        while good >= 1 and not ok(good):
            bad, good = good, good // 2
        if good < 1:
            return 0, tries, runs[-1]
    if bad is not None:
        for _ in range(3):
            mid = (good + bad) // 2
            if mid in (good, bad):
                break
            good, bad = (mid, bad) if ok(mid) else (good, mid)
    return good, tries, runs[-1]


def large_section(device: torch.device, path: str, s: dict, peak: dict, tiny: bool, done=lambda out: None) -> dict:
    """ViT-L/16 then ViT-H/14; ``done(results so far)`` after each model (the caller saves them)."""
    from benchmarks.gpu.train import RECIPES, EngineRun, kit_config, synthetic_batch
    from benchmarks.harness.recipe import ROOT
    from vitlarge.config.load import load_recipe
    from vitlarge.model.vit import describe_model

    out = {}
    for recipe in ("vit_l16", "vit_h14"):
        recipe_micro = load_recipe(ROOT / "recipes" / f"{recipe}.py").train.micro_batch
        cfg = kit_config(recipe, "bf16", recipe_micro, 1, tiny)
        cfg.train.activation_checkpointing = "full"
        dev.free_memory(device)
        best, tries, run = largest_fit(
            lambda: EngineRun(cfg, device, path),
            cfg,
            device,
            s["large_start"],
            s["large_cap"],  # noqa: B023
        )
        entry = {
            "name": RECIPES[recipe],
            "model": cfg.model.name,
            "model_kwargs": cfg.model.kwargs,
            "image_size": cfg.data.image_size,
            "activation_checkpointing": "full",
            "precision": "bf16",
            "recipe_micro_batch": recipe_micro,
            "micro_batch": best,
            "search_cap": s["large_cap"],
            "fit_tries": tries,
            "recipe_micro_batch_fits": best >= recipe_micro,
        }
        t = []
        while best and not t:  # after an out-of-memory probe, fragmentation can fail the size that fit
            run.set_batch(synthetic_batch(cfg, device, best))
            dev.reset_peak(device)
            if not dev.fits(
                lambda: t.extend(
                    timing.device_seconds(lambda: [run.step() for _ in range(s["steps"])], device) / s["steps"]  # noqa: F821
                    for _ in range(s["rounds"])
                ),
                device,
            ):
                t.clear()
                best = best * 7 // 8
                run = None  # out of memory mid-step: a fresh run (largest_fit says why)
                dev.free_memory(device)
                run = EngineRun(cfg, device, path)
                entry.update(micro_batch=best, timed_lower=True)
        if best:
            info = describe_model(cfg)
            ips = best / timing.median(t)
            entry.update(
                step_s=timing.summary(t),
                images_per_s=round(ips, 3),
                params=info["params"],
                peak_memory_bytes=dev.peak_since_reset(device),
                mfu=dev.mfu(ips * 3 * info["fwd_flops"], peak, "bf16"),
            )
        out[recipe] = entry
        del run
        done(out)
    return out


def run(device: torch.device, request: Request, save=lambda result: None) -> dict:
    """All of ``request``'s sections in order; ``save(result)`` after each (and after each large model), so what finished
    survives a later failure or a time limit, marked ``"complete": false`` until the end.

    The peak runs first (MFU needs it) and a failure there ends the run. A failure in a later
    section (a CUDA error other than out-of-memory, a bug) is printed with its traceback, recorded
    under ``failed`` and the next section still runs; ``complete`` is then false at the end too."""
    t_start = time.perf_counter()
    tiny, deterministic, only = request.tiny, request.deterministic, request.sections
    s = sizes(tiny)
    path, why = choose_path(request.path)
    print(f"benchmarks.gpu: path {path}: {why}", flush=True)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # device has its index (device.resolve_device)
    else:
        torch.set_num_threads(results.threads(tiny))
    from vitlarge.train.settings import apply_determinism

    # As train.py does before its first kernel: the recipes run deterministic (train.deterministic, default
    # on), which costs some kernels speed; --deterministic off measures what the flag gives back.
    determinism = apply_determinism(deterministic, device) or f"deterministic: {'on' if deterministic else 'off'}"
    print(f"benchmarks.gpu: {determinism}", flush=True)
    if path == "colossalai":
        init_process_group(device)
    result = {
        "deterministic": deterministic,
        "benchmark": "GPU kit: ViT training throughput and MFU per device, synthetic data on the device",
        "device": dev.device_info(device),
        "path": path,
        "path_why": why,
        "tiny": tiny,
        "flops_method": "3 x forward FLOPs from vitlarge.model.vit.describe_model (FlopCounterMode, meta device; "
        "attention included, recomputation not)",
        "sections": list(only),
        "overrides": list(request.overrides),
        "time_budget_s": request.time_budget,
        "complete": False,
        "failed": {},
    }
    t0 = time.perf_counter()

    def checkpoint(what: str) -> None:
        result["seconds"] = round(time.perf_counter() - t0, 1)
        save(result)
        print(f"benchmarks.gpu: {what} ({result['seconds']:.0f} s, saved)", flush=True)

    result["peak"] = peak_section(device, s["matmul_n"])
    checkpoint("peak done")
    for name in (n for n in SECTIONS[1:] if n in only):
        try:
            if name == "recipes":
                from benchmarks.gpu import recipes as gpu_recipes

                def recipe_done(out: dict) -> None:
                    result["recipes"] = out
                    checkpoint("recipes: a row done")

                deadline = request.deadline(t_start)
                result["recipes"] = gpu_recipes.run(device, path, s, result["peak"], request, deadline, recipe_done)
                result["finish_with"] = gpu_recipes.finish_command(result["recipes"])
            elif name == "train":
                result["train"] = train_section(device, path, s, result["peak"], tiny)
            elif name == "optimizer":
                from benchmarks.gpu import optim as gpu_optim
                from benchmarks.gpu.train import kit_config

                result["optimizer"] = gpu_optim.run(
                    kit_config("vit_b16", "bf16", s["micro"], s["accum"], tiny),
                    device,
                    s["opt_rounds"],
                    s["profile_steps"],
                )
            else:

                def model_done(out: dict) -> None:
                    result["large"] = out
                    checkpoint(f"large: {list(out)[-1]} done")

                large_section(device, path, s, result["peak"], tiny, model_done)
        except Exception as e:  # noqa: BLE001  (recorded and shown; the other sections still measure)
            traceback.print_exc()
            result["failed"][name] = f"{type(e).__name__}: {str(e)[:300]}"
        checkpoint(f"{name} {'FAILED' if name in result['failed'] else 'done'}")  # before freeing: a sticky
        dev.free_memory(device)  # CUDA error fails empty_cache too, and then the failure is on disk already
    result["complete"] = not result["failed"]
    checkpoint("complete" if result["complete"] else f"finished with failed sections: {', '.join(result['failed'])}")
    return result


def quiet_known_warnings() -> None:
    """Silences Colossal-AI's import-time notices (no apex, no tensornvme): nothing the kit runs uses
    them. Every other warning prints (torch's deprecations included)."""
    warnings.filterwarnings("ignore", module=r"colossalai(\.|$)")


def pick_device(spec: str) -> torch.device:
    """The ``--device`` value as a device with its index (`device.resolve_device`), or a UserError."""
    try:
        kind = torch.device(spec).type
    except RuntimeError:
        kind = None
    if kind not in ("cuda", "cpu"):
        raise UserError(f"--device {spec}: use cuda, cuda:N or cpu")
    if kind == "cuda" and not torch.cuda.is_available():
        raise UserError(
            f"--device {spec}: torch {torch.__version__} sees no CUDA device; "
            "run on a GPU machine, or --device cpu --tiny for the smoke run"
        )
    device = dev.resolve_device(spec)
    if device.type == "cuda" and device.index >= torch.cuda.device_count():
        raise UserError(
            f"--device {spec}: torch sees {torch.cuda.device_count()} CUDA device(s), "
            f"cuda:0 to cuda:{torch.cuda.device_count() - 1}"
        )
    return device


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    p.add_argument("--tiny", action="store_true", help="toy sizes (seconds on a CPU); the numbers mean nothing")
    p.add_argument("--out", help="folder for gpu.json and gpu.md (default: benchmarks/results; a temp dir with --tiny)")
    p.add_argument(
        "--path",
        choices=("auto", "plain", "colossalai"),
        default="auto",
        help="the engine's Booster: Colossal-AI's if it imports (auto), or forced",
    )
    p.add_argument(
        "--only",
        nargs="+",
        choices=SECTIONS[1:],
        default=list(DEFAULT_SECTIONS),
        help=f"sections to run (default: {' '.join(DEFAULT_SECTIONS)}; the matmul peak always runs)",
    )
    p.add_argument(
        "--rows",
        nargs="+",
        default=[],
        metavar="RECIPE.ROW",
        help="with recipes: only these rows (vit_b16.compiled_fp16 ...), e.g. the ones a time budget left out",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a train.py override applied to every recipe row (train.compile=..., train.activation_checkpointing=...)",
    )
    p.add_argument(
        "--time-budget",
        type=float,
        metavar="S",
        help="recipes: start no row that would end past S seconds from the start (it is recorded as not run)",
    )
    p.add_argument(
        "--deterministic",
        choices=("on", "off"),
        default="on",
        help="train.deterministic as the recipes set it (on, default) or off: what the flag costs",
    )
    args = p.parse_args(argv)

    def work():
        from benchmarks.gpu import report as gpu_report
        from vitlarge.fileio import write_atomic

        device = pick_device(args.device)
        if "recipes" in args.only:
            from benchmarks.gpu.recipes import check_arguments

            check_arguments(args.set, args.rows, args.tiny)
        out = args.out or (tempfile.mkdtemp(prefix="vitlarge-gpu-tiny-") if args.tiny else None)
        if out:
            os.environ["VITLARGE_BENCH_RESULTS"] = str(Path(out).resolve())
        written = []

        def save(result: dict) -> None:
            path = results.write_result("gpu", result)
            write_atomic(path.with_name("gpu.md"), "\n".join(gpu_report.section(result)) + "\n")
            written[:] = [path, path.with_name("gpu.md")]

        with warnings.catch_warnings():
            quiet_known_warnings()
            request = Request(
                tiny=args.tiny,
                path=args.path,
                sections=tuple(args.only),
                deterministic=args.deterministic == "on",
                overrides=tuple(args.set),
                rows=tuple(args.rows),
                time_budget=args.time_budget,
            )
            result = run(device, request, save)
        print("\n".join(gpu_report.section(result)))
        print(f"wrote {written[0]} and {written[1]}")
        if result.get("finish_with"):
            print(f"benchmarks.gpu: rows left out by the time budget; finish them with: {result['finish_with']}")
        if not result["complete"]:
            print(
                f"benchmarks.gpu: sections failed: {', '.join(result['failed'])} (tracebacks above); "
                "the others are in the files",
                file=sys.stderr,
            )
            return 1
        return 0

    return cli_main(work)
