"""A run's contract values made by hand, for driving hooks with events (tests/unit/hooks, the trackers' e2e tests,
the fuzzer's MLflow case): a one-phase plan of a 32K-batch run, its `RunInfo`, step and evaluation metrics."""

from __future__ import annotations

import dataclasses

from tests.helpers.plans import one_phase_plan
from vitlarge.config.schema import Config
from vitlarge.events import EvalMetrics, RunInfo, StepMetrics
from vitlarge.plan.plan import Plan

PLAN = one_phase_plan(
    world_size=4,
    global_batch=32768,
    micro_batch=256,
    accum_steps=32,
    steps_per_epoch=39,
    total_steps=11700,
    warmup_steps=390,
    eval_every_steps=0,
    num_train_examples=39 * 32768,
)


def make_run(workdir, **kw) -> RunInfo:
    """``kw`` may set RunInfo fields and Plan fields (``total_steps=...``)."""
    plan_kw = {k: kw.pop(k) for k in list(kw) if k in {f.name for f in dataclasses.fields(Plan)}}
    base = dict(
        workdir=str(workdir),
        rank=0,
        is_main=True,
        device="cpu",
        start_step=0,
        plan=dataclasses.replace(PLAN, **plan_kw),
        cfg=Config(),
        precision="fp16",  # the run's resolved precision (Config's default): the NaN guard then ignores skips
        compile=False,
    )
    return RunInfo(**{**base, **kw})


def step_metrics(step, **kw) -> StepMetrics:
    m = dict(
        step=step,
        epoch=step / 39,
        train_loss=7.0 - 0.1 * step,
        lr=1.5e-3,
        grad_norm=1.5,
        loss_scale=32768.0,
        skipped=False,
        images=32768,
        step_time=2.0,
        data_time=0.5,
        images_per_s=16384.0,
        images_per_s_per_device=4096.0,
        peak_mem_bytes=3 * 2**30,
    )
    return StepMetrics(**{**m, **kw})


EVAL = EvalMetrics(step=3, epoch=3 / 39, val_top1=0.76543, val_top5=0.93217, val_loss=0.98765, val_images=50000)
