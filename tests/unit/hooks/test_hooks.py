"""Each hook driven with synthetic events as vitlarge/events.py describes them; asserts on real output."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import os
import sys

import pytest
from rich.console import Console

from hooks import (
    ConsoleHook,
    JsonlHook,
    NanGuardHook,
    StopTraining,
    TensorBoardHook,
    TotalBatchHook,
    build_hooks,
    read_metrics,
)
from hooks.console import format_bytes, format_duration
from tests.helpers.events import EVAL, make_run, step_metrics
from vitlarge.config.schema import Config

NAN, INF = float("nan"), float("inf")


def strict_json(line: str) -> dict:
    """json.loads that rejects NaN/Infinity, which Python's json would otherwise accept."""

    def reject(c):
        raise ValueError(f"non-strict JSON constant {c}")

    return json.loads(line, parse_constant=reject)


# --- TotalBatchHook -----------------------------------------------------------------------------


def test_total_batch_logs_the_equation_on_main_rank_only(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="vitlarge")
    TotalBatchHook().on_train_start(make_run(tmp_path, rank=1, is_main=False))
    assert caplog.records == []
    TotalBatchHook().on_train_start(make_run(tmp_path))
    text = caplog.text
    assert "total batch size = 32768 = 256 (micro) x 32 (accumulation) x 4 (devices)" in text
    assert "steps per epoch = 39, total steps = 11700 (300.0 epochs), warmup steps = 390 (10.0 epochs)" in text


# --- ConsoleHook --------------------------------------------------------------------------------


def test_console_window_averages_eta_and_data_wait(tmp_path):
    out = io.StringIO()
    hook = ConsoleHook(log_every=10, console=Console(file=out, width=60))
    run = make_run(tmp_path, total_steps=2510)
    hook.on_train_start(run)
    for s in range(1, 11):
        kw = dict(skipped=True, grad_norm=INF, loss_scale=65536.0) if s == 5 else {}
        hook.on_step_end(run, step_metrics(s, **kw))
    lines = out.getvalue().splitlines()
    assert len(lines) == 2  # first step, then step 10; never wrapped despite width=60
    assert lines[0].startswith("train step    1/2510 ")
    line = lines[1]
    assert "step   10/2510" in line and "epoch 0.26" in line
    assert "loss 6.4000" in line  # mean of 7 - 0.1*s over the window s = 2..10
    assert "lr 1.500e-03" in line and "scale 32768" in line
    assert "grad 1.500" in line  # the skipped step's inf grad norm is left out of the mean
    assert "16384.0 img/s (4096.0/dev)" in line
    assert "data 25.0%" in line  # 0.5 s of 2.0 s
    assert "eta 1:23:20" in line  # 2.0 s x 2500 remaining steps
    assert "mem 3.00 GiB" in line and "skipped 1" in line


def test_console_total_eta_and_last_line_follow_train_max_steps(tmp_path):
    """A run stopped by ``train.max_steps=3`` shows 3 as its total, an eta to step 3 and a line at step 3."""
    cfg = Config()
    cfg.train.max_steps = 3
    out = io.StringIO()
    hook = ConsoleHook(log_every=100, console=Console(file=out))
    run = make_run(tmp_path, cfg=cfg)  # the plan's schedule: 11700 steps
    hook.on_train_start(run)
    for s in (1, 2, 3):
        hook.on_step_end(run, step_metrics(s))
    lines = out.getvalue().splitlines()
    assert [line.split(" | ")[0] for line in lines] == ["train step 1/3", "train step 3/3"]
    assert "eta 0:00:04" in lines[0] and "eta 0:00:00" in lines[1]  # 2.0 s x 2 steps left, then none


def test_total_batch_says_where_train_max_steps_stops_the_run(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="vitlarge")
    cfg = Config()
    cfg.train.max_steps = 3
    TotalBatchHook().on_train_start(make_run(tmp_path, cfg=cfg))
    assert "train.max_steps=3: this run stops at step 3 of the schedule's 11700" in caplog.text


def test_console_reports_top5_only_past_5_classes(tmp_path):
    """Of 5 classes every image is in the top 5: the eval and done lines leave out a 100% that measures nothing
    (issue 55; metrics.jsonl keeps the value)."""
    from dataclasses import replace

    lines = {}
    for classes in (5, 6):
        cfg = Config()
        cfg.data.num_classes = classes
        out = io.StringIO()
        hook, run = ConsoleHook(log_every=100, console=Console(file=out, width=300)), make_run(tmp_path, cfg=cfg)
        ema = replace(EVAL, val_top1_ema=0.5, val_top5_ema=0.9)
        hook.on_eval_end(run, ema)
        hook.on_train_end(run, ema)
        lines[classes] = out.getvalue().splitlines()
    assert "top-5" not in "".join(lines[5]) and "| top-1 76.54% | loss 0.9877 | ema top-1 50.00% |" in lines[5][0]
    assert "| top-1 76.54% | top-5 93.22% | loss 0.9877 | ema top-1 50.00% top-5 90.00% |" in lines[6][0]
    assert lines[5][1].endswith("| top-1 76.54% | ema top-1 50.00%")
    assert lines[6][1].endswith("| top-1 76.54% | top-5 93.22% | ema top-1 50.00% top-5 90.00%")


def test_console_prints_last_step_eval_and_plain_text_when_piped(tmp_path, capsys):
    hook = ConsoleHook(log_every=100)  # default Console on stdout, which capsys makes a non-TTY
    run = make_run(tmp_path, total_steps=3, start_step=1)
    hook.on_train_start(run)
    for s in (2, 3):
        hook.on_step_end(run, step_metrics(s, peak_mem_bytes=300 * 2**20))
    hook.on_eval_end(run, EVAL)
    hook.on_checkpoint(run, 3, "/runs/x/ckpt[3]")
    out = capsys.readouterr().out
    assert "\x1b" not in out
    lines = out.splitlines()
    assert [ln.split(" | ")[0] for ln in lines] == ["train step 2/3", "train step 3/3", "eval  step 3", "ckpt  step 3"]
    assert "mem 300 MiB | skipped 0" in lines[1] and "eta 0:00:00" in lines[1]  # CPU: max RSS alone
    assert "top-1 76.54% | top-5 93.22% | loss 0.9877 | 50000 images" in lines[2]
    assert lines[3].endswith("/runs/x/ckpt[3]")


def test_console_lines_to_a_gone_reader_stop_without_ending_the_process(tmp_path, monkeypatch):
    """stdout a pipe whose reader is gone (``colossalai run`` killed before its workers): rich's default ended the
    process with status 1 at the next line, before the checkpoint a SIGTERM asked for; the lines stop instead."""
    read, write = os.pipe()
    os.close(read)
    gone = os.fdopen(write, "w")
    monkeypatch.setattr(sys, "stdout", gone)
    try:
        hook = ConsoleHook(log_every=1)  # its default Console, on sys.stdout
        run = make_run(tmp_path, total_steps=3)
        hook.on_train_start(run)
        for s in (1, 2):
            hook.on_step_end(run, step_metrics(s))
        hook.on_checkpoint(run, 2, "/runs/x/ckpt")
        assert hook.console.quiet
    finally:
        monkeypatch.undo()
        with contextlib.suppress(BrokenPipeError):  # the line rich could not write is still in the buffer
            gone.close()


def test_console_mem_on_cuda_is_the_allocated_and_the_reserved_peak(tmp_path):
    """Reserved (the caching allocator's segments) is what the GPU holds; allocated alone hides fragmentation.
    Each is the window's max (steps 2 and 3 here: the first step has its own line)."""
    out = io.StringIO()
    hook = ConsoleHook(log_every=100, console=Console(file=out))
    run = make_run(tmp_path, total_steps=3, device="cuda")
    hook.on_train_start(run)
    for step, allocated, reserved in ((1, 30.0, 31.0), (2, 20.8, 24.0), (3, 20.5, 25.5)):
        hook.on_step_end(
            run, step_metrics(step, peak_mem_bytes=int(allocated * 2**30), peak_reserved_bytes=int(reserved * 2**30))
        )
    lines = out.getvalue().splitlines()
    assert [ln.split(" | ")[0] for ln in lines] == ["train step 1/3", "train step 3/3"]
    assert lines[1].endswith("| mem 20.80 GiB (25.50 GiB reserved) | skipped 0")


def test_console_non_main_rank_prints_nothing(tmp_path):
    out = io.StringIO()
    hook = ConsoleHook(log_every=1, console=Console(file=out))
    run = make_run(tmp_path, rank=2, is_main=False)
    hook.on_train_start(run)
    hook.on_step_end(run, step_metrics(1))
    hook.on_eval_end(run, EVAL)
    hook.on_train_end(run, dataclasses.replace(EVAL, step=1))
    assert out.getvalue() == ""


def test_formatters():
    assert format_duration(0) == "0:00:00"
    assert format_duration(30 * 3600 + 61) == "30:01:01"
    assert format_duration(NAN) == "?"
    assert format_bytes(512 * 2**20) == "512 MiB"
    assert format_bytes(1.5 * 2**30) == "1.50 GiB"


# --- JsonlHook ----------------------------------------------------------------------------------


def test_jsonl_records_are_strict_json_with_nan_as_null(tmp_path):
    hook, run = JsonlHook(str(tmp_path)), make_run(tmp_path)
    hook.on_train_start(run)
    hook.on_step_end(run, step_metrics(1))
    hook.on_step_end(run, step_metrics(2, train_loss=NAN, grad_norm=INF, skipped=True))
    hook.on_eval_end(run, EVAL)
    hook.on_checkpoint(run, 2, "/ck/2")
    hook.on_train_end(run, EVAL)
    recs = [strict_json(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["event"] for r in recs] == ["start", "train", "train", "eval", "checkpoint", "end"]
    assert recs[0]["global_batch"] == 32768 and recs[0]["step"] == 0
    t1 = recs[1]
    assert {
        "step",
        "epoch",
        "train_loss",
        "lr",
        "grad_norm",
        "loss_scale",
        "images_per_s",
        "skipped",
        "data_time",
        "step_time",
        "peak_mem_bytes",
        "peak_reserved_bytes",
        "time",
    } <= t1.keys()
    assert t1["train_loss"] == pytest.approx(6.9) and t1["peak_mem_bytes"] == 3 * 2**30
    assert t1["peak_reserved_bytes"] is None  # CPU: no reserved peak (CUDA's is in bytes beside the allocated one)
    assert list(t1).index("peak_reserved_bytes") == list(t1).index("peak_mem_bytes") + 1
    assert recs[2]["train_loss"] is None and recs[2]["grad_norm"] is None and recs[2]["skipped"] is True
    assert recs[3]["val_top1"] == 0.76543 and recs[3]["val_images"] == 50000
    assert recs[4] == {**recs[4], "step": 2, "path": "/ck/2"}
    assert recs[5]["step"] == 3 and recs[5]["val_top5"] == 0.93217


def test_jsonl_resume_appends_and_read_metrics_keeps_the_last_history(tmp_path):
    path = tmp_path / "metrics.jsonl"
    first, run = JsonlHook(str(tmp_path)), make_run(tmp_path)
    first.on_train_start(run)
    for s in range(1, 6):
        first.on_step_end(run, step_metrics(s, train_loss=1.0))
        if s == 3:
            first.on_checkpoint(run, 3, "/ck/3")
    first._file.close()  # killed at step 5, mid-way through writing step 6:
    with open(path, "a") as f:
        f.write('{"event": "train", "st')

    second, run2 = JsonlHook(str(tmp_path)), make_run(tmp_path, start_step=3)
    second.on_train_start(run2)
    for s in (4, 5):
        second.on_step_end(run2, step_metrics(s, train_loss=2.0))
    second.on_train_end(run2, dataclasses.replace(EVAL, step=5))

    lines = path.read_text().splitlines()
    assert lines.count('{"event": "train", "st') == 1  # the partial line stays alone on its line
    assert len([ln for ln in lines if ln.startswith('{"event": "train", "step"')]) == 7
    recs = read_metrics(str(path))
    train = [(r["step"], r["train_loss"]) for r in recs if r["event"] == "train"]
    assert train == [(1, 1.0), (2, 1.0), (3, 1.0), (4, 2.0), (5, 2.0)]
    assert [r["event"] for r in recs].count("start") == 2
    assert [r["path"] for r in recs if r["event"] == "checkpoint"] == ["/ck/3"]


def test_read_metrics_rolls_back_steps_the_resumed_run_never_reached(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = (
        [{"event": "start", "step": 0}]
        + [{"event": "train", "step": s} for s in range(1, 9)]
        + [{"event": "start", "step": 4}]
        + [{"event": "train", "step": s} for s in (5, 6)]
    )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [r["step"] for r in read_metrics(str(path)) if r["event"] == "train"] == [1, 2, 3, 4, 5, 6]


def test_read_metrics_reads_a_file_of_start_records_in_one_pass(tmp_path):
    """A handed-over metrics.jsonl of start records (80,000 took 187 s to plot when each start rescanned the
    records before it) costs what a file of as many step records does. Counted in the reader's executed lines,
    not timed: a count is the same on a loaded machine (a rescan per start is n^2 lines: 9,000,000 here)."""
    import sys

    from vitlarge.report import metrics_log

    def lines_run(path) -> int:
        count = 0

        def trace(frame, event, arg):
            nonlocal count
            if frame.f_code.co_filename != metrics_log.__file__:
                return None
            if event == "line":
                count += 1
            return trace

        sys.settrace(trace)
        try:
            assert len(read_metrics(str(path))) == n
        finally:
            sys.settrace(None)
        return count

    n = 3_000
    starts, steps = tmp_path / "starts.jsonl", tmp_path / "steps.jsonl"
    starts.write_text('{"event":"start","step":0}\n' * n)
    steps.write_text("".join(f'{{"event":"train","step":{s}}}\n' for s in range(1, n + 1)))
    on_starts, on_steps = lines_run(starts), lines_run(steps)
    assert on_starts <= on_steps < 30 * n, (on_starts, on_steps)


def test_read_metrics_skips_lines_that_hold_no_record_of_ours(tmp_path):
    path = tmp_path / "metrics.jsonl"
    good = [{"event": "start", "step": 0}, {"event": "train", "step": 1}, {"event": "end", "step": 1}]
    junk = [
        '{"event": "start", "step": "x"}',  # compared with the steps before: a TypeError once
        '{"event": "train", "step": [1]}',  # a key of the last-record table: unhashable once
        '{"event": ["train"], "step": 1}',
        '{"event": "train", "step": 1.5}',
        '{"event": "train", "step": 1' + "0" * 400 + "}",  # an OverflowError in the plot's float once
        '{"event": "train", "step": -5}',
        "[" * 100_000 + "]" * 100_000,  # RecursionError in json
        '{"event": "train", "step": 2, "pad": "' + "x" * (2 << 20) + '"}',  # longer than any line of ours
        "\xff\xfe",
    ]
    with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write(json.dumps(good[0]) + "\n" + "\n".join(junk) + "\n" + json.dumps(good[1]) + "\n")
        f.write(json.dumps(good[2]) + "\n")
    assert [{k: r[k] for k in ("event", "step")} for r in read_metrics(str(path))] == good


def test_read_metrics_keeps_a_bounded_history_whatever_the_file_holds(tmp_path):
    """48 MiB of minimal records (every one a step of its own) added ~1 GB to the summary and the plot: past
    `KEEP_RECORDS` of one event (here 1,000: the same code at a size that runs fast) the steps are thinned, the
    newest and the other events' records kept; lines of other events, and lines that are not records, are not
    kept. The large file's before -> after: issue 56's closing note."""
    path, keep, n = tmp_path / "metrics.jsonl", 1000, 3007
    starts = [{"event": "start", "step": 0, "steps_per_epoch": 10}, {"event": "start", "step": 0}]
    with open(path, "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in starts) + "{}\n" * 100 + '{"event":"other","step":1}\n' * 100)
        f.write("".join(f'{{"event":"train","step":{s}}}\n' for s in range(1, n + 1)))
        f.write(f'{{"event":"eval","step":{n},"val_top1":0.5}}\n' + '{"event":"end","step":1}\n' * 2 * keep)
    recs = read_metrics(str(path), keep=keep)
    train = [r["step"] for r in recs if r["event"] == "train"]
    assert keep // 2 <= len(train) <= keep and train[-1] == n and train == sorted(train)
    assert all(s % 4 == 0 for s in train[:-1])  # thinned twice: every 4th step
    assert recs[0] == starts[0] and len(recs) - len(train) - 1 <= keep  # the first start, the newest start/end records
    assert {r["event"] for r in recs} == {"start", "train", "eval", "end"}


def test_read_metrics_keeps_a_bounded_number_of_bytes_of_long_records(tmp_path):
    path, pad = tmp_path / "metrics.jsonl", "x" * 10_000
    path.write_text("".join(json.dumps({"event": "train", "step": s, "pad": pad}) + "\n" for s in range(1, 65)))
    recs = read_metrics(str(path), keep_bytes=100_000)
    assert sum(len(r["pad"]) for r in recs) <= 100_000 and recs[-1]["step"] == 64


def test_jsonl_non_main_rank_writes_nothing(tmp_path):
    hook, run = JsonlHook(str(tmp_path / "w")), make_run(tmp_path, rank=1, is_main=False)
    hook.on_train_start(run)
    hook.on_step_end(run, step_metrics(1))
    hook.on_train_end(run, dataclasses.replace(EVAL, step=1))
    assert not (tmp_path / "w").exists()


# --- TensorBoardHook ----------------------------------------------------------------------------


def _scalars(logdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_scalars_read_back_and_resume_purges(tmp_path):
    hook, run = TensorBoardHook(str(tmp_path)), make_run(tmp_path)
    hook.on_train_start(run)
    for s in (1, 2, 3):
        hook.on_step_end(run, step_metrics(s, train_loss=NAN if s == 2 else 5.0))
    hook.on_eval_end(run, EVAL)
    hook.on_train_end(run, dataclasses.replace(EVAL, step=3))
    sc = _scalars(tmp_path / "tb")
    assert set(sc) == {
        "train/loss",
        "train/lr",
        "train/grad_norm",
        "train/loss_scale",
        "train/skipped",
        "perf/images_per_s",
        "perf/data_wait",
        "mem/peak_gib",
        "val/top1",
        "val/top5",
        "val/loss",
    }
    assert sc["train/loss"] == [(1, 5.0), (3, 5.0)]  # the nan step is left out
    assert sc["train/lr"][0] == (1, pytest.approx(1.5e-3))
    assert sc["perf/data_wait"][0][1] == pytest.approx(0.25)
    assert sc["mem/peak_gib"][0][1] == pytest.approx(3.0)
    assert sc["val/top1"] == [(3, pytest.approx(0.76543))]

    resumed, run2 = TensorBoardHook(str(tmp_path)), make_run(tmp_path, start_step=2)
    resumed.on_train_start(run2)
    resumed.on_step_end(run2, step_metrics(3, train_loss=4.0))
    resumed.on_train_end(run2, dataclasses.replace(EVAL, step=3))
    assert _scalars(tmp_path / "tb")["train/loss"] == [(1, 5.0), (3, 4.0)]


def test_tensorboard_non_main_rank_writes_nothing(tmp_path):
    hook, run = TensorBoardHook(str(tmp_path)), make_run(tmp_path, rank=3, is_main=False)
    hook.on_train_start(run)
    hook.on_step_end(run, step_metrics(1))
    hook.on_eval_end(run, EVAL)
    hook.on_train_end(run, dataclasses.replace(EVAL, step=1))
    assert not (tmp_path / "tb").exists()


# --- NanGuardHook -------------------------------------------------------------------------------


def test_nan_guard_raises_after_exactly_patience_steps(tmp_path):
    guard, run = NanGuardHook(patience=3), make_run(tmp_path, rank=1, is_main=False)  # all ranks
    guard.on_train_start(run)
    guard.on_step_end(run, step_metrics(1, train_loss=2.5))
    guard.on_checkpoint(run, 1, "/ck/1")
    guard.on_step_end(run, step_metrics(2, train_loss=2.4, skipped=True, grad_norm=INF))
    guard.on_step_end(run, step_metrics(3, train_loss=NAN))
    guard.on_step_end(run, step_metrics(4, train_loss=INF))
    guard.on_checkpoint(run, 4, "/ck/4")  # written during the streak: not a good checkpoint
    with pytest.raises(StopTraining) as err:
        guard.on_step_end(run, step_metrics(5, train_loss=NAN))
    msg = str(err.value)
    assert "non-finite for steps 3..5" in msg
    assert "last finite loss 2.4000 at step 2" in msg
    assert "lower the lr or use bf16" in msg
    assert msg.endswith("last good checkpoint: /ck/1")


def test_nan_guard_ignores_fp16_skips_and_resets_on_finite_loss(tmp_path):
    guard, run = NanGuardHook(patience=2), make_run(tmp_path, start_step=10)
    guard.on_train_start(run)
    for s in range(11, 21):  # a long run of overflow skips with finite loss is not divergence
        guard.on_step_end(run, step_metrics(s, skipped=True, grad_norm=INF))
    for s, loss in zip(range(21, 26), (NAN, 3.0, NAN, 3.0, NAN)):
        guard.on_step_end(run, step_metrics(s, train_loss=loss))
    with pytest.raises(
        StopTraining,
        match=r"steps 25\.\.26; last finite loss 3\.0000 at step 24.*"
        r"none written by this run; it resumed .* step 10",
    ):
        guard.on_step_end(run, step_metrics(26, train_loss=NAN))


# --- build_hooks --------------------------------------------------------------------------------


def test_build_hooks_logs_the_failing_step_before_the_guard_stops(tmp_path, capsys):
    hooks = build_hooks(str(tmp_path), log_every=5, nan_patience=1, tensorboard=False)
    assert [type(h).__name__ for h in hooks] == [
        "TotalBatchHook",
        "ConsoleHook",
        "JsonlHook",
        "PlotHook",
        "NanGuardHook",
    ]
    run = make_run(tmp_path)
    for h in hooks:
        h.on_train_start(run)
    with pytest.raises(StopTraining, match="steps 1..1; no finite loss since this run started"):
        for h in hooks:
            h.on_step_end(run, step_metrics(1, train_loss=NAN))
    last = strict_json((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["step"] == 1 and last["train_loss"] is None
    assert "loss nan" in capsys.readouterr().out
    assert [type(h).__name__ for h in build_hooks("w", log_every=1, nan_patience=1, console=False)] == [
        "TotalBatchHook",
        "JsonlHook",
        "TensorBoardHook",
        "PlotHook",
        "NanGuardHook",
    ]


# --- the model EMA (train.ema_decay) through every hook -----------------------------------------

EVAL_EMA = dataclasses.replace(EVAL, val_top1_ema=0.78125, val_top5_ema=0.94, val_loss_ema=0.9)


def test_an_ema_evaluation_reaches_the_console_jsonl_and_tensorboard_and_a_plain_one_has_no_ema_keys(tmp_path, capsys):
    run = make_run(tmp_path, total_steps=3, start_step=2)
    console, jsonl, tb = ConsoleHook(log_every=100), JsonlHook(str(tmp_path)), TensorBoardHook(str(tmp_path))
    for h in (console, jsonl, tb):
        h.on_train_start(run)
        h.on_step_end(run, step_metrics(3))
        h.on_eval_end(run, EVAL_EMA)
        h.on_train_end(run, EVAL_EMA)
    lines = capsys.readouterr().out.splitlines()
    assert "top-1 76.54% | top-5 93.22% | loss 0.9877 | ema top-1 78.12% top-5 94.00% | 50000 images" in lines[1]
    assert lines[2].startswith("done  step 3 | top-1 76.54%") and lines[2].endswith("ema top-1 78.12% top-5 94.00%")
    recs = [strict_json(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert (recs[2]["event"], recs[2]["val_top1_ema"], recs[2]["val_top5_ema"]) == ("eval", 0.78125, 0.94)
    assert recs[3]["event"] == "end" and recs[3]["val_top1_ema"] == 0.78125
    assert _scalars(tmp_path / "tb")["val/top1_ema"] == [(3, pytest.approx(0.78125))]
    assert not any(k.endswith("_ema") for k in EVAL.record())
    ConsoleHook(log_every=100).on_eval_end(run, EVAL)
    assert "ema" not in capsys.readouterr().out
