"""``python -m vitlarge.evaluate`` evaluates at the size and with the preprocessing training evaluated at.

A FixRes-style run: the last phase trains at 12 px and evaluates at 16 px (``eval_size``) on rectangular
batches (``rect_val``, as fast.ai's last phase; the digits are square, so its crops are the square ones,
tests/unit/data/test_rect.py), the first phase trains and evaluates at 8 px, square. The evaluate command on
each checkpoint, at another world size, gives the in-training evaluation of that step to the image: the
step's phase's size and crop, not the recipe's.
"""

from __future__ import annotations

import json

import pytest

from hooks.jsonl import read_metrics
from tests.helpers import launcher

PHASES = (
    "train.phases=[{'epoch': 0, 'image_size': 8}, "
    "{'epoch': 0.5, 'image_size': 12, 'crop_scale': (0.8, 1.0), 'eval_size': 16, 'rect_val': True}]"
)
OVERRIDES = [PHASES, "train.precision=fp32"]


def evaluate(demo_data: str, checkpoint, overrides=tuple(OVERRIDES), stderr: list | None = None) -> dict:
    cmd = ["-m", "vitlarge.evaluate", "--config", "recipes/demo_digits_progressive.py"]
    cmd += ["--data", demo_data, "--checkpoint", str(checkpoint), "--json", *overrides]
    r = launcher.python(cmd, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    if stderr is not None:
        stderr.append(r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_evaluate_uses_the_phase_eval_size_and_equals_training(demo_data, tmp_path):
    args = ["--config", "recipes/demo_digits_progressive.py", "--data", demo_data, "--workdir", str(tmp_path)]
    args += [*OVERRIDES, "train.max_steps=8", "train.checkpoint_every_steps=4", "train.eval_every_epochs=0.36"]
    r = launcher.run(args, nproc=2, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    evals = {m["step"]: m for m in read_metrics(str(tmp_path / "metrics.jsonl")) if m["event"] == "eval"}
    assert {4, 8} <= set(evals)  # step 4: the 8 px phase (its boundary is step 6); step 8: the 16 px evaluation
    for step in (4, 8):
        single = evaluate(demo_data, tmp_path / "checkpoints" / f"step_{step:07d}")
        assert single["val_images"] == evals[step]["val_images"] == 360
        assert single["val_top1"] == pytest.approx(evals[step]["val_top1"], abs=1e-9), step
        assert single["val_loss"] == pytest.approx(evals[step]["val_loss"], abs=1e-5), step
    # As README step 4 shows it, the recipe alone (the run's phase list was an override): the checkpoint's own
    # phase list and sizes (its meta.json) decide, and one line says the given config differed.
    said = []
    plain = evaluate(demo_data, tmp_path / "checkpoints" / "step_0000008", ["train.precision=fp32"], said)
    assert plain["val_top1"] == pytest.approx(evals[8]["val_top1"], abs=1e-9)
    assert "was trained with other train.phases than --config gives; evaluating as it was trained" in said[0]
    # The export declares the last phase's evaluation size and evaluates as the final evaluation did.
    exported = evaluate(demo_data, tmp_path / "model")
    assert exported["val_top1"] == pytest.approx(evals[8]["val_top1"], abs=1e-9)
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert config["pretrained_cfg"]["input_size"] == [3, 16, 16] and config["vitlarge_validation"] == "rectangular"
