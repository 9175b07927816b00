"""The run plan (vitlarge.plan.plan.make_plan): global batch, accumulation and step counts derived once."""

import pytest

from tests.helpers import ROOT
from vitlarge.config.load import load_config
from vitlarge.errors import UserError
from vitlarge.plan.plan import evaluation_plan, make_plan

RECIPES = ROOT / "recipes"


def recipe(name: str):
    return RECIPES / f"{name}.py"


def test_vit_b16_plan_at_four_devices():
    plan = make_plan(load_config(recipe("vit_b16")), world_size=4)
    (ph,) = plan.phases  # a recipe without train.phases is one phase
    assert ph.global_batch == 32768
    assert ph.accum_steps == 32
    assert ph.steps_per_epoch == 39  # 1,281,167 // 32,768, last partial batch dropped
    assert plan.total_steps == 11700
    assert plan.warmup_steps == 5850
    assert plan.eval_every_steps == 390
    assert ph.global_batch == ph.micro_batch * ph.accum_steps * plan.world_size
    assert "32768 = 256 (micro) x 32 (accumulation) x 4 (devices)" in plan.describe()


@pytest.mark.parametrize("world", [1, 2, 8, 128])
def test_global_batch_is_fixed_whatever_the_world_size(world):
    plan = make_plan(load_config(recipe("vit_b16")), world_size=world)
    (ph,) = plan.phases
    assert ph.micro_batch * ph.accum_steps * world == 32768
    assert plan.total_steps == 11700


def test_plan_uses_the_data_set_size_given():
    plan = make_plan(load_config(recipe("demo_digits")), world_size=2, num_train_examples=1437)
    (ph,) = plan.phases
    assert (ph.accum_steps, ph.steps_per_epoch, plan.total_steps, plan.warmup_steps) == (4, 11, 660, 55)


def test_world_size_that_does_not_divide():
    with pytest.raises(UserError) as e:
        make_plan(load_config(recipe("vit_b16")), world_size=3)
    msg = str(e.value)
    assert msg.startswith("train.global_batch=32768 does not divide over 3 processes") and "(32766 or 32769)" in msg


def test_global_batch_larger_than_data_set():
    with pytest.raises(UserError, match="larger than the 1000 training images"):
        make_plan(load_config(recipe("vit_b16")), world_size=1, num_train_examples=1000)


def test_an_evaluation_needs_no_training_batch_that_divides_its_world_size():
    """Training at 7 x 51 = 357; evaluating on 2 processes, where 357 does not divide, still finds each step's
    phase (boundaries do not depend on the world size)."""
    c = load_config(recipe("demo_digits"), ["train.micro_batch=51", "train.global_batch=357", "augment.mixup_alpha=0"])
    with pytest.raises(UserError, match="train.global_batch=357 does not divide over 2 processes"):
        make_plan(c, 2, 1437)
    plan, ref = evaluation_plan(c, 2, 1437), make_plan(c, 7, 1437)
    assert [(p.start_step, p.end_step, p.eval_size) for p in plan.phases] == [
        (p.start_step, p.end_step, p.eval_size) for p in ref.phases
    ]


@pytest.mark.parametrize(
    "batch, world, says",
    [
        (64, 3, "train.global_batch=64 does not divide over 3 processes, so no train.micro_batch can split it evenly; "
         "run on 2 or 4 processes (dividing 64), or make it a multiple of 3 (63 or 66)"),
        (64, 128, "run on 64 processes (dividing 64), or make it a multiple of 128 (128)"),
        (67, 2, "run on 1 or 67 processes (dividing 67), or make it a multiple of 2 (66 or 68)"),
        (1, 2, "run on 1 process (dividing 1), or make it a multiple of 2 (2)"),
    ],
)  # fmt: skip
def test_a_global_batch_the_world_size_does_not_divide_says_no_micro_batch_can(batch, world, says):
    """64 over 3 processes: no micro batch divides it, so the line names the device counts and batches that do."""
    c = load_config(
        recipe("demo_digits"), [f"train.global_batch={batch}", "train.micro_batch=1", "augment.mixup_alpha=0"]
    )
    with pytest.raises(UserError) as e:
        make_plan(c, world, 1437)
    assert says in str(e.value) and "pick a micro_batch" not in str(e.value)


def test_a_micro_batch_that_does_not_divide_keeps_its_hint():
    c = load_config(recipe("demo_digits"), ["train.global_batch=96", "train.micro_batch=32"])
    with pytest.raises(UserError, match="= 32 x 2 = 64; pick a micro_batch or device count that divides it"):
        make_plan(c, 2, 1437)
