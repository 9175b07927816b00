"""A picture of a run: ``python -m vitlarge.report.plot RUN_DIR`` writes ``RUN_DIR/metrics.png``; with two or
more runs (``vitlarge-plot runs/a runs/b --out ab.png``) one picture compares them (`plot_runs`).

Four panels against the optimizer step (epochs on a second axis along the top, as the records count them: a resume
under another global batch goes on at its own steps per epoch): train loss,
learning rate, validation top-1/top-5 (and the model EMA's top-1 when the run has one), and throughput (images/s over all devices). The train loss
and throughput are drawn raw (thin) and as a moving average over ~2% of the run, because one
step's value is noisy at small batch and a resumed run's first step includes start-up. fp16
overflow steps (skipped updates) are marked on the loss panel. Training writes the same picture at
its end (`hooks.plot.PlotHook`).

Reads metrics.jsonl with `vitlarge.report.metrics_log.read_metrics`, so a resumed run shows one history. The title
and the throughput's label describe the run's last segment (its global batch and devices); a dotted line marks each
resume that changed either, labelled old -> new.

The comparison draws each run in a colour of its own, named in the legend: the train loss as its moving
average, the learning rate, the validation top-1 and the throughput, against the optimizer step or, with
``--x epoch``, the epoch each record holds (runs of different global batches take different steps per epoch).
"""

from __future__ import annotations

import argparse
import errno
import io
import math
import sys
from collections import deque
from collections.abc import Callable
from pathlib import Path

from vitlarge.errors import UserError, cli_main
from vitlarge.fileio import UnsafeFile, write_atomic
from vitlarge.report.metrics_log import FILENAME, PLOT_FILENAME, VALUE_MAX, read_metrics, value


def _smooth(values: list[float], window: int) -> list[float]:
    """Trailing mean over the last ``window`` finite values (non-finite ones are skipped, not spread).
    O(len(values)): a running sum, so a run of millions of steps plots in seconds."""
    out, buf, total = [], deque(), 0.0
    for v in values:
        if v is not None and math.isfinite(v):
            buf.append(v)
            total += v
            if len(buf) > window:
                total -= buf.popleft()
        out.append(total / len(buf) if buf else math.nan)
    return out


def _num(x: object) -> float:
    """A record's number; nan (a gap in the line) where `metrics_log.value` finds none: null, text, missing, or
    out of its range (a line from elsewhere)."""
    v = value(x)
    return math.nan if v is None else v


def _label(x: object) -> str:
    """A record's integer or short text for a title or an axis label: "?" for anything else, at most 60 characters,
    ``$`` escaped (matplotlib would read ``$...$`` as mathematics, and fail on what it cannot parse)."""
    if type(x) is int:
        return str(x) if abs(x) <= VALUE_MAX else "?"
    return x[:60].replace("$", r"\$") if isinstance(x, str) else "?"


def _tail(path: str) -> str:
    """A recorded path for a label: its last 60 characters (where it differs from another run's), as `_label`."""
    return _label(path if len(path) <= 60 else "..." + path[-57:])


def _records(workdir: Path) -> tuple[list[dict], list[dict], list[dict]]:
    """``(train, evals, starts)`` records of a run (``starts``: one per segment, at least an empty one); UserError
    where it has none yet."""
    path = workdir / FILENAME
    if not path.is_file():
        raise UserError(f"{path} does not exist; pass the --workdir of a run that has started")
    records = read_metrics(str(path))
    train = [r for r in records if r.get("event") == "train"]
    evals = [r for r in records if r.get("event") == "eval"]
    if not train:
        raise UserError(f"{path} has no training steps yet; plot again after the first step")
    return train, evals, [r for r in records if r.get("event") == "start"] or [{}]


def _steps_per_epoch(train: list[dict], start: dict) -> float:
    steps_per_epoch = _num(start.get("steps_per_epoch"))
    if not steps_per_epoch > 0:  # none recorded (nan fails the test too): from the last step's epoch
        epochs = _num(train[-1].get("epoch"))
        steps_per_epoch = train[-1]["step"] / (max(epochs, 1e-9) if math.isfinite(epochs) else 1.0)
    return steps_per_epoch


def _epoch_scale(train: list[dict], start: dict) -> tuple[Callable, Callable]:
    """step -> epoch and epoch -> step along the epochs the ``train`` records hold (a resume under another global
    batch counts on at its own steps per epoch: one factor cannot fit both segments), extended past the ends at the
    slope of the nearest segment; the ``start`` record's steps per epoch where the records hold fewer than two."""
    import numpy as np  # lazy: numpy comes with matplotlib, off train.py's start-up

    points = sorted({r["step"]: e for r in train if math.isfinite(e := _num(r.get("epoch")))}.items())
    if len(points) < 2:
        per_epoch = _steps_per_epoch(train, start)
        return (lambda s: np.asarray(s) / per_epoch), (lambda e: np.asarray(e) * per_epoch)
    steps = np.array([p[0] for p in points], dtype=float)
    epochs = np.maximum.accumulate(np.array([p[1] for p in points], dtype=float))  # an older log that counted back

    def along(x, xp, fp):
        x = np.asarray(x, dtype=float)
        first = (fp[1] - fp[0]) / (xp[1] - xp[0]) if xp[1] > xp[0] else 0.0
        last = (fp[-1] - fp[-2]) / (xp[-1] - xp[-2]) if xp[-1] > xp[-2] else 0.0
        y = np.interp(x, xp, fp)
        return np.where(x < xp[0], fp[0] + (x - xp[0]) * first, np.where(x > xp[-1], fp[-1] + (x - xp[-1]) * last, y))

    return (lambda s: along(s, steps, epochs)), (lambda e: along(e, epochs, steps))


def _segments(starts: list[dict]) -> tuple[str, list[tuple[int, str]]]:
    """The last segment's ``global batch B on N devices`` and, for each resume that changed the global batch or the
    world size, its step and ``global batch A -> B, M -> N devices`` (the parts that changed)."""
    changes, last = [], starts[0]
    for s in starts[1:]:
        parts = [
            f"{what}{_label(last.get(key))} -> {_label(s.get(key))}{unit}"
            for key, what, unit in (("global_batch", "global batch ", ""), ("world_size", "", " devices"))
            if s.get(key) != last.get(key)
        ]
        if parts and type(s.get("step")) is int:
            changes.append((s["step"], ", ".join(parts)))
        last = s
    now = f"global batch {_label(last.get('global_batch'))} on {_label(last.get('world_size'))} devices"
    return now, changes


def _save(fig, target: Path, root: Path | None) -> Path:
    import matplotlib.pyplot as plt  # lazy: matplotlib, off train.py's start-up (a run draws at its end)

    png = io.BytesIO()
    # fig.tight_layout() leaves a placeholder layout engine, for which savefig draws the whole figure once more
    # before it draws the file; the layout is made: without an engine the figure is drawn once, the same pixels.
    fig.set_layout_engine(None)
    fig.savefig(png, dpi=110, format="png")
    plt.close(fig)
    try:
        write_atomic(target, png.getvalue(), root=root)
    except UnsafeFile as e:
        raise UserError(f"{e.filename}: {e.strerror}; remove it and draw again") from None
    except OSError as e:  # a folder that is not there or not writable: the figure is drawn, the file not written
        where, fix = (
            (f"--out {target}", "pass a PNG file") if root is None else (str(target), "draw it with --out FILE")
        )
        folder = "a folder that exists" if e.errno == errno.ENOENT else "a folder you can write"
        raise UserError(f"{where}: {e.strerror}; {fix} in {folder}") from None
    return target


def plot_run(workdir: str | Path, out: str | Path | None = None) -> Path:
    """Writes the run's picture (PNG, atomically) and returns its path; UserError without records."""
    import matplotlib  # lazy: matplotlib, off train.py's start-up (a run draws at its end)

    matplotlib.use("Agg")  # no display needed; also on a cluster's compute node
    import matplotlib.pyplot as plt  # lazy: as above, once the backend is chosen

    workdir = Path(workdir)
    fig = _run_figure(workdir, plt)
    # The default picture stays inside the workdir (a planted metrics.png link is replaced, not written
    # through: write_atomic); an --out the user names may be anywhere.
    return _save(fig, Path(out), None) if out else _save(fig, workdir / PLOT_FILENAME, workdir)


def _run_figure(workdir: Path, plt):
    """The figure `plot_run` saves (``plt``: matplotlib.pyplot, its backend chosen)."""
    train, evals, starts = _records(workdir)
    to_epoch, to_step = _epoch_scale(train, starts[-1])
    now, changes = _segments(starts)
    steps = [r["step"] for r in train]
    window = max(1, len(train) // 50)

    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    (ax_loss, ax_lr), (ax_acc, ax_speed) = axes

    loss = [_num(r.get("train_loss")) for r in train]
    ax_loss.plot(steps, loss, color="tab:blue", alpha=0.25, linewidth=0.8)
    ax_loss.plot(steps, _smooth(loss, window), color="tab:blue", label=f"train (mean of {window} steps)")
    if evals:
        ax_loss.plot(
            [e["step"] for e in evals],
            [_num(e.get("val_loss")) for e in evals],
            "o-",
            color="tab:orange",
            label="validation",
        )
    skipped = [r["step"] for r in train if r.get("skipped")]
    if skipped:
        finite = [x for x in loss if math.isfinite(x)]
        y = min(finite) if finite else 0.0
        ax_loss.plot(skipped, [y] * len(skipped), "x", color="tab:red", label=f"skipped steps ({len(skipped)})")
    ax_loss.set_ylabel("loss")
    ax_loss.legend(loc="upper right", fontsize=8)

    ax_lr.plot(steps, [_num(r.get("lr")) for r in train], color="tab:green")
    ax_lr.set_ylabel("learning rate")
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))

    if evals:
        es = [e["step"] for e in evals]
        top1 = [100 * _num(e.get("val_top1")) for e in evals]
        ax_acc.plot(es, top1, "o-", color="tab:purple", label="top-1")
        ax_acc.plot(es, [100 * _num(e.get("val_top5")) for e in evals], "s--", color="tab:gray", label="top-5")
        with_ema = [e for e in evals if e.get("val_top1_ema") is not None]
        if with_ema:  # train.ema_decay: the moving average's top-1 beside the raw weights'
            ema_steps = [e["step"] for e in with_ema]
            ax_acc.plot(
                ema_steps, [100 * _num(e["val_top1_ema"]) for e in with_ema], "^-", color="tab:cyan", label="EMA top-1"
            )
        ax_acc.annotate(
            f"{top1[-1]:.2f}%",
            (es[-1], top1[-1]),
            textcoords="offset points",
            xytext=(-10, -14),
            ha="right",
            fontsize=9,
        )
        ax_acc.legend(loc="lower right", fontsize=8)
    else:
        ax_acc.text(0.5, 0.5, "no evaluation yet", ha="center", va="center", transform=ax_acc.transAxes)
    ax_acc.set_ylabel("validation accuracy (%)")
    ax_acc.set_ylim(0, 100)

    speed = [_num(r.get("images_per_s")) for r in train]
    ax_speed.plot(steps, speed, color="tab:brown", alpha=0.25, linewidth=0.8)
    ax_speed.plot(steps, _smooth(speed, window), color="tab:brown")
    ax_speed.set_ylabel(f"images/s ({_label(starts[-1].get('world_size'))} devices)")
    finite = sorted(x for x in speed if math.isfinite(x))
    if finite:  # the first step of each (re)start includes warm-up: keep it from squashing the chart
        ax_speed.set_ylim(0, finite[int(0.98 * (len(finite) - 1))] * 1.2)

    for ax in axes[1]:
        ax.set_xlabel("optimizer step")
    for ax in axes[0]:
        top = ax.secondary_xaxis("top", functions=(to_epoch, to_step))
        top.set_xlabel("epoch", fontsize=8)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        for at, _ in changes:
            ax.axvline(at, color="0.4", linestyle=":", linewidth=1)
    for at, what in changes:
        ax_lr.annotate(
            what,
            (at, 1),
            xycoords=("data", "axes fraction"),
            xytext=(3, -3),
            textcoords="offset points",
            va="top",
            fontsize=7,
            color="0.3",
        )
    config = starts[-1].get("config")
    model = config.get("model") if isinstance(config, dict) else None
    name = _label(model.get("name")) if isinstance(model, dict) else "?"
    fig.suptitle(f"{_label(workdir.name)}: {name}, {now}, {train[-1]['step']} steps", fontsize=11)
    if isinstance(model, dict) and isinstance(model.get("init_from"), str) and model["init_from"]:
        fig.supxlabel(f"initialised from {_tail(model['init_from'])} (model.init_from)", fontsize=8)
    fig.tight_layout()
    return fig


COMPARE_FILENAME = "compare.png"
"""Where a comparison goes without ``--out``: the current directory (it belongs to no one run)."""


def plot_runs(workdirs: list[str | Path], out: str | Path | None = None, x: str = "step") -> Path:
    """One picture of two or more runs (PNG, atomically), each in its colour; returns its path. ``x``: ``step``
    or ``epoch``. UserError naming the run without records."""
    import matplotlib  # lazy: matplotlib, off train.py's start-up (a run draws at its end)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: as above, once the backend is chosen

    fig = _compare_figure([Path(w) for w in workdirs], x, plt)
    return _save(fig, Path(out or COMPARE_FILENAME), None)


def _compare_figure(workdirs: list[Path], x: str, plt):
    """The figure `plot_runs` saves."""
    runs = [(w, *_records(w)) for w in workdirs]
    names = [w.name for w, *_ in runs]
    if len(set(names)) < len(names):  # runs/a/demo and runs/b/demo: the paths tell them apart
        names = [str(w) for w, *_ in runs]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    (ax_loss, ax_lr), (ax_acc, ax_speed) = axes
    for i, ((_, train, evals, starts), name) in enumerate(zip(runs, names)):
        colour = f"C{i % 10}"
        to_x = _epoch_scale(train, starts[-1])[0] if x == "epoch" else (lambda s: s)
        xs = to_x([r["step"] for r in train])
        window = max(1, len(train) // 50)
        ax_loss.plot(xs, _smooth([_num(r.get("train_loss")) for r in train], window), color=colour, label=name)
        ax_lr.plot(xs, [_num(r.get("lr")) for r in train], color=colour, label=name)
        if evals:
            es = to_x([e["step"] for e in evals])
            top1 = [100 * _num(e.get("val_top1")) for e in evals]
            ax_acc.plot(es, top1, "o-", color=colour, label=f"{name}: {top1[-1]:.2f}%")
        speed = _smooth([_num(r.get("images_per_s")) for r in train], window)
        ax_speed.plot(xs, speed, color=colour, label=f"{name} ({_label(starts[-1].get('world_size'))} devices)")
    ax_loss.set_ylabel("train loss (moving mean)")
    ax_lr.set_ylabel("learning rate")
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    ax_acc.set_ylabel("validation top-1 (%)")
    ax_speed.set_ylabel("images/s")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=8)
    for ax in axes[1]:
        ax.set_xlabel("epoch" if x == "epoch" else "optimizer step")
    fig.suptitle(" vs ".join(names), fontsize=11)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description="A picture of a run: train loss, learning rate, validation accuracy and images/s against the step, "
        "written to WORKDIR/metrics.png. With two or more runs, one picture compares them (compare.png here)."
    )
    p.add_argument("workdir", nargs="+", help="a run's --workdir (holds metrics.jsonl); two or more: one picture")
    p.add_argument(
        "--out", help=f"PNG to write (default: WORKDIR/{PLOT_FILENAME}; for several runs {COMPARE_FILENAME} here)"
    )
    p.add_argument(
        "--x", choices=("step", "epoch"), default="step", help="several runs: against the step (default) or epoch"
    )
    args = p.parse_args(argv)
    if len(args.workdir) == 1:
        return cli_main(lambda: print(plot_run(args.workdir[0], args.out)))
    return cli_main(lambda: print(plot_runs(args.workdir, args.out, args.x)))


if __name__ == "__main__":
    sys.exit(main())
