"""One knob per concept (vitlarge/config/renamed.py): ``train.activation_checkpointing`` is the recompute key; the old
``model.grad_checkpointing`` set by a recipe, an override or an overrides file is one line naming the new key, and
a config recorded under the old name reads as its successor."""

from __future__ import annotations

import pytest

from tests.helpers import ROOT
from vitlarge.config.load import load_config, load_recipe
from vitlarge.config.renamed import upgrade_recorded
from vitlarge.config.schema import Config
from vitlarge.errors import UserError

LINE = (
    "model.grad_checkpointing was renamed to train.activation_checkpointing; set train.activation_checkpointing=full "
    "(what model.grad_checkpointing=true did), off, or selective"
)


def test_the_large_recipes_recompute_by_the_one_key_and_take_selective_from_the_command_line():
    for name in ("vit_l16", "vit_h14"):
        assert load_recipe(ROOT / "recipes" / f"{name}.py").train.activation_checkpointing == "full"
        cfg = load_config(ROOT / "recipes" / f"{name}.py", ["train.activation_checkpointing=selective"])
        assert cfg.train.activation_checkpointing == "selective"
    assert "grad_checkpointing" not in Config().to_dict()["model"]


@pytest.mark.parametrize("value", ["true", "false"])
def test_the_old_key_on_the_command_line_is_one_line_naming_the_new(value):
    with pytest.raises(UserError) as e:
        load_config(ROOT / "recipes" / "demo_digits.py", [f"model.grad_checkpointing={value}"])
    assert str(e.value) == f"command line: {LINE}"


OLD_RECIPE = """from vitlarge.recipes.vit_l16 import config as base


def config():
    c = base()
    c.model.grad_checkpointing = True
    return c
"""
"""A recipe written before the rename: a dataclass takes any attribute, so the old assignment would otherwise be
ignored without a word."""


@pytest.mark.parametrize(
    "name, text, where",
    [("old.yaml", "model:\n  grad_checkpointing: true\n", "overrides"), ("old_l16.py", OLD_RECIPE, "recipe")],
)
def test_the_old_key_in_an_overrides_file_or_a_recipe_names_the_file(tmp_path, name, text, where):
    f = tmp_path / name
    f.write_text(text)
    recipe = f if where == "recipe" else ROOT / "recipes" / "demo_digits.py"
    with pytest.raises(UserError) as e:
        load_config(recipe, override_files=[f] if where == "overrides" else [])
    assert str(e.value) == f"{f}: {LINE}"


@pytest.mark.parametrize(
    "recorded, mode",
    [
        ({"grad_checkpointing": True}, "full"),
        ({"grad_checkpointing": False}, "off"),
        ({"grad_checkpointing": True, "activation_checkpointing": "selective"}, "selective"),
        ({"activation_checkpointing": "full"}, "full"),
    ],
)
def test_a_recorded_config_reads_the_old_key_as_the_new(recorded, mode):
    """What meta.json recorded before the rename (the model section held the key, the train section had no
    activation_checkpointing), and either beside the new key."""
    model = {"name": "vit_large_patch16_224", **{k: v for k, v in recorded.items() if k == "grad_checkpointing"}}
    train = {"micro_batch": 8, **{k: v for k, v in recorded.items() if k == "activation_checkpointing"}}
    read = upgrade_recorded({"model": model, "train": train})
    assert read["model"] == {"name": "vit_large_patch16_224"}
    assert read["train"].get("activation_checkpointing", "off") == mode and read["train"]["micro_batch"] == 8


def test_a_recorded_config_of_another_shape_is_left_for_its_checks():
    for config in ({}, {"model": "not a map"}, {"model": {"grad_checkpointing": True}, "train": []}):
        assert upgrade_recorded(config).get("train") == config.get("train")
