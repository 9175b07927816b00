"""vitlarge/plan/edits.py: a resume under an edited recipe says what changed and continues the lr without a jump.

The checkpoint's side is what a real save records (``cfg.to_dict()`` as meta.json's ``config``, ``Plan.record(step)``
as its ``schedule``); world sizes are the plan's (1 -> 3, 4 -> 2, 128 -> 9), on the demo's 1,437 training images.
"""

import json
import math

import pytest

from tests.helpers import ROOT
from vitlarge.checkpoint.trust.meta import schedule_problem
from vitlarge.config.load import load_config
from vitlarge.errors import UserError
from vitlarge.plan.edits import finished_line, frozen_lr_line, resume_plan
from vitlarge.plan.plan import make_plan

N = 1437  # the demo's training images
PATH = "runs/x/checkpoints/step_0000044"


def config(*overrides: str):
    return load_config(
        ROOT / "recipes" / "demo_digits.py", ["train.global_batch=64", "schedule.warmup_epochs=1", *overrides]
    )


def checkpoint(cfg, world: int, step: int, n: int = N, record: dict | None = None) -> tuple[dict, dict]:
    """meta.json's ``config`` and ``schedule`` as a run of ``cfg`` on ``world`` processes writes them at ``step``
    (through JSON)."""
    plan = make_plan(cfg, world, n)
    return json.loads(json.dumps(cfg.to_dict())), json.loads(json.dumps(record or plan.record(step)))


def resume(old_cfg, old_world: int, new_cfg, new_world: int, step: int, record: dict | None = None, n: int = N):
    saved, rec = checkpoint(old_cfg, old_world, step, record=record)
    return resume_plan(new_cfg, make_plan(new_cfg, new_world, n), PATH, saved, rec, step, old_world)


def lrs(cfg, plan, steps):
    return [plan.lr_at(cfg, s) for s in steps]


@pytest.mark.parametrize("old_world, new_world, batch", [(1, 3, 48), (4, 2, 64), (128, 8, 1024)])
def test_another_world_size_alone_resumes_exactly_bitwise(old_world, new_world, batch):
    cfg = config("train.micro_batch=8", f"train.global_batch={batch}")
    out = resume(cfg, old_world, cfg, new_world, step=44)
    assert out.exact and out.lines == ()
    assert out.plan.continues is None
    plain = make_plan(cfg, new_world, N)
    assert lrs(cfg, out.plan, range(200)) == lrs(cfg, plain, range(200))  # bitwise: the same floats


def test_a_batch_edit_at_1_to_3_processes_says_each_change_and_keeps_the_lr_continuous():
    """The issue's case: 1 process at global batch 64, resumed on 3 with 48 (22 -> 29 steps per epoch). The epochs
    count on from the 2 done at 64, so the lr, a function of the epoch, is the same at step 44 in both plans."""
    old, new = (
        config("schedule.warmup_epochs=1", "train.epochs=4"),
        config("schedule.warmup_epochs=1", "train.epochs=4", "train.global_batch=48"),
    )
    old_plan = make_plan(old, 1, N)
    out = resume(old, 1, new, 3, step=44)
    assert not out.exact
    head, *rest = out.lines
    assert head.startswith(f"warning: the schedule changed since {PATH} (train.global_batch 64 -> 48)")
    was = old_plan.lr_at(old, 44)
    assert rest == [
        "  global batch 64 -> 48",
        "  steps per epoch 22 -> 29",
        "  total steps 88 -> 102",  # the 2 epochs left at 29 steps each; the warmup ended before step 44 in both
        f"  lr at step 45: {was:.3e} in both plans, then the cosine decay to 0.000e+00 at step 102",
    ]
    assert out.plan.continues is None
    got = lrs(new, out.plan, range(44, 103))
    assert got[0] == pytest.approx(was, rel=1e-12)  # no jump
    assert all(b <= a for a, b in zip(got, got[1:]))  # it decays from there, monotonically
    assert got[-1] == 0.0  # to the recipe's floor at its own last step
    assert out.plan.epoch_at(73) == pytest.approx(3.0) and old_plan.epoch_at(66) == 3.0


def test_extending_epochs_at_4_to_2_processes_continues_the_cosine_then_a_requeue_resumes_it_exactly():
    old, new = config("train.epochs=4"), config("train.epochs=6")
    out = resume(old, 4, new, 2, step=60)
    assert out.lines[0].startswith(f"warning: the schedule changed since {PATH} (train.epochs 4 -> 6)")
    assert "  total steps 88 -> 132" in out.lines
    assert not any("steps per epoch" in line or "global batch" in line for line in out.lines)
    c = out.plan.continues
    assert c is not None and c.step == 60
    old_plan = make_plan(old, 4, N)
    assert out.plan.lr_at(new, 60) == pytest.approx(old_plan.lr_at(old, 60), rel=1e-12)
    # The rest of the cosine, stretched: the same shape (halfway through the steps left, halfway to the floor).
    mid = 60 + (132 - 60) // 2
    p0 = math.acos(2 * old_plan.lr_at(old, 60) / new.optim.lr - 1) / math.pi
    expected = new.optim.lr * 0.5 * (1 + math.cos(math.pi * (p0 + (1 - p0) * (mid - 60) / 72)))
    assert out.plan.lr_at(new, mid) == pytest.approx(expected, rel=1e-12)

    # A requeue at step 100 of the edited run (its checkpoint records the continuation): nothing changed, the same
    # lr at every step, bitwise; and again from another world size.
    for world in (2, 4):
        again = resume(new, 2, new, world, step=100, record=out.plan.record(100))
        assert again.exact, again.lines
        assert lrs(new, again.plan, range(100, 140)) == lrs(new, out.plan, range(100, 140))


def test_a_second_edit_continues_from_the_re_planned_lr():
    first, second, third = config("train.epochs=4"), config("train.epochs=6"), config("train.epochs=8")
    out = resume(first, 1, second, 1, step=60)
    later = resume(second, 1, third, 1, step=100, record=out.plan.record(100))
    assert later.lines[0].startswith(f"warning: the schedule changed since {PATH} (train.epochs 6 -> 8)")
    assert later.plan.lr_at(third, 100) == pytest.approx(out.plan.lr_at(second, 100), rel=1e-12)
    assert later.plan.continues is not None and later.plan.continues.step == 100


def test_a_warmup_edit_inside_the_warmup_ramps_on_to_the_peak_at_the_new_warmup_end():
    old, new = config("schedule.warmup_epochs=2"), config("schedule.warmup_epochs=4")
    out = resume(old, 1, new, 1, step=20)
    assert "  warmup steps 44 -> 88" in out.lines
    assert out.lines[0].startswith(f"warning: the schedule changed since {PATH} (schedule.warmup_epochs 2 -> 4)")
    old_plan = make_plan(old, 1, N)
    got = lrs(new, out.plan, range(20, 89))
    assert got[0] == pytest.approx(old_plan.lr_at(old, 20), rel=1e-12)
    steps = [b - a for a, b in zip(got, got[1:-1])]
    assert max(steps) == pytest.approx(min(steps))  # a straight line ...
    assert got[-1] == new.optim.lr  # ... to the peak where the new warmup ends, then the recipe's decay
    assert "then the warmup, re-planned from step 21, to 2.000e-02 at step 88, then the cosine decay" in out.lines[-1]


def test_extending_a_finished_run_keeps_its_final_lr_and_says_so():
    """The issue's ``train.epochs=40`` on a finished 30-epoch run: the lr would jump from its floor to the middle of
    the new cosine; by default it stays at the checkpoint's lr, and the line says how to take the recipe's."""
    old, new = config("train.epochs=4"), config("train.epochs=6")
    out = resume(old, 2, new, 2, step=88)
    last = out.lines[-1]
    recipe = make_plan(new, 2, N).lr_at(new, 88)
    assert last == (
        f"  lr at step 89: 0.000e+00 in the checkpoint's plan (its schedule ended at step 88), {recipe:.3e} in this "
        "recipe's; the run keeps 0.000e+00 (schedule.on_edit=continue): the 44 steps added train at that lr; "
        f"schedule.on_edit=recipe takes {recipe:.3e} there, then the cosine decay to 0.000e+00 at step 132 (a warm "
        "restart)"
    )
    assert max(lrs(new, out.plan, range(88, 133))) == 0.0  # min_lr_ratio 0: nothing jumps


def test_on_edit_recipe_takes_the_recipes_lr_and_says_the_jump():
    old, new = config("train.epochs=4"), config("train.epochs=6", "schedule.on_edit=recipe")
    out = resume(old, 2, new, 2, step=60)
    assert out.plan.continues is None
    plain = make_plan(new, 2, N)
    assert lrs(new, out.plan, range(60, 132)) == lrs(new, plain, range(60, 132))
    was, now = make_plan(old, 2, N).lr_at(old, 60), plain.lr_at(new, 60)
    assert out.lines[-1].startswith(f"  lr at step 61: {was:.3e} -> {now:.3e} (schedule.on_edit=recipe")


def test_an_edit_that_keeps_the_lr_at_the_resume_step_needs_no_continuation():
    """Inside the warmup, another length of the run leaves the warmup's lr as it was: the recipe's plan goes on."""
    old, new = config("schedule.warmup_epochs=2", "train.epochs=4"), config("schedule.warmup_epochs=2")
    out = resume(old, 1, new, 1, step=10)
    assert out.plan.continues is None and not out.exact
    assert out.lines[-1].startswith("  lr at step 11: ")
    assert "in both plans, then the warmup to 2.000e-02 at step 44" in out.lines[-1]


def test_an_older_checkpoint_without_a_schedule_record_is_planned_from_the_data_set_now():
    cfg = config()
    out = resume(cfg, 2, cfg, 2, step=44, record={})
    assert out.exact
    changed = resume(cfg, 2, config("train.epochs=61"), 2, step=44, record={})
    assert changed.lines[0].startswith(f"warning: the schedule changed since {PATH} (train.epochs 60 -> 61)")


def test_another_data_set_size_is_named():
    cfg = config()
    saved, rec = checkpoint(cfg, 2, 30, n=1000)
    out = resume_plan(cfg, make_plan(cfg, 2, N), PATH, saved, rec, 30, 2)
    assert "training images 1000 -> 1437" in out.lines[0]
    assert "  steps per epoch 15 -> 22" in out.lines


@pytest.mark.parametrize(
    "record, says",
    [
        ([], "schedule is not a map"),
        ({"num_train_examples": 0}, "schedule.num_train_examples is 0"),
        ({"num_train_examples": "many"}, "schedule.num_train_examples is many"),
        ({"continues": {"step": 50, "base_lr": 0.1}}, "schedule.continues is not"),
        ({"continues": {"step": 4, "base_lr": float("nan")}}, "base_lr is nan"),
        ({"continues": {"step": 4, "base_lr": -1.0}}, "base_lr is -1.0"),
        ({"continues": [4, 0.1]}, "schedule.continues is not"),
        ({"counted_from": {"step": 45, "epoch": 2.0}}, "schedule.counted_from is not"),
        ({"counted_from": {"step": 4, "epoch": float("inf")}}, "counted_from.epoch is inf"),
        ({"counted_from": {"step": 4, "epoch": -1}}, "counted_from.epoch is -1"),
        ({"counted_from": {"step": 4, "epoch": 1.0}}, "schedule.counted_from without schedule.epoch"),
        ({"epoch": "far"}, "schedule.epoch is far"),
    ],
)
def test_a_crafted_schedule_record_is_one_line(record, says):
    problem = schedule_problem(record, step=44)
    assert problem is not None and says in problem
    assert schedule_problem({"num_train_examples": 5, "continues": {"step": 44, "base_lr": 0.1}}, 44) is None
    assert schedule_problem({"counted_from": {"step": 4, "epoch": 1.0}, "epoch": 2.0}, 44) is None


def test_a_continuation_from_lr_0_is_said_at_every_resume_not_only_the_first():
    """A finished run extended under on_edit=continue trains the steps added at lr 0, said once when it resumes; its
    requeues resumed exactly without a word, and a meta.json edited to hold ``continues.base_lr=0`` (issue 56: exit 0,
    no line) looked the same. Both now say it at each resume; a continuation from a positive lr says nothing."""
    old, new = config("train.epochs=4"), config("train.epochs=6")
    extended = resume(old, 2, new, 2, step=88).plan
    requeue = resume(new, 2, new, 2, step=100, record=extended.record(100))
    assert requeue.exact and requeue.plan.continues == extended.continues
    line = frozen_lr_line(new, requeue.plan, 100, PATH)
    assert line == (
        f"warning: {PATH}'s meta.json continues the lr from 0 at step 89 (schedule.continues): the 32 steps left "
        "train at lr 0; resume with schedule.on_edit=recipe to take this recipe's lr"
    )
    crafted = make_plan(new, 2, N).record(44) | {"continues": {"step": 40, "base_lr": 0.0}}
    assert schedule_problem(crafted, 44) is None  # a value the run itself writes (above): said, not refused
    assert frozen_lr_line(new, resume(new, 2, new, 2, step=44, record=crafted).plan, 44, PATH) is not None
    positive = make_plan(new, 2, N).record(44) | {"continues": {"step": 40, "base_lr": 1e-3}}
    assert frozen_lr_line(new, resume(new, 2, new, 2, step=44, record=positive).plan, 44, PATH) is None


def test_a_batch_edit_counts_epochs_in_the_batches_seen_and_ends_at_the_epochs_asked():
    """The issue's case: the demo at global batch 128 (11 steps per epoch) stopped at step 154, epoch 14, resumed at
    96 (14 steps per epoch) with ``train.epochs=30``. The epoch went back to 11.07 at step 155 and the run ended at
    step 420 ("epoch 30.00") after 33 epochs of batches; it goes on from 14 and ends after the 16 epochs left."""
    old, new = config("train.global_batch=128"), config("train.global_batch=96", "train.epochs=30")
    out = resume(old, 2, new, 3, step=154)
    plan = out.plan
    assert plan.epoch_at(154) == 14.0
    assert plan.epoch_at(155) == pytest.approx(14 + 1 / 14)
    assert plan.total_steps == 154 + 16 * 14
    assert plan.epoch_at(plan.total_steps) == pytest.approx(30.0)
    assert "  total steps 660 -> 378" in out.lines
    assert plan.warmup_steps < 154  # the warmup's 5 epochs were done at batch 128
    assert plan.lr_at(new, plan.total_steps - 1) > 0 == plan.lr_at(new, plan.total_steps)  # the decay ends there
    # Its checkpoints record where the count goes on from: a requeue resumes exactly, with the same epochs.
    for world in (3, 2):
        again = resume(new, 3, new, world, step=300, record=plan.record(300))
        assert again.exact, again.lines
        assert again.plan.total_steps == plan.total_steps
        assert [again.plan.epoch_at(s) for s in range(300, 379)] == [plan.epoch_at(s) for s in range(300, 379)]
    # A second edit goes on from the epoch the first left (epoch 25 at step 308), not from step 308 at 96.
    later = resume(new, 3, config("train.global_batch=64", "train.epochs=30"), 2, step=308, record=plan.record(308))
    assert later.plan.epoch_at(308) == pytest.approx(25.0)
    assert later.plan.total_steps == 308 + 5 * 22


def test_on_edit_recipe_after_a_batch_edit_quotes_the_lr_the_counted_plan_takes():
    """The review's case: the demo at batch 64 resumed at step 150 with batch 192. Epochs count on from the 6.82 done at
    64, so on_edit=recipe takes the counted plan's lr there; the on_edit=continue message quoted the plan counted from
    step 0 instead (0.000e+00, past its end) as "this recipe's" and what on_edit=recipe "would take"."""
    old, new = config("train.epochs=10"), config("train.global_batch=192", "train.epochs=10")
    taken = resume(old, 1, config("train.global_batch=192", "train.epochs=10", "schedule.on_edit=recipe"), 1, 150)
    lr = taken.plan.lr_at(new, 150)
    assert lr > 0
    assert taken.lines[-1].startswith(f"  lr at step 151: {make_plan(old, 1, N).lr_at(old, 150):.3e} -> {lr:.3e} (")
    kept = resume(old, 1, new, 1, 150).lines[-1]
    assert f", {lr:.3e} in this recipe's;" in kept
    assert f"(schedule.on_edit=continue; schedule.on_edit=recipe would take {lr:.3e})" in kept


def test_edits_of_batch_and_world_size_end_at_the_epochs_asked_not_short_of_them():
    """The review's case: 64 -> 48 -> 96 -> 64 on 1 -> 3 -> 2 -> 4 processes, ``train.epochs=10``. The last step was
    rounded to the nearest, so the segment at 48 ended at epoch 9.98 ("epoch 9.98" on the console); it is rounded up:
    each plan's last step is the first that reaches 10 epochs."""
    prev, step = None, 0
    for batch, world, stop in ((64, 1, 30), (48, 3, 70), (96, 2, 110), (64, 4, 150)):
        cfg = config(f"train.global_batch={batch}", "train.epochs=10")
        if prev is None:
            plan = make_plan(cfg, world, N)
        else:
            old_cfg, old_world, old = prev
            plan = resume(old_cfg, old_world, cfg, world, step, record=old.record(step)).plan
        total = plan.total_steps
        assert plan.epoch_at(total) >= 10 > plan.epoch_at(total - 1), (batch, world, plan.epoch_at(total))
        prev, step = (cfg, world, plan), stop


def test_a_counted_from_that_contradicts_its_step_is_one_line_and_a_finished_plan_is_said():
    """The review's case: meta.json edited to count from ``{'step': 0, 'epoch': 9.9}`` passed its checks, and the
    resume was a silent "exact" one whose plan ended at once (total steps 220 -> 1, exit 0). The checkpoint records the
    epoch its step reached; a plan rebuilt from the record that does not give it is refused in one line. A record that
    agrees with itself but leaves nothing to train is said in one line."""
    cfg = config("train.epochs=10")
    record = make_plan(cfg, 1, N).record(44) | {"counted_from": {"step": 0, "epoch": 9.9}}
    with pytest.raises(UserError) as e:
        resume(cfg, 1, cfg, 1, step=44, record=record)
    message = str(e.value)
    assert "\n" not in message and f"{PATH}/meta.json" in message and "schedule.counted_from" in message
    assert "epoch 11.9 at step 44, not the 2 it records" in message
    agreed = resume(cfg, 1, cfg, 1, step=44, record=record | {"epoch": 9.9 + 44 / 22}).plan
    assert agreed.total_steps <= 44
    assert finished_line(agreed, 44, PATH) == (
        f"warning: {PATH} is at step 44 and this run's plan ends at step {agreed.total_steps} (epoch 10.04): nothing "
        "is left to train; raise train.epochs to train on"
    )
    assert finished_line(make_plan(cfg, 1, N), 44, PATH) is None
