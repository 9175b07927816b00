"""Classes scored by name (`vitlarge.data.class_map`): a data set's classes against a model's, what
``vitlarge.evaluate`` scores (the evaluation itself: e2e/test_evaluate.py, unit/test_evaluate.py)."""

import pytest

from vitlarge.data.class_map import ClassMap, data_names, match
from vitlarge.data.manifest import ClassInfo, Manifest
from vitlarge.errors import UserError

MODEL = ["five", "four", "one", "three", "two"]
WHERE = dict(model_where="runs/ft/model/config.json", data_where="data/four/dataset.json")


def test_the_same_names_in_the_same_order_are_scored_as_they_are():
    assert match(MODEL, 5, MODEL, 5, **WHERE) == ClassMap(None, None)


def test_a_subset_is_scored_on_its_own_classes_by_name_and_said_in_one_line():
    """Issue 55's case: ``four`` missing; the set's labels 0..3 are the model's 0, 2, 3, 4."""
    m = match(MODEL, 5, ["five", "one", "three", "two"], 4, **WHERE)
    assert m.model_index == (0, 2, 3, 4) and m.scored == 4
    assert m.line == (
        "scoring 4 of the model's 5 classes by name: five, one, three, two (data/four/dataset.json has no four)"
    )


def test_the_same_classes_in_another_order_are_mapped_by_name():
    """A data set whose folders sort otherwise (timm's natural order ``1, 2, 10``; the converter's ``1, 10, 2``)."""
    m = match(["1", "10", "2"], 3, ["1", "2", "10"], 3, **WHERE)
    assert m.model_index == (0, 2, 1)
    assert m.line == "scoring the model's 3 classes by name: data/four/dataset.json lists them in another order"


def test_names_the_model_does_not_know_are_one_line():
    with pytest.raises(UserError) as e:
        match(MODEL, 5, ["five", "six", "seven\nerror: forged"], 3, **WHERE)
    assert str(e.value) == (
        "data/four/dataset.json: 2 of its 3 classes (six, seven\\nerror: forged) are not among the model's 5 "
        "(five, four, one, three, two; runs/ft/model/config.json); evaluate on a data set of the model's classes"
    )
    assert e.value.exit_status == 2


@pytest.mark.parametrize("model_names, names", [(None, MODEL[:4]), (MODEL, None), (None, None)])
def test_counts_that_differ_with_no_names_to_map_them_by_are_one_line(model_names, names):
    with pytest.raises(UserError, match=r"^the model has 5 classes, data/four/dataset.json 4, and .* records no class"):
        match(model_names, 5, names, 4, **WHERE)


@pytest.mark.parametrize(
    "model_names, names, unnamed",
    [(None, MODEL, "runs/ft/model/config.json"), (MODEL, None, "data/four/dataset.json")],
)
def test_equal_counts_with_names_on_one_side_are_scored_by_index_and_said_in_one_line(model_names, names, unnamed):
    """An older checkpoint records no class names: scored by index as before, never silently."""
    assert match(model_names, 5, names, 5, **WHERE) == ClassMap(
        None, f"classes matched by index: {unnamed} records no class names"
    )


def _manifest(classes: list[ClassInfo], num_classes: int) -> Manifest:
    return Manifest(num_classes=num_classes, label_offset=1, classes=classes, splits={})


def test_dataset_json_names_are_read_in_label_order():
    m = _manifest([ClassInfo(2, "b"), ClassInfo(1, "a"), ClassInfo(3, "c")], 3)
    assert data_names(m) == ["a", "b", "c"]
    assert data_names(_manifest([], 3)) is None  # make_index's set of synsets too long to hold: no names
    assert data_names(_manifest([ClassInfo(1, "a"), ClassInfo(2, "a")], 2)) is None


def test_a_set_of_one_of_the_models_classes_is_one_line_not_a_top1_of_100_percent():
    """Scored over its own classes, a one-class set's every image is right whatever the model: the digits demo's
    export on its 36 images of 4 printed top-1 100.00%, loss 0.0000, exit 0."""
    with pytest.raises(UserError) as e:
        match(MODEL, 5, ["four"], 1, **WHERE)
    assert str(e.value) == (
        "data/four/dataset.json holds one of the model's 5 classes (four): scored over its own classes every image "
        "is right whatever the model (top-1 100%, loss 0); evaluate on a data set of 2 or more of the model's classes"
    )
