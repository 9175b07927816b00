"""Prints the final validation accuracy of a run and where its logs are: ``python -m scripts.summarize WORKDIR``.

What is there, and only that: the final top-1 of a run that ended (its last ``start`` record in metrics.jsonl is
followed by an ``end``), else the step it stopped at and its latest evaluation; the picture, TensorBoard folder
and exported model where they exist.
"""

import sys
from pathlib import Path

from vitlarge.checkpoint.export import EXPORT_DIR
from vitlarge.report.metrics_log import FILENAME, PLOT_FILENAME, STEP_MAX, TB_DIRNAME, read_metrics, value


def _fraction(x: object) -> float | None:
    """A recorded accuracy, a fraction in [0, 1] (`value`); None where the record has none: no run writes 1.7."""
    f = value(x)
    return f if f is not None and 0.0 <= f <= 1.0 else None


def _percent(fraction: float | None) -> str:
    """A recorded accuracy (a fraction) as a percentage; "?" where the record has none (`_fraction`)."""
    return "?" if fraction is None else f"{100 * fraction:.2f}%"


def main(argv: list[str] | None = None) -> int:
    """``argv``: the workdir (default ``runs/demo_digits``, the demo's); the exit status (2: no result yet)."""
    workdir = (argv or ["runs/demo_digits"])[0]
    path = Path(workdir) / FILENAME
    if not path.is_file():
        print(f"error: {path} does not exist; did the run start?", file=sys.stderr)
        return 2
    records = read_metrics(str(path))
    events = [r.get("event") for r in records]
    last_start = max((i for i, e in enumerate(events) if e == "start"), default=-1)
    ended = "end" in events[last_start + 1 :]
    ends = [r for r in records if r.get("event") == "end"]
    if not ended:
        starts = [r for r in records if r.get("event") == "start"]
        steps = [r["step"] for r in records if r.get("event") == "train" and isinstance(r.get("step"), int)]
        total = starts[-1].get("total_steps") if starts else None
        total = total if type(total) is int and 0 < total <= STEP_MAX else None  # data: no text printed from it
        at = max(steps, default=starts[-1].get("step", 0) if starts else 0)
        print(f"the run has not ended: it stopped at step {at}" + (f" of {total}" if total else ""))
    evals = [r for r in records if r.get("event") == "eval"]
    if not evals:
        print(f"error: {path} has no evaluation yet", file=sys.stderr)
        return 2
    last = evals[-1]
    top1, top5, loss = _fraction(last.get("val_top1")), _fraction(last.get("val_top5")), value(last.get("val_loss"))
    images = last.get("val_images")
    print(
        f"{'final' if ended else 'latest'} validation top-1 {_percent(top1)} (top-5 {_percent(top5)}, loss "
        f"{'?' if loss is None else f'{loss:.4f}'}) at step {last['step']} on "
        f"{images if type(images) is int and 0 <= images <= STEP_MAX else '?'} images"
    )
    if top1 is None:
        print(
            f"error: {path}: the evaluation at step {last['step']} records no val_top1 (missing, not a number or out "
            "of range); its top-1 is had again with python -m vitlarge.evaluate --config <recipe> --checkpoint <step_N>",
            file=sys.stderr,
        )
        return 2
    w = Path(workdir)
    where = [f"picture: {w / PLOT_FILENAME}"] if (w / PLOT_FILENAME).is_file() else []
    where.append(f"logs: {path}")
    if (w / TB_DIRNAME).is_dir():
        where.append(f"TensorBoard: tensorboard --logdir {w / TB_DIRNAME}")
    print("  ".join(where))
    model = w / EXPORT_DIR
    if (model / "config.json").is_file():
        step = ends[-1].get("step") if ends else None  # an end record's step is not checked when read: data
        step = step if type(step) is int and 0 <= step <= STEP_MAX else "?"
        earlier = f" (exported at step {step}, before the last start)" if ends and not ended else ""
        print(f'model: {model}{earlier}  (timm.create_model("local-dir:{model}", pretrained=True))')
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
