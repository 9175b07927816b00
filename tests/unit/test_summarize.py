"""scripts/summarize.py: a run's result and files, only what is there (an interrupted run has no final top-1, a
run without an export no model line)."""

import json

from tests.helpers import call_main


def write_run(workdir, *segments: tuple[int, int, bool], total: int = 88) -> None:
    """metrics.jsonl of runs that each started at a step, trained to another (an evaluation there) and ended or not."""
    lines = []
    for start, stop, ended in segments:
        lines.append({"event": "start", "step": start, "total_steps": total})
        lines += [{"event": "train", "step": s, "loss": 1.0} for s in range(start + 1, stop + 1)]
        lines.append(
            {"event": "eval", "step": stop, "val_top1": 0.25, "val_top5": 0.75, "val_loss": 2.0, "val_images": 360}
        )
        if ended:
            lines.append({"event": "end", "step": stop, "val_top1": 0.25})
    workdir.mkdir(exist_ok=True)
    (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_an_interrupted_run_says_where_it_stopped_and_its_latest_evaluation(tmp_path):
    write_run(tmp_path, (0, 35, False))
    (tmp_path / "tb").mkdir()
    r = call_main("scripts.summarize", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "the run has not ended: it stopped at step 35 of 88",
        "latest validation top-1 25.00% (top-5 75.00%, loss 2.0000) at step 35 on 360 images",
        f"logs: {tmp_path}/metrics.jsonl  TensorBoard: tensorboard --logdir {tmp_path}/tb",
    ]  # no picture, no model: neither exists


def test_a_finished_run_names_its_final_top1_and_the_files_there(tmp_path):
    write_run(tmp_path, (0, 30, False), (30, 88, True))
    (tmp_path / "metrics.png").write_bytes(b"png")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    out = call_main("scripts.summarize", str(tmp_path)).stdout.splitlines()
    assert out[0] == "final validation top-1 25.00% (top-5 75.00%, loss 2.0000) at step 88 on 360 images"
    assert out[1] == f"picture: {tmp_path}/metrics.png  logs: {tmp_path}/metrics.jsonl"
    assert out[2].startswith(f"model: {tmp_path}/model  (timm.create_model(")


def test_a_finished_run_resumed_under_more_epochs_and_interrupted_is_not_final(tmp_path):
    write_run(tmp_path, (0, 88, True), (88, 100, False), total=132)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    out = call_main("scripts.summarize", str(tmp_path)).stdout.splitlines()
    assert out[0] == "the run has not ended: it stopped at step 100 of 132"
    assert out[1].startswith("latest validation top-1 25.00%")
    assert out[3].startswith(f"model: {tmp_path}/model (exported at step 88, before the last start)")


def test_values_no_run_writes_are_question_marks_and_a_missing_top1_is_one_line_and_exit_2(tmp_path):
    """metrics.jsonl is data: a 400-digit loss, 1.7e308, a text or missing top-1 never end in a traceback or a wrong
    number; without a top-1 there is no result (status 2), said in one line."""
    write_run(tmp_path, (0, 5, True))
    path = tmp_path / "metrics.jsonl"
    lines = path.read_text().splitlines()
    lines.insert(
        -1, '{"event": "eval", "step": 5, "val_top1": 1.7e308, "val_top5": "text", "val_loss": ' + "9" * 400 + "}"
    )
    path.write_text("\n".join(lines) + "\n")
    r = call_main("scripts.summarize", str(tmp_path))
    assert r.stdout.splitlines()[0] == "final validation top-1 ? (top-5 ?, loss ?) at step 5 on ? images"
    assert r.returncode == 2 and r.stderr.splitlines() == [
        f"error: {path}: the evaluation at step 5 records no val_top1 (missing, not a number or out of range); its "
        "top-1 is had again with python -m vitlarge.evaluate --config <recipe> --checkpoint <step_N>"
    ]
    lines[-2] = '{"event": "eval", "step": 5, "val_top1": 0.5, "val_top5": 0.75, "val_images": 9}'
    path.write_text("\n".join(lines) + "\n")
    r = call_main("scripts.summarize", str(tmp_path))
    assert r.returncode == 0 and r.stdout.splitlines()[0] == (
        "final validation top-1 50.00% (top-5 75.00%, loss ?) at step 5 on 9 images"
    )


def test_an_accuracy_outside_0_1_and_a_total_that_is_no_step_count_are_not_printed(tmp_path):
    """A top-1 of 1.7 printed "170.00%" with exit 0; a total_steps of text was printed whole (500 kB of it, or a
    terminal escape: no run writes either)."""
    write_run(tmp_path, (0, 5, False), total=88)
    path = tmp_path / "metrics.jsonl"
    lines = path.read_text().splitlines()
    lines[0] = json.dumps({"event": "start", "step": 0, "total_steps": "\x1b[2J" + "x" * 500_000})
    lines[-1] = json.dumps({"event": "eval", "step": 5, "val_top1": 1.7, "val_top5": -0.5, "val_loss": 1.0})
    path.write_text("\n".join(lines) + "\n")
    r = call_main("scripts.summarize", str(tmp_path))
    assert r.stdout.splitlines()[:2] == [
        "the run has not ended: it stopped at step 5",
        "latest validation top-1 ? (top-5 ?, loss 1.0000) at step 5 on ? images",
    ]
    assert r.returncode == 2 and "records no val_top1 (missing, not a number or out of range)" in r.stderr


def test_an_end_records_step_that_is_no_step_is_a_question_mark(tmp_path):
    """An ``end`` record is read whatever its step holds; the model line printed it as it was."""
    write_run(tmp_path, (0, 5, True), (3, 5, False))
    path = tmp_path / "metrics.jsonl"
    path.write_text(path.read_text().replace('{"event": "end", "step": 5', '{"event": "end", "step": "\\u001b[2J"'))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    r = call_main("scripts.summarize", str(tmp_path))
    assert "(exported at step ?, before the last start)" in r.stdout and "\x1b" not in r.stdout, r.stdout
