"""Rectangular validation (``data.rect_val``) against the square centre crop: top-1, exactness and the cost of a pass.

Question: Does rectangular validation score at least the square crop where the evidence sits near the long
edges, exactly the square crop's on square images, the same at any world size, and what does a pass cost?
Goal: aspect-varied set: rectangular top-1 >= square; digits: the two agree exactly (top-1, top-5, loss);
each the same at world sizes 1 and 3 and equal to the run's own final evaluation (2 processes).

Run: ``python -m benchmarks.bench_rect_val [--rounds 5] [--port 31400]`` (2 CPU processes through
``colossalai run`` for the training, ~1-2 min per run on an idle 2-core machine; the rest in this process).
Writes ``benchmarks/results/rect_val.json``. Not run by ``benchmarks.run`` (listed there): it trains whole
schedules, which the benchmark smoke test cannot afford.

Makes both data sets under ``--workdir`` (data_tools/make_aspect_dataset.py: 2,000 / 400 images of aspect
1:1 to 2.5:1 whose class shows only as colour bands across the ends of the longer side; the digits demo's
1,797 square images), trains ``recipes/demo_aspect.py`` and ``recipes/demo_digits.py`` (their whole
schedules; training is the same whichever crop validates), then evaluates each export here with
``data.rect_val`` false and true through the real loaders and `vitlarge.train.validation.evaluate` (what
train.py's evaluation runs): at world size 1, and at 3 with the ranks run one after another and their sums
combined as the all-reduce combines them. Cost: a square and a rectangular pass interleaved, ``--rounds``
rounds, wall seconds of a whole pass (loader and forward) and of the loader alone, and the tokens per image;
one torch thread and one DALI thread, as each of the runs' 2 processes (OMP_NUM_THREADS=1): two threads of
this process on a shared 2-core machine measured oversubscription, not the crop.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

from benchmarks.harness import results
from benchmarks.harness.runs import ROOT, train
from benchmarks.harness.timing import interleaved

CROPS = {"square": False, "rectangular": True}


def load_run_config(recipe: str, data: Path):
    from vitlarge.config.load import load_config

    return load_config(ROOT / "recipes" / f"{recipe}.py", [f"data.path={data}", "train.precision=fp32"])


def model_of(cfg, export: Path, rect: bool):
    from vitlarge.checkpoint import weights
    from vitlarge.model.vit import build_model

    c = copy.deepcopy(cfg)
    c.data.rect_val = rect
    model = build_model(c)
    weights.load_model_weights(str(export), model, c)
    return c, model.eval()


def scores(cfg, export: Path, rect: bool, world: int) -> dict:
    """top-1, top-5, loss and images over the split at ``world`` ranks, run one after another: each rank's
    sums (its fractions times its images) added, as the all-reduce adds them."""
    import torch

    from vitlarge.data.sources import val_loader
    from vitlarge.model.precision import Precision
    from vitlarge.train.validation import evaluate

    c, model = model_of(cfg, export, rect)
    cpu = torch.device("cpu")
    total = dict(top1=0.0, top5=0.0, loss=0.0, images=0)
    for rank in range(world):
        m = evaluate(model, val_loader(c, rank, world, cpu), Precision("fp32", cpu))
        n = m["val_images"]
        total["top1"] += m["val_top1"] * n
        total["top5"] += m["val_top5"] * n
        total["loss"] += m["val_loss"] * n
        total["images"] += n
    n = total["images"]
    return dict(top1=total["top1"] / n, top5=total["top5"] / n, loss=total["loss"] / n, images=n)


def costs(cfg, export: Path, rounds: int) -> dict:
    """Seconds per pass (loader and forward; loader alone) of each crop, interleaved, and tokens per image."""
    import torch

    from vitlarge.config.phase_list import patch_size
    from vitlarge.data.sources import val_loader
    from vitlarge.model.precision import Precision
    from vitlarge.train.validation import evaluate

    cpu, patch = torch.device("cpu"), patch_size(cfg)
    built = {name: model_of(cfg, export, rect) for name, rect in CROPS.items()}
    loaders = {name: val_loader(c, 0, 1, cpu) for name, (c, _) in built.items()}

    def whole(name: str):
        def once() -> float:
            t = time.perf_counter()
            evaluate(built[name][1], loaders[name], Precision("fp32", cpu))
            return time.perf_counter() - t

        return once

    def loader_only(name: str):
        def once() -> float:
            t = time.perf_counter()
            for _ in loaders[name].masked():
                pass
            return time.perf_counter() - t

        return once

    passes = interleaved(
        {f"{n}_pass": whole(n) for n in CROPS} | {f"{n}_loader": loader_only(n) for n in CROPS}, rounds
    )
    tokens = {}
    for name, loader in loaders.items():
        counts = [x.shape[2] * x.shape[3] // patch**2 for x, _, keep in loader.masked() for _ in range(keep)]
        tokens[name] = statistics.mean(counts)
    out = {
        k: dict(median_s=round(statistics.median(v), 3), every_s=[round(x, 3) for x in v]) for k, v in passes.items()
    }
    ratio = {
        "pass": out["rectangular_pass"]["median_s"] / out["square_pass"]["median_s"],
        "loader": out["rectangular_loader"]["median_s"] / out["square_loader"]["median_s"],
        "tokens": tokens["rectangular"] / tokens["square"],
    }
    shapes = sorted({tuple(x.shape[2:]) for x, _, _ in loaders["rectangular"].masked()})
    return dict(
        seconds=out,
        tokens_per_image={k: round(v, 2) for k, v in tokens.items()},
        rect_over_square={k: round(v, 3) for k, v in ratio.items()},
        rect_shapes=[list(s) for s in shapes],
    )


def measure(recipe: str, data: Path, export: Path, final_eval: dict | None, rounds: int) -> dict:
    cfg = load_run_config(recipe, data)
    out: dict = {}
    for name, rect in CROPS.items():
        out[name] = {f"world_{w}": scores(cfg, export, rect, w) for w in (1, 3)}
        print(recipe, name, json.dumps(out[name]), flush=True)
    if final_eval is not None:
        out["in_training_final"] = final_eval
    out["cost"] = costs(cfg, export, rounds)
    print(recipe, "cost", json.dumps(out["cost"]["rect_over_square"]), flush=True)
    return out


def final_eval(workdir: Path) -> dict:
    """The run's last evaluation in metrics.jsonl (its own crop, 2 processes)."""
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    last = [x for x in records if x["event"] == "eval"][-1]
    return {k: last[k] for k in ("step", "val_top1", "val_top5", "val_loss", "val_images")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--workdir", default="runs/bench_rect_val")
    p.add_argument("--port", type=int, default=None, help="colossalai run's --master_port")
    p.add_argument(
        "--no-train",
        action="store_true",
        help="measure the exports a previous run left in --workdir (its training figures kept from the results file)",
    )
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    from data_tools.make_aspect_dataset import make_aspect_dataset
    from data_tools.make_demo_dataset import make_demo_dataset

    root = Path(args.workdir).resolve()
    sets = {"demo_aspect": root / "data" / "aspect", "demo_digits": root / "data" / "digits"}
    t = time.perf_counter()
    make_aspect_dataset(str(sets["demo_aspect"]))
    make_demo_dataset(str(sets["demo_digits"]))
    made_s = round(time.perf_counter() - t, 1)
    result: dict = dict(data_sets_made_s=made_s, torch_threads=1, runs={}, measured={})
    previous = results.results_dir() / "rect_val.json"
    if args.no_train and previous.exists():
        result["runs"] = json.loads(previous.read_text()).get("runs", {})
    for recipe, data in sets.items():
        run_dir = root / recipe
        if not args.no_train:
            result["runs"][recipe] = train(f"recipes/{recipe}.py", run_dir, "--data", str(data), port=args.port)
            print(json.dumps(result["runs"][recipe]), flush=True)
        rect_run = load_run_config(recipe, data).data.rect_val
        result["measured"][recipe] = measure(recipe, data, run_dir / "model", final_eval(run_dir), args.rounds)
        result["measured"][recipe]["run_validated"] = "rectangular" if rect_run else "square"
    out = results.write_result("rect_val", result)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
