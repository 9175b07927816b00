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
    assert "32768" in msg and "256 x 3 = 768" in msg


def test_global_batch_larger_than_data_set():
    with pytest.raises(UserError, match="larger than the 1000 training images"):
        make_plan(load_config(recipe("vit_b16")), world_size=1, num_train_examples=1000)


def test_an_evaluation_needs_no_training_batch_that_divides_its_world_size():
    """Training at 7 x 51 = 357; evaluating on 2 processes, where 357 does not divide, still finds each step's
    phase (boundaries do not depend on the world size)."""
    c = load_config(recipe("demo_digits"), ["train.micro_batch=51", "train.global_batch=357", "augment.mixup_alpha=0"])
    with pytest.raises(UserError, match="not divisible by train.micro_batch x world size"):
        make_plan(c, 2, 1437)
    plan, ref = evaluation_plan(c, 2, 1437), make_plan(c, 7, 1437)
    assert [(p.start_step, p.end_step, p.eval_size) for p in plan.phases] == [
        (p.start_step, p.end_step, p.eval_size) for p in ref.phases
    ]
