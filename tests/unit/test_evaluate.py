"""vitlarge.evaluate's as-trained config: a checkpoint is evaluated as its meta.json says it trained (in process;
the evaluation runs themselves: e2e/test_evaluate.py, e2e/test_evaluate_phases.py)."""

import json

import pytest

from tests.helpers import ROOT
from vitlarge.config.load import load_config
from vitlarge.config.schema import PhaseEntry
from vitlarge.errors import UserError
from vitlarge.evaluate import as_trained

PROGRESSIVE = ROOT / "recipes" / "demo_digits_progressive.py"


def saved_form(cfg) -> dict:
    """The config as a checkpoint's meta.json holds it: through JSON (tuples become lists)."""
    return json.loads(json.dumps(cfg.to_dict()))


def test_an_unchanged_config_is_as_trained_though_json_made_its_tuples_lists():
    cfg = load_config(PROGRESSIVE)
    assert any(isinstance(v, tuple) for p in cfg.to_dict()["train"]["phases"] for v in p.values())  # crop_scale
    assert as_trained(cfg, saved_form(cfg)) == []  # no "trained with other train.phases" warning


def test_a_changed_phase_list_is_taken_from_the_checkpoint_typed():
    trained = load_config(PROGRESSIVE, ["train.phases.1.micro_batch=16"])
    cfg = load_config(PROGRESSIVE)
    assert as_trained(cfg, saved_form(trained)) == ["train.phases"]
    assert all(isinstance(p, PhaseEntry) for p in cfg.train.phases)
    assert saved_form(cfg)["train"]["phases"] == saved_form(trained)["train"]["phases"]
    assert as_trained(cfg, saved_form(trained)) == []


def test_a_changed_tuple_value_stays_a_tuple():
    cfg = load_config(PROGRESSIVE)
    saved = saved_form(cfg)
    saved["data"]["mean"] = [0.5, 0.5, 0.5]
    assert as_trained(cfg, saved) == ["data.mean"] and cfg.data.mean == (0.5, 0.5, 0.5)


@pytest.mark.parametrize("phases", ["x", [1], [{"bogus": 1}]], ids=["a string", "a number", "an unknown key"])
def test_a_crafted_phase_list_in_meta_json_is_one_line(phases):
    cfg = load_config(PROGRESSIVE)
    saved = saved_form(cfg)
    saved["train"]["phases"] = phases
    with pytest.raises(UserError, match=r"^the checkpoint's meta.json: train.phases is not a phase list \(") as e:
        as_trained(cfg, saved)
    assert "\n" not in str(e.value)
