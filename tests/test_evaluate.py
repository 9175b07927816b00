"""vitlarge.evaluate across processes: periodic evaluations of a 7-process run equal 1-process ones.

The case issue 10 reproduced: the digits' 360 validation images over 7 ranks (51 or 52 each)
with micro-batch 51, where rank 0..3 hold exactly one batch while DALI pads every rank to 52
records, i.e. a second, padding-only batch. Sized by record counts, the loader left that batch
for the next evaluation, which then counted padding; sized from DALI's padded epoch, every
evaluation counts each image once.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hooks.jsonl import read_metrics
from tests import launcher

pytestmark = pytest.mark.slow
RECIPE = "recipes/demo_digits.py"
# fp32 (fp16 matmuls crawl on CPUs without avx512_fp16), no Mixup (51 is odd), 4 steps/epoch.
OVERRIDES = ["train.micro_batch=51", "train.global_batch=357", "train.precision=fp32", "augment.mixup_alpha=0",
             "augment.cutmix_alpha=0"]


def test_seven_process_evaluations_equal_one_process_evaluations_of_the_same_checkpoints(demo_data, tmp_path):
    args = ["--config", RECIPE, "--data", demo_data, "--workdir", str(tmp_path), *OVERRIDES, "train.max_steps=6",
            "train.eval_every_epochs=0.5", "train.checkpoint_every_steps=2", "train.log_every_steps=1"]
    r = launcher.run(args, nproc=7, launcher="torchrun", timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    evals = {x["step"]: x for x in read_metrics(str(tmp_path / "metrics.jsonl")) if x["event"] == "eval"}
    assert sorted(evals) == [2, 4, 6]  # periodic at 2 and 4, final at 6: three passes of the same loaders
    procs = {step: subprocess.Popen(
        [sys.executable, "-m", "vitlarge.evaluate", "--config", RECIPE, "--data", demo_data, "--checkpoint",
         str(tmp_path / "checkpoints" / f"step_{step:07d}"), *OVERRIDES],
        cwd=launcher.ROOT, env=launcher.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for step in evals}
    for step, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        single = json.loads(out.strip().splitlines()[-1])
        assert evals[step]["val_images"] == single["val_images"] == 360
        assert evals[step]["val_loss"] == pytest.approx(single["val_loss"], abs=1e-5), step
        assert evals[step]["val_top1"] == pytest.approx(single["val_top1"], abs=1e-9), step
