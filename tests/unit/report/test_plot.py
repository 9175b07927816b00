"""The picture of a run: `vitlarge.report.plot` and `hooks.plot.PlotHook` over a real metrics.jsonl."""

from __future__ import annotations

import dataclasses
import gc
import math

import matplotlib.figure
import matplotlib.pyplot as plt
import pytest
from PIL import Image

from hooks.jsonl import JsonlHook
from hooks.plot import PlotHook
from tests.helpers import ROOT, call_main
from tests.helpers.plans import one_phase_plan
from vitlarge.config.load import load_config
from vitlarge.config.schema import Config
from vitlarge.errors import UserError
from vitlarge.events import EvalMetrics, RunInfo, StepMetrics
from vitlarge.plan.edits import resume_plan
from vitlarge.plan.plan import make_plan
from vitlarge.report.metrics_log import PLOT_FILENAME, read_metrics
from vitlarge.report.plot import _compare_figure, _epoch_scale, _run_figure, _segments, _smooth, plot_run


def run_info(workdir, start_step=0, init_from: str | None = None) -> RunInfo:
    plan = one_phase_plan(
        world_size=2,
        global_batch=128,
        micro_batch=16,
        accum_steps=4,
        steps_per_epoch=11,
        total_steps=40,
        warmup_steps=5,
        eval_every_steps=11,
        num_train_examples=11 * 128,
    )
    cfg = Config()
    cfg.model.name = "vit_tiny_patch16_224"
    cfg.model.init_from = init_from
    return RunInfo(
        workdir=str(workdir),
        rank=0,
        is_main=True,
        device="cpu",
        start_step=start_step,
        plan=plan,
        cfg=cfg,
        precision="fp32",
        compile=False,
    )


def step(s: int, loss: float = 1.0, skipped: bool = False) -> StepMetrics:
    return StepMetrics(
        step=s,
        epoch=s / 11,
        train_loss=loss,
        lr=1e-3 * s,
        grad_norm=math.inf if skipped else 1.0,
        loss_scale=2.0**16,
        skipped=skipped,
        images=128,
        step_time=0.1,
        data_time=0.01,
        images_per_s=1280.0,
        images_per_s_per_device=640.0,
        peak_mem_bytes=2**29,
        allreduce_calls=1,
    )


def evaluation(s: int, ema: bool = False) -> EvalMetrics:
    m = EvalMetrics(step=s, epoch=s / 11, val_top1=s / 50, val_top5=s / 45, val_loss=1 / s, val_images=360)
    if ema:  # train.ema_decay: the average's top-1 beside the raw weights'
        return dataclasses.replace(m, val_top1_ema=s / 48, val_top5_ema=s / 44, val_loss_ema=0.9 / s)
    return m


def write_run(
    workdir, steps=40, evals=(11, 22, 33, 40), ema: bool = False, plot: bool = True, init_from: str | None = None
) -> PlotHook | None:
    """A run as JsonlHook writes it, with one fp16 overflow and a non-finite loss, then the plot hook (its picture,
    unless ``plot`` is false); ``init_from``: its ``model.init_from``."""
    hooks = [JsonlHook(str(workdir))] + ([PlotHook(str(workdir))] if plot else [])
    run = run_info(workdir, init_from=init_from)
    for h in hooks:
        h.on_train_start(run)
    for s in range(1, steps + 1):
        m = step(s, loss=math.nan if s == 7 else 2.0 / s, skipped=s == 7)
        for h in hooks:
            h.on_step_end(run, m)
        if s in evals:
            for h in hooks:
                h.on_eval_end(run, evaluation(s, ema))
    for h in hooks:
        h.on_train_end(run, evaluation(steps, ema))
    return hooks[1] if plot else None


def test_the_hook_draws_the_run_at_its_end_next_to_metrics_jsonl(tmp_path):
    hook = write_run(tmp_path)
    path = tmp_path / PLOT_FILENAME
    assert hook.path == str(path)
    with Image.open(path) as image:
        assert image.format == "PNG" and image.width > 1000 and image.height > 700
        # Not a blank canvas: the curves put many colours on it.
        assert len(image.convert("RGB").getcolors(maxcolors=1 << 16) or []) > 50
    assert not list(tmp_path.glob(".*.tmp"))


def test_the_cli_redraws_a_run_and_names_the_file(tmp_path):
    write_run(tmp_path)
    (tmp_path / PLOT_FILENAME).unlink()
    r = call_main("vitlarge.report.plot", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(tmp_path / PLOT_FILENAME) and (tmp_path / PLOT_FILENAME).is_file()


def test_a_run_without_records_is_one_line_and_exit_2(tmp_path):
    r = call_main("vitlarge.report.plot", str(tmp_path))
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'metrics.jsonl'} does not exist; pass the --workdir of a run that has started"
    ]
    (tmp_path / "metrics.jsonl").write_text('{"event": "start", "step": 0}\n')
    with pytest.raises(UserError, match="has no training steps yet"):
        plot_run(tmp_path)


def test_a_plot_failure_is_a_warning_not_a_failed_run(tmp_path, caplog):
    hook = PlotHook(str(tmp_path / "missing"))
    hook.on_train_end(run_info(tmp_path), evaluation(1))  # no metrics.jsonl there
    assert hook.path is None and "no picture of the run" in caplog.text


def test_smoothing_skips_non_finite_values_instead_of_spreading_them():
    assert _smooth([1.0, math.nan, 3.0, None, 5.0], 2) == [1.0, 1.0, 2.0, 2.0, 4.0]


EMA_CYAN = (23, 190, 207)  # matplotlib's tab:cyan, the EMA curve's colour


def test_a_run_with_a_model_ema_gets_its_top1_curve_and_one_without_does_not(tmp_path):
    for ema in (False, True):
        write_run(tmp_path / str(ema), ema=ema)
        with Image.open(tmp_path / str(ema) / PLOT_FILENAME) as image:
            cyan = sum(n for n, colour in image.convert("RGB").getcolors(maxcolors=1 << 16) if colour == EMA_CYAN)
        assert (cyan > 20) == ema, cyan


def colour_count(path, colour) -> int:
    with Image.open(path) as image:
        return sum(n for n, c in image.convert("RGB").getcolors(maxcolors=1 << 16) if c == colour)


BLUE, ORANGE, GREEN, RED = (31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40)  # matplotlib's C0-C3


def test_two_or_more_runs_are_compared_in_one_picture_each_in_its_colour(tmp_path, monkeypatch):
    for name, steps in (("a", 40), ("b", 30), ("c", 20)):
        write_run(tmp_path / name, steps=steps, evals=(11, steps), plot=False)
    monkeypatch.chdir(tmp_path)  # without --out: compare.png here, not inside one of the runs
    r = call_main("vitlarge.report.plot", "a", "b", "c", "--x", "epoch")
    assert r.returncode == 0 and r.stdout.strip() == "compare.png", r.stderr
    assert all(colour_count("compare.png", c) > 200 for c in (BLUE, ORANGE, GREEN))
    assert colour_count("compare.png", RED) == 0  # a fourth run's
    assert not list(tmp_path.glob("*/metrics.png"))
    r = call_main("vitlarge.report.plot", "a", "missing", "--out", "ab.png")
    assert r.returncode == 2 and r.stderr.strip() == (
        "error: missing/metrics.jsonl does not exist; pass the --workdir of a run that has started"
    )


def test_the_picture_is_drawn_once_after_its_layout_as_a_second_draw_would_draw_it(tmp_path, monkeypatch):
    """The end of a run draws the figure once (savefig), not once more for a layout already made; the PNG's bytes are
    those of the figure drawn as savefig draws it after a layout pass."""
    write_run(tmp_path, plot=False)
    draws = []
    draw = matplotlib.figure.Figure.draw
    monkeypatch.setattr(matplotlib.figure.Figure, "draw", lambda fig, r: draws.append(1) or draw(fig, r))
    plot_run(tmp_path)
    assert len(draws) == 1
    once = (tmp_path / PLOT_FILENAME).read_bytes()
    keep = matplotlib.figure.Figure.set_layout_engine
    # tight_layout's placeholder engine kept: savefig draws the figure for its layout first, then for the file
    monkeypatch.setattr(
        matplotlib.figure.Figure, "set_layout_engine", lambda fig, *a, **k: a[:1] == (None,) or keep(fig, *a, **k)
    )
    plot_run(tmp_path)
    assert len(draws) == 3 and (tmp_path / PLOT_FILENAME).read_bytes() == once


def test_drawing_at_the_end_of_a_run_sets_off_no_collection_of_the_trainings_heap(tmp_path):
    """matplotlib's allocations would set off collections over the whole training process's heap; none runs while
    the picture is drawn, and the collector is as it was after (on, or off where the process had turned it off)."""
    write_run(tmp_path, plot=False)
    collections = []

    def count(phase, info):
        if phase == "start":
            collections.append(info["generation"])

    gc.callbacks.append(count)
    try:
        PlotHook(str(tmp_path)).on_train_end(run_info(tmp_path), evaluation(40))
        # at most the youngest generation's, once the collector is back on (the figure's own objects)
        assert collections in ([], [0]) and gc.isenabled() and (tmp_path / PLOT_FILENAME).is_file()
        gc.disable()
        try:
            PlotHook(str(tmp_path)).on_train_end(run_info(tmp_path), evaluation(40))
            assert not gc.isenabled()
        finally:
            gc.enable()
    finally:
        gc.callbacks.remove(count)


def write_hostile_run(workdir) -> None:
    """A metrics.jsonl from elsewhere whose values no run writes: a 400-digit loss, a throughput of 1.7e308, a text
    top-1, a missing top-5, a config that is a list and a label matplotlib would read as broken mathematics."""
    lines = [
        '{"event": "start", "step": 0, "world_size": "$\\\\frac{", "global_batch": [1], "config": [1]}',
        *(
            f'{{"event": "train", "step": {s}, "train_loss": {"9" * 400 if s == 3 else 1.5}, "lr": 0.1, '
            f'"images_per_s": {"1.7e308" if s > 5 else 100.0}, "epoch": {s / 5}}}'
            for s in range(1, 11)
        ),
        '{"event": "eval", "step": 10, "val_top1": "oops", "val_loss": 1e300, "val_images": 10}',
    ]
    workdir.mkdir(exist_ok=True)
    (workdir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_values_no_run_writes_are_gaps_in_the_picture_never_a_traceback(tmp_path):
    """A line's value that is not a number of a run (too many digits for a float, beyond what the axes can scale,
    text, missing) is drawn as a gap, in the picture of one run and in a comparison."""
    write_hostile_run(tmp_path / "hostile")
    r = call_main("vitlarge.report.plot", str(tmp_path / "hostile"))
    assert (r.returncode, r.stderr) == (0, "") and (tmp_path / "hostile" / PLOT_FILENAME).is_file()
    write_run(tmp_path / "plain", steps=12, evals=(12,), plot=False)
    out = tmp_path / "ab.png"
    r = call_main("vitlarge.report.plot", str(tmp_path / "hostile"), str(tmp_path / "plain"), "--out", str(out))
    assert (r.returncode, r.stderr) == (0, "") and out.is_file()


def test_a_fine_tuned_runs_picture_says_where_it_was_initialised_from(tmp_path, monkeypatch):
    """Issue 55 item 10: the picture names ``model.init_from`` (its last 60 characters) under the panels; a run from
    scratch has no such line."""
    import vitlarge.report.plot as plot

    figures = []
    monkeypatch.setattr(plot, "_save", lambda fig, target, root: figures.append(fig) or target)
    source = "/scratch/" + "x" * 60 + "/runs/demo_digits/model"
    for name, init_from in (("scratch", None), ("tuned", source)):
        write_run(tmp_path / name, plot=False, init_from=init_from)
        plot_run(tmp_path / name)
    assert [f.get_supxlabel() for f in figures] == [
        "",
        f"initialised from ...{source[-57:]} (model.init_from)",
    ]


def test_help_says_what_it_draws_in_whole_sentences():
    r = call_main("vitlarge.report.plot", "--help")
    text = " ".join(r.stdout.split())
    assert (
        r.returncode == 0
        and (
            "A picture of a run: train loss, learning rate, validation accuracy and images/s against the step, written to "
            "WORKDIR/metrics.png. With two or more runs, one picture compares them (compare.png here)."
        )
        in text
    )


def write_resumed_run(workdir) -> None:
    """The issue's run as JsonlHook writes it, with the plans a run makes: the demo at global batch 128 on 2 devices
    stopped at step 154 (epoch 14), resumed on 3 with ``train.global_batch=96 train.epochs=30`` to its end."""
    demo = ROOT / "recipes" / "demo_digits.py"
    old, new = load_config(demo, []), load_config(demo, ["train.global_batch=96", "train.epochs=30"])
    first = make_plan(old, 2, 1437)
    resumed = resume_plan(new, make_plan(new, 3, 1437), "ckpt", old.to_dict(), first.record(154), 154, 2).plan
    hook = JsonlHook(str(workdir))
    for cfg, plan, start, end in ((old, first, 0, 154), (new, resumed, 154, resumed.total_steps)):
        run = dataclasses.replace(run_info(workdir, start), plan=plan, cfg=cfg)
        hook.on_train_start(run)
        for s in range(start + 1, end + 1):
            hook.on_step_end(run, dataclasses.replace(step(s), epoch=plan.epoch_at(s)))
            if s % 110 == 0 or s == end:
                hook.on_eval_end(run, dataclasses.replace(evaluation(s), epoch=plan.epoch_at(s)))
        hook.on_close(run)


def test_a_resume_under_another_batch_and_world_size_is_drawn_as_its_records_count_it(tmp_path):
    """Issue 55's run: its epochs count on from 14 at 14 steps per epoch; the epoch axis ends at 30 (one factor from
    the first start's 11 steps per epoch put 38 there), the title names the last segment's batch and devices (it
    kept "global batch 128"), a dotted line marks the change at step 154; `--x epoch` draws the same epochs."""
    write_resumed_run(tmp_path)
    records = read_metrics(str(tmp_path / "metrics.jsonl"))
    train = [r for r in records if r["event"] == "train"]
    epochs = [r["epoch"] for r in train]
    assert epochs == sorted(epochs) and epochs[153] == 14.0 and epochs[-1] == pytest.approx(30.0)
    starts = [r for r in records if r["event"] == "start"]
    to_epoch, to_step = _epoch_scale(train, starts[-1])
    assert [float(to_epoch(s)) for s in (0, 154, 378, 392)] == pytest.approx([0.0, 14.0, 30.0, 31.0])
    assert float(to_step(30.0)) == pytest.approx(378)
    assert _segments(starts) == ("global batch 96 on 3 devices", [(154, "global batch 128 -> 96, 2 -> 3 devices")])
    fig = _run_figure(tmp_path, plt)
    try:
        assert fig.get_suptitle() == f"{tmp_path.name}: vit_tiny_patch16_224, global batch 96 on 3 devices, 378 steps"
        ax_lr, ax_speed = fig.axes[1], fig.axes[3]
        assert ax_speed.get_ylabel() == "images/s (3 devices)"
        assert [t.get_text() for t in ax_lr.texts] == ["global batch 128 -> 96, 2 -> 3 devices"]
        assert any(list(line.get_xdata()) == [154, 154] for line in ax_lr.lines)  # the marker
    finally:
        plt.close(fig)
    fig = _compare_figure([tmp_path, tmp_path], "epoch", plt)
    try:
        xs = fig.axes[1].lines[0].get_xdata()
        assert xs[0] == pytest.approx(1 / 11) and xs[-1] == pytest.approx(30.0)
    finally:
        plt.close(fig)


def test_an_out_in_a_folder_that_does_not_exist_is_one_line(tmp_path):
    """It was a FileNotFoundError traceback, exit 1 (the picture is drawn before it is written)."""
    write_run(tmp_path / "a", steps=20, evals=(20,), plot=False)
    out = tmp_path / "no" / "such" / "ab.png"
    for runs in ([tmp_path / "a"], [tmp_path / "a", tmp_path / "a"]):
        r = call_main("vitlarge.report.plot", *map(str, runs), "--out", str(out))
        assert (r.returncode, r.stdout) == (2, "") and r.stderr == (
            f"error: --out {out}: No such file or directory; pass a PNG file in a folder that exists\n"
        ), r.stderr
