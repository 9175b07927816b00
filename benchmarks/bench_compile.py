"""Step time with and without torch.compile on this CPU, through vitlarge's Engine (``train.compile``).

Question: Does ``train.compile=on`` pay for its compile time on this CPU?
Goal: no target: the figures are ``speed_vs_eager`` per step and ``compile_s``.

Run: ``python -m benchmarks.bench_compile [--quick]`` (CPU, 2 threads; compiling ViT-S/16 takes
minutes on 2 cores). Writes ``benchmarks/results/compile.json``.

ViT-S/16 at 64 px (17 tokens), micro-batch 32, fp32 (what ``precision: auto`` picks on a CPU without
fp16/bf16 matrix units), LAMB, one process, Booster DDP on gloo world 1: two engines built by
`vitlarge.train.assemble.build`, ``train.compile=off`` and ``on``. The first step of each is timed apart (the
compiled one's is the compile time: Dynamo tracing, AOTAutograd, Inductor's C++ code generation and
build, forward and backward); then both are timed step by step, interleaved, medians.
"""

from __future__ import annotations

import json

from benchmarks.bench_train import bench_config
from benchmarks.harness import results, timing
from benchmarks.harness.loop import build_engine, engine_stepper, make_batches, single_process

CONTENDERS = ("eager", "compiled")


def config(tiny: bool, mode: str):
    cfg = bench_config(tiny, "fp32", image_size=64)
    if tiny:  # still compiled (the smoke test runs the path), one block: half the compile time
        cfg.model.kwargs["depth"] = 1
    cfg.train.compile = "on" if mode == "compiled" else "off"
    return cfg


def run(quick: bool = True, tiny: bool = False) -> dict:
    tiny = results.is_tiny(tiny)
    threads = single_process(tiny)
    repeats, steps = (1, 1) if tiny else (3, 2) if quick else (5, 4)
    batches = make_batches(config(tiny, "eager"))
    from torch._dynamo.utils import counters

    graphs_before = int(counters["stats"]["unique_graphs"])  # the suite's other benchmarks share the process
    steppers, first = {}, {}
    for name in CONTENDERS:
        steppers[name] = engine_stepper(build_engine(config(tiny, name)), batches)
        first[name] = timing.timed(steppers[name])  # the compiled engine compiles here
        steppers[name]()  # warm-up: optimizer state, oneDNN primitive caches

    times = timing.interleaved_wall_cpu(
        {name: (lambda s=s: timing.per_step(s, steps)) for name, s in steppers.items()}, repeats
    )
    cfg = config(tiny, "eager")
    micro = cfg.train.micro_batch
    res = {}
    for name, t in times.items():
        w = timing.median(t["wall_s"])
        res[name] = {
            "step_s": timing.summary(t["wall_s"]),
            "cpu_s_per_step": timing.summary(t["cpu_s"]),
            "images_per_s": round(micro / w, 2),
            "first_step_s": round(first[name][0], 2),
            "first_step_cpu_s": round(first[name][1], 2),
        }
    for r in res.values():
        r["speed_vs_eager"] = round(res["eager"]["step_s"]["median"] / r["step_s"]["median"], 3)
        r["speed_vs_eager_cpu"] = round(res["eager"]["cpu_s_per_step"]["median"] / r["cpu_s_per_step"]["median"], 3)
    result = {
        "benchmark": "compile: step time with train.compile on vs off, CPU",
        **results.describe(cfg, tiny, quick, repeats, steps, threads, precision=True),
        "graphs": int(counters["stats"]["unique_graphs"]) - graphs_before,
        "compile_s": round(first["compiled"][0] - first["eager"][0], 1),
        "results": res,
    }
    results.write_result("compile", result)
    return result


def show(r: dict) -> None:
    print(
        json.dumps(
            {
                "compile_s": r["compile_s"],
                **{
                    k: {
                        x: v[x]
                        for x in ("step_s", "images_per_s", "speed_vs_eager", "speed_vs_eager_cpu", "first_step_s")
                    }
                    for k, v in r["results"].items()
                },
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    results.cli(run, __doc__, show)
