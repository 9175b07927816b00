"""Progressive resolution vs fixed resolution on the digits demo, and fine-tuning its export at 24 px.

Question: Does progressive resolution reach fixed resolution's accuracy in less time?
Goal: progressive >= 97% top-1, within 0.5 point of fixed, and a shorter ``train_s``.

Run: ``python -m benchmarks.bench_progressive [--rounds 2]`` (2 CPU processes through
``colossalai run``, OMP_NUM_THREADS=1; ~3 min per training run on an idle 2-core machine). Writes
``benchmarks/results/progressive.json`` and ``docs/img/progressive.png``.

Each round trains ``recipes/demo_digits.py`` then ``recipes/demo_digits_progressive.py`` (A B A B...),
full 60-epoch schedules, the same command line otherwise, so load from other processes on a shared
machine hits both alike. Reported per run: final top-1, the wall time of the whole command and the
training time (sum of the step times in metrics.jsonl). Then ``recipes/demo_digits_ft24.py`` fine-tunes
the first fixed run's export at 24 px: top-1 after each epoch. Goals (docs/PROGRESSIVE.md): progressive
>= 97% top-1, within 0.5 point of fixed, and faster. Not run by ``benchmarks.run`` (listed there): it trains
whole schedules, which the benchmark smoke test cannot afford.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.harness import results
from benchmarks.harness.runs import train

ROOT = Path(__file__).resolve().parent.parent


def plot(result: dict, path: Path) -> None:
    """Top-1 against training seconds (fixed vs progressive, every round), and the fine-tune's top-1 per epoch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for run in result["runs"]:
        prog = "progressive" in run["recipe"]
        a.plot(
            [t for _, _, t in run["evals"]],
            [100 * v for _, v, _ in run["evals"]],
            "o-" if prog else "s--",
            color="tab:orange" if prog else "tab:blue",
            alpha=0.8,
            label=f"{'progressive' if prog else 'fixed 16 px'}: {100 * run['top1']:.2f}%, {run['train_s']:.0f} s",
        )
    a.set(
        xlabel="training seconds (sum of step times, 2 CPU processes)",
        ylabel="val top-1 (%)",
        ylim=(85, 100),
        title="digits demo: fixed vs progressive resolution",
    )
    a.legend(fontsize=8)
    ft = result["finetune"]["evals"]
    b.plot([e for e, _, _ in ft], [100 * v for _, v, _ in ft], "o-", color="tab:green")
    b.set(xlabel="epoch", ylabel="val top-1 at 24 px (%)", title="fine-tuning the demo export at 24 px")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--workdir", default="runs/bench_progressive")
    args = p.parse_args()
    root = Path(args.workdir)
    runs = []
    for i in range(args.rounds):
        for name in ("demo_digits", "demo_digits_progressive"):
            runs.append(train(f"recipes/{name}.py", root / f"{name}_{i}"))
            print(json.dumps(runs[-1]), flush=True)
    ft = train("recipes/demo_digits_ft24.py", root / "ft24", f"model.init_from={root / 'demo_digits_0' / 'model'}")
    print(json.dumps(ft), flush=True)
    result = dict(runs=runs, finetune=ft)
    out = results.write_result("progressive", result)
    plot(result, ROOT / "docs" / "img" / "progressive.png")
    print(f"wrote {out} and docs/img/progressive.png")


if __name__ == "__main__":
    main()
