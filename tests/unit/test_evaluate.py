"""vitlarge.evaluate's as-trained config: a checkpoint is evaluated as its meta.json says it trained (in process;
the evaluation runs themselves: e2e/test_evaluate.py, e2e/test_evaluate_phases.py)."""

import json
import sys

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


DEMO = ROOT / "recipes" / "demo_digits.py"


def test_an_export_is_evaluated_at_the_size_and_preprocessing_its_config_json_records(tmp_path):
    """The export of a 48 px run, evaluated with the 16 px recipe: its weights load once its config.json's size is
    taken (before, only a checkpoint folder was evaluated as trained; its export was refused)."""
    from vitlarge.checkpoint import weights as ckpt_weights
    from vitlarge.checkpoint.export import export
    from vitlarge.evaluate import as_exported
    from vitlarge.model.vit import build_model

    trained = load_config(DEMO, ["data.image_size=48", "data.val_crop_pct=0.9", "data.mean=0.5,0.5,0.5"])
    path = export(tmp_path, build_model(trained), trained)
    cfg = load_config(DEMO)
    assert as_exported(cfg, path) == (["data.image_size", "data.mean", "data.val_crop_pct"], 48)
    assert (cfg.data.image_size, cfg.data.mean, cfg.data.val_crop_pct) == (48, (0.5, 0.5, 0.5), 0.9)
    ckpt_weights.load_model_weights(path, build_model(cfg), cfg)  # no longer "trained at data.image_size=48"
    assert as_exported(cfg, path) == ([], 48)  # as trained now: no warning


@pytest.mark.parametrize(
    "doc",
    [
        [],
        {"model_args": {"img_size": "big"}, "pretrained_cfg": {"crop_pct": "7", "input_size": [3, 9]}},
        {"model_args": {"img_size": [48, 32]}, "pretrained_cfg": {"input_size": [3, 2, 4]}},
        {"model_args": {"img_size": True}, "pretrained_cfg": {"crop_pct": float("nan")}},
    ],
)  # fmt: skip
def test_an_export_config_json_of_other_types_changes_nothing(tmp_path, doc):
    from vitlarge.evaluate import as_exported, exported_settings

    (tmp_path / "config.json").write_text(json.dumps(doc))
    assert exported_settings(tmp_path) == {}
    cfg = load_config(DEMO)
    assert as_exported(cfg, tmp_path) == ([], None) and cfg.data.image_size == 16


METRICS = {"val_top1": 0.9833, "val_top5": 1.0, "val_loss": 0.08213, "val_images": 360}


def test_a_script_reading_the_table_is_told_once_on_stderr_that_the_json_is_json(capsys, monkeypatch):
    """The JSON line was the default output before the table: where a pipe reads stdout, one line on stderr says
    where it went; ``--json`` prints that line alone (stderr empty), and a terminal gets the table alone."""
    from vitlarge.evaluate import JSON_MOVED, show, table

    show(METRICS, "runs/x/model", None, 16, as_json=False)
    out, err = capsys.readouterr()
    assert out == table("runs/x/model", None, 16, METRICS) + "\n"
    assert err.splitlines() == [JSON_MOVED] and "--json" in JSON_MOVED
    assert f"`{JSON_MOVED}`" in (ROOT / "CHANGELOG.md").read_text()  # the change it points to is recorded there
    show(METRICS, "runs/x/model", None, 16, as_json=True)
    out, err = capsys.readouterr()
    assert json.loads(out) == METRICS and out.count("\n") == 1 and err == ""
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    show(METRICS, "runs/x/model", None, 16, as_json=False)
    out, err = capsys.readouterr()
    assert out.startswith("evaluated  runs/x/model\n") and err == ""


def test_json_is_json_where_the_loss_is_not_finite(capsys):
    """fp16 logits past its range give a loss of inf: --json printed ``Infinity`` (``NaN``), which strict JSON readers
    (jq, JSON.parse) refuse; null, as metrics.jsonl writes it (hooks.jsonl)."""
    from vitlarge.evaluate import show

    for bad in (float("inf"), float("nan")):
        show({**METRICS, "val_loss": bad}, "runs/x/model", None, 16, as_json=True)
        out = capsys.readouterr().out

        def refuse(constant):
            raise ValueError(f"not JSON: {constant}")

        assert json.loads(out, parse_constant=refuse) == {**METRICS, "val_loss": None}


def test_top5_is_reported_only_where_it_can_miss():
    """Of 5 classes or fewer every image is in the top 5: a 100% that measures nothing (issue 55), left out of the
    table and None in the JSON (CHANGELOG.md)."""
    from vitlarge.evaluate import table, top5_or_none

    assert top5_or_none(METRICS, 6) == METRICS
    assert top5_or_none(METRICS, 5) == {**METRICS, "val_top5": None}
    assert [row.split()[0] for row in table("m", None, 16, top5_or_none(METRICS, 5)).splitlines()] == [
        "evaluated",
        "images",
        "top-1",
        "loss",
    ]


def test_the_result_is_a_table_a_person_reads():
    from vitlarge.evaluate import table

    metrics = {"val_top1": 0.9833, "val_top5": 1.0, "val_loss": 0.08213, "val_images": 360}
    assert table("runs/x/checkpoints/step_0000660", 660, 16, metrics).splitlines() == [
        "evaluated  runs/x/checkpoints/step_0000660 (step 660)",
        "images     360 validation images at 16 px",
        "top-1      98.33%",
        "top-5      100.00%",
        "loss       0.0821",
    ]


def _export_with(tmp_path, **edits):
    """The demo's 16 px export with config.json's ``section.key`` values replaced (``pretrained_cfg__std=...``)."""
    from vitlarge.checkpoint.export import export
    from vitlarge.model.vit import build_model

    cfg = load_config(DEMO)
    path = export(tmp_path, build_model(cfg), cfg)
    doc = json.loads((path / "config.json").read_text())
    for name, value in edits.items():
        section, key = name.split("__")
        doc[section][key] = value
    (path / "config.json").write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize(
    "key, value",
    [
        ("pretrained_cfg__input_size", [3, 4096, 4096]),  # > 7 GiB in 28 s before
        ("pretrained_cfg__input_size", [3, 1 << 20, 1 << 20]),
        ("model_args__img_size", 16384),  # a 6.9 GB model built before the weights' check refused it
        ("pretrained_cfg__std", [0, 0, 0]),  # "top-1 9.72%, loss nan", exit 0
        ("pretrained_cfg__std", [1e-30, 1e-30, 1e-30]),
        ("pretrained_cfg__mean", [300, 0, 0]),
        ("pretrained_cfg__std", [0.5, 0.5]),  # left out before: the recipe's std, exit 0
        ("pretrained_cfg__mean", [1, 2]),
        ("pretrained_cfg__std", ["a", 1, 2]),
        ("pretrained_cfg__mean", [10**400, 0, 0]),  # math.isfinite's OverflowError: a traceback before
        ("pretrained_cfg__crop_pct", 10**400),
        ("pretrained_cfg__mean", None),
        ("pretrained_cfg__crop_pct", 7),
        ("pretrained_cfg__input_size", [3, 18, 18]),  # not whole patches of 4: timm's AssertionError
        ("pretrained_cfg__input_size", [3, 1024, 1024]),  # 65,536 patches of 4 px: past MAX_EVAL_TOKENS
        ("pretrained_cfg__input_size", [3, 260, 260]),  # 65x65 = 4,225 patches: the first side past it
    ],
)
def test_an_export_config_json_value_outside_the_schemas_rules_is_one_line_naming_it(tmp_path, key, value):
    from vitlarge.evaluate import as_exported

    path = _export_with(tmp_path, **{key: value})
    cfg = load_config(DEMO)
    with pytest.raises(UserError) as e:
        as_exported(cfg, path)
    message = str(e.value)
    assert message.startswith(f"{path / 'config.json'}: {key.replace('__', '.')} is ") and "\n" not in message
    assert cfg.model.kwargs.get("dynamic_img_size") is None


@pytest.mark.parametrize("side", [18, 260])  # not whole patches of 4; 65x65 = 4,225 patches, past MAX_EVAL_TOKENS
def test_an_export_size_a_recipe_may_state_is_refused_without_calling_the_file_damaged(tmp_path, side):
    """data.image_size=18 or 260 plans and trains on the demo recipe, and its export states it: the refusal names
    the checkpoint folder as the way to evaluate that run, and does not say the run's own file was edited."""
    from vitlarge.evaluate import as_exported

    path = _export_with(tmp_path, pretrained_cfg__input_size=[3, side, side])
    with pytest.raises(UserError) as e:
        as_exported(load_config(DEMO), path)
    message = str(e.value)
    assert "edited or damaged" not in message and message.endswith(
        "evaluate the run's checkpoint folder (checkpoints/step_*) instead"
    )


def test_an_export_evaluated_at_another_size_than_its_grid_runs_as_its_run_evaluated(tmp_path):
    """A run with phases evaluates at its last phase's eval_size (a FixRes-style 32 px after training at 16): its
    export's config.json says so, and evaluate used to meet timm's raw AssertionError on the model's fixed grid."""
    from tests.helpers import call_main

    path = _export_with(tmp_path, pretrained_cfg__input_size=[3, 32, 32])
    synthetic = ["data.source=synthetic", "data.synthetic_val_examples=16"]  # 16 images: the size is what matters
    r = call_main("vitlarge.evaluate", "--config", str(DEMO), "--checkpoint", str(path), *synthetic)
    assert r.returncode == 0 and "16 validation images at 32 px" in r.stdout, r.stderr


@pytest.mark.parametrize(
    "grid, phases, size",
    [
        (16, [{"epoch": 0, "image_size": 8}, {"epoch": 2, "image_size": 16, "eval_size": 20}], 20),  # FixRes
        (8, [{"epoch": 0, "image_size": 8}, {"epoch": 2, "image_size": 16, "eval_size": 24}], 24),  # 3x its grid
    ],
    ids=["a FixRes last phase", "a last phase past the model's grid"],
)
def test_a_phased_runs_own_export_is_evaluated_with_its_own_recipe(tmp_path, grid, phases, size):
    """A phased run's export records its last phase's eval_size, which differs from data.image_size: evaluated
    with the recipe that trained it, whose phases already ask for timm's ``dynamic_img_size`` as the export's
    evaluation does (the two met as one keyword given twice: TypeError), at whatever ratio to the model's grid."""
    from tests.helpers import call_main
    from vitlarge.checkpoint.export import export
    from vitlarge.model.vit import build_model

    recipe = tmp_path / "phased.py"
    recipe.write_text(
        "from vitlarge.recipes.demo_digits import config as base\n\n\n"
        "def config():\n"
        "    c = base()\n"
        f"    c.data.image_size = {grid}\n"
        f"    c.train.phases = {phases!r}\n"
        "    return c\n"
    )
    path = export(tmp_path / "run", build_model(load_config(recipe)), load_config(recipe))
    synthetic = ["data.source=synthetic", "data.synthetic_val_examples=16"]
    r = call_main("vitlarge.evaluate", "--config", str(recipe), "--checkpoint", str(path), *synthetic)
    assert r.returncode == 0 and f"16 validation images at {size} px" in r.stdout, r.stderr


def test_help_describes_every_argument_and_cites_no_source_file():
    """Issue 55 item 10: ``vitlarge-evaluate --help`` says what each argument is; an installed package has no
    source tree to cite."""
    from tests.helpers import call_main

    r = call_main("vitlarge.evaluate", "--help")
    text = " ".join(r.stdout.split())
    assert r.returncode == 0 and "vitlarge/" not in text and ".py)" not in text
    for described in (
        "--config CONFIG the recipe the model was trained with",
        "--data DATA TFRecord directory with dataset.json whose validation split is evaluated",
        "--overrides FILE a .py (dotted.key = value lines) or .yaml file of overrides",
        "key=value dotted config overrides: optim.lr=0.01",
        "Evaluates a checkpoint or an exported model exactly",
    ):
        assert described in text, described


COLOURS = {"one": 0, "two": 70, "three": 140, "four": 210, "five": 280}


def _named_export(tmp_path, names: list[str]):
    """The demo's model with ``len(names)`` classes exported with ``names`` as its label_names."""
    from vitlarge.checkpoint.export import export
    from vitlarge.model.vit import build_model

    cfg = load_config(DEMO, [f"data.num_classes={len(names)}"])
    return export(tmp_path / "run", build_model(cfg), cfg, names)


def _converted(tmp_path, classes: dict[str, int]) -> str:
    from data_tools.imagenet_to_tfrecord import convert
    from tests.helpers.data_fixtures import make_colour_folder

    make_colour_folder(str(tmp_path / "src"), classes, 2, "val")
    convert(str(tmp_path / "src"), str(tmp_path / "data"), workers=0, progress=False)
    return str(tmp_path / "data")


def test_a_data_set_with_classes_the_export_does_not_know_is_one_line_and_exit_2(tmp_path):
    """Issue 55: the class names were never compared; a set of other classes was scored by index, exit 0."""
    from tests.helpers import call_main

    path = _named_export(tmp_path, sorted(COLOURS))
    data = _converted(tmp_path, {"one": 0, "six": 30, "seven": 60})
    r = call_main("vitlarge.evaluate", "--checkpoint", str(path), "--data", data)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.splitlines() == [
        f"error: {data}/dataset.json: 2 of its 3 classes (seven, six) are not among the model's 5 (five, four, one, "
        f"three, two; {path}/config.json); evaluate on a data set of the model's classes"
    ]


def test_another_recipes_config_for_an_export_is_one_line_naming_the_keys_to_set(tmp_path):
    """torch's ``size mismatch for head.weight`` before, after the model was built; now before anything is."""
    from tests.helpers import call_main

    path = _named_export(tmp_path, sorted(COLOURS))
    data = _converted(tmp_path, COLOURS)
    r = call_main("vitlarge.evaluate", "--config", "vit_b16", "--checkpoint", str(path), "--data", data)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.splitlines() == [
        f"error: {path}/config.json records another model than --config vit_b16 gives "
        "(model.name=vit_base_patch16_224, data.num_classes=1000); pass model.name=vit_tiny_patch16_224 "
        "data.num_classes=5, or leave out --config: the export's config.json is enough"
    ]
    r = call_main("vitlarge.evaluate", "--config", str(DEMO), "--checkpoint", str(path), "--data", data)
    assert r.returncode == 2 and "pass data.num_classes=5, or leave out --config" in r.stderr


def test_an_export_is_evaluated_from_its_own_config_json_without_a_recipe(tmp_path):
    """--config was required even for an export that carries its config; its config.json builds the model."""
    from tests.helpers import call_main

    path = _export_with(tmp_path)
    synthetic = ["data.source=synthetic", "data.synthetic_val_examples=16", "train.precision=fp32"]
    r = call_main("vitlarge.evaluate", "--checkpoint", str(path), *synthetic)
    assert r.returncode == 0 and "16 validation images at 16 px" in r.stdout, r.stderr
    r = call_main("vitlarge.evaluate", "--checkpoint", str(path))
    assert (r.returncode, r.stderr) == (2, "error: --data is needed without --config: pass the converted data "
                                           "folder (its dataset.json)\n")  # fmt: skip


def test_a_checkpoint_folder_still_needs_its_recipe(tmp_path):
    from tests.helpers import call_main

    (tmp_path / "meta.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    r = call_main("vitlarge.evaluate", "--checkpoint", str(tmp_path / "model.safetensors"))
    assert r.returncode == 2 and r.stderr.startswith(f"error: {tmp_path}: --config is needed")


def test_a_checkpoint_that_does_not_exist_is_said_so_not_that_config_is_needed(tmp_path):
    """A mistyped step without --config was told "--config is needed for a checkpoint folder"."""
    from tests.helpers import call_main

    (tmp_path / "checkpoints" / "step_0000110").mkdir(parents=True)
    typo = tmp_path / "checkpoints" / "step_000011"
    r = call_main("vitlarge.evaluate", "--checkpoint", str(typo), "--data", str(tmp_path))
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == (
        f"error: checkpoint {typo} does not exist; {typo.parent} holds step_0000110; pass a checkpoints/step_* "
        "folder or an exported model folder\n"
    )


@pytest.mark.parametrize("names", [["a"] * 5, ["a", "b"], [1, 2, 3, 4, 5], "abcde"])
def test_damaged_label_names_are_one_line_naming_the_file(tmp_path, names):
    from vitlarge.checkpoint.model_of import of_export

    path = _named_export(tmp_path, list("abcde"))
    doc = json.loads((path / "config.json").read_text())
    doc["label_names"] = names
    (path / "config.json").write_text(json.dumps(doc))
    with pytest.raises(UserError, match=r"label_names is not 5 distinct class names .* edited or damaged"):
        of_export(path)


def test_a_validation_only_set_of_some_of_the_exports_classes_evaluates_without_a_recipe(tmp_path):
    """Issue 55's user: a test folder of 4 of a 5-class export's classes, converted without train/ (a validation
    split alone), evaluated with the export's own config.json: scored on those 4 by name, said in one line, and no
    top-5 (every image is in the top 5 of 4). The accuracy itself: e2e/test_evaluate.py."""
    from tests.helpers import call_main

    path = _named_export(tmp_path, sorted(COLOURS))
    data = _converted(tmp_path, {k: v for k, v in COLOURS.items() if k != "four"})
    r = call_main("vitlarge.evaluate", "--checkpoint", str(path), "--data", data, "train.precision=fp32")
    assert r.returncode == 0, r.stderr
    assert f"scoring 4 of the model's 5 classes by name: five, one, three, two ({data}/dataset.json has no four)" in (
        r.stderr.splitlines()
    )
    assert not [line for line in r.stderr.splitlines() if line.startswith("warning:")]  # no --config to differ from
    assert [line.split()[0] for line in r.stdout.splitlines()] == ["evaluated", "images", "top-1", "loss"]
    assert "8 validation images at 16 px" in r.stdout


def test_a_checkpoint_with_another_class_count_than_config_is_one_line_naming_the_key(tmp_path):
    """A checkpoint folder's meta.json records its model: a --config of another class count (the data set's, say) is
    one line naming data.num_classes, not training's "use another --workdir or --resume"."""
    from tests.helpers import call_main
    from tests.helpers.tiny_model import make
    from vitlarge.checkpoint import store
    from vitlarge.checkpoint.state import RunState

    cfg = load_config(DEMO)
    model, opt, scaler = make(cfg)
    path = store.save(tmp_path, RunState(model, opt, scaler, step=1, data="state"), cfg, keep=1)
    synthetic = ["data.source=synthetic", "data.num_classes=4"]
    r = call_main("vitlarge.evaluate", "--config", str(DEMO), "--checkpoint", str(path), *synthetic)
    assert (r.returncode, r.stderr) == (
        2,
        f"error: {path}/meta.json records another model than --config {DEMO} gives (data.num_classes=4); pass "
        "data.num_classes=10 (or the recipe that trained it)\n",
    )


def test_a_checkpoint_of_other_classes_is_one_line_and_exit_2_not_scored_by_index(tmp_path):
    """Review of issue 55: a checkpoint recorded no class names, so a set of as many other classes was scored by
    index (a wrong top-1, exit 0). Its meta.json now records the data set's names, compared as an export's are."""
    from tests.helpers import call_main
    from tests.helpers.tiny_model import make
    from vitlarge.checkpoint import store
    from vitlarge.checkpoint.state import RunState

    cfg = load_config(DEMO, ["data.num_classes=5"])
    model, opt, scaler = make(cfg)
    path = store.save(tmp_path, RunState(model, opt, scaler, step=1, classes=sorted(COLOURS)), cfg, keep=1)
    data = _converted(tmp_path, {"one": 0, "six": 30, "seven": 60, "eight": 90, "nine": 120})
    args = ("--config", str(DEMO), "--checkpoint", str(path), "--data", data, "data.num_classes=5")
    r = call_main("vitlarge.evaluate", *args)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.startswith(f"error: {data}/dataset.json: 4 of its 5 classes (eight, nine, seven, six) are not ")
    assert f"{path}/meta.json" in r.stderr


def test_a_bare_model_safetensors_is_mapped_by_the_names_in_its_folders_config_json(tmp_path):
    """Review of issue 55: a ``model.safetensors`` path skipped the config.json beside it (its ``label_names``)."""
    from tests.helpers import call_main

    path = _named_export(tmp_path, sorted(COLOURS))
    data = _converted(tmp_path, {"one": 0, "six": 30, "seven": 60, "eight": 90, "nine": 120})
    r = call_main("vitlarge.evaluate", "--checkpoint", str(path / "model.safetensors"), "--data", data)
    assert (r.returncode, r.stdout) == (2, "")
    assert f"are not among the model's 5 (five, four, one, three, two; {path}/config.json)" in r.stderr


@pytest.mark.parametrize(
    "args, key, said",
    [
        ({"embed_dim": 65535, "depth": 64}, "embed_dim", "embed_dim is 65535, its model.safetensors holds 96"),
        ({"depth": 9}, "depth", "depth is 9, its model.safetensors holds 4"),
        ({"patch_size": 2}, "patch_size", "patch_size is 2, its model.safetensors holds 4"),
    ],
)
def test_an_export_config_json_that_does_not_describe_its_weights_is_one_line_before_a_model_is_built(
    tmp_path, args, key, said
):
    """Review of issue 55: a config.json of embed_dim 65536 and depth 64 tried to allocate 51 GB, and the line
    blamed model.kwargs, which the user never set. The model is now built on the meta device and compared with the
    weights file's header first; the line names config.json's key."""
    from tests.helpers import call_main

    path = _export_with(tmp_path)
    doc = json.loads((path / "config.json").read_text())
    doc["model_args"].update(args)
    (path / "config.json").write_text(json.dumps(doc))
    r = call_main("vitlarge.evaluate", "--checkpoint", str(path), "data.source=synthetic")
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.startswith(f"error: {path}/config.json: model_args.{key} ") and said in r.stderr, r.stderr
    assert len(r.stderr.splitlines()) == 1
