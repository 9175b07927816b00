"""The export (vitlarge/checkpoint/export.py): a timm ``local-dir:`` folder any timm user loads in one line.

The export loads in timm with the trained model's outputs and is replaced whole on a rerun; a
read-only workdir fails in one line and leaves nothing; the declared input size is the last phase's
eval size; a compiled model exports (and checkpoints, and initialises) under the plain module's names.
"""

import os
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import load_file

from tests.helpers import ROOT, mounts
from tests.helpers.recipes import demo
from tests.helpers.tiny_model import trained
from vitlarge.checkpoint import store
from vitlarge.checkpoint import weights as ckpt_weights
from vitlarge.checkpoint.export import export
from vitlarge.checkpoint.init_from import load_into
from vitlarge.checkpoint.state import RunState
from vitlarge.checkpoint.trust import layout
from vitlarge.config.load import load_recipe
from vitlarge.errors import UserError
from vitlarge.model.vit import build_model
from vitlarge.plan.plan import make_plan
from vitlarge.train.assemble import compile_model

DEMO = ROOT / "recipes" / "demo_digits.py"

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def cfg():
    return load_recipe(DEMO)


def tiny_cfg(**train):
    """The demo shrunk to one block of width 32 (as in tests/unit/train/test_compile.py)."""
    c = load_recipe(DEMO)
    c.model.kwargs = dict(patch_size=4, embed_dim=32, depth=1, num_heads=2)
    c.train.precision = "fp32"
    c.augment.mixup_alpha = 0.0
    for k, v in train.items():
        setattr(c.train, k, v)
    return c


def test_export_loads_in_timm_with_identical_outputs(tmp_path, cfg):
    model, opt, scaler = trained(cfg)
    names = [f"n{i:08d}" for i in range(10)]
    path = export(tmp_path, model, cfg, names, {"n00000003": "three"})
    assert path == tmp_path / "model" and sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    export(tmp_path, model, cfg, names)  # again (a rerun of a finished run): replaced whole, nothing left over
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    # One line, nothing else to know: architecture, model arguments and class count come from config.json.
    loaded = timm.create_model(f"local-dir:{path}", pretrained=True)
    assert loaded.num_classes == 10 and loaded.pretrained_cfg["label_names"] == names
    data_cfg = timm.data.resolve_data_config(model=loaded)
    assert tuple(data_cfg["input_size"]) == (3, 16, 16) and data_cfg["crop_pct"] == cfg.data.val_crop_pct
    assert tuple(data_cfg["mean"]) == cfg.data.mean and tuple(data_cfg["std"]) == cfg.data.std
    x = torch.randn(5, 3, 16, 16)
    model.eval(), loaded.eval()
    with torch.no_grad():
        # Same weights, different attention kernel: the recipe's model runs unfused attention (fp16 on
        # CPU, model.fused_attn=auto), timm's default is fused SDPA, so outputs agree to rounding.
        torch.testing.assert_close(model(x), loaded(x), rtol=1e-5, atol=1e-6)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in loaded.state_dict().items())

    fresh = build_model(cfg)
    ckpt_weights.load_model_weights(path, fresh, cfg)  # evaluation reads the export folder too
    with torch.no_grad():
        assert torch.equal(fresh.eval()(x), model(x))


def test_evaluating_an_export_at_another_image_size_names_the_size_its_config_json_records(tmp_path):
    """``python -m vitlarge.evaluate --checkpoint <export>`` with another data.image_size than the export's."""
    small = tiny_cfg()  # 16 px
    path = export(tmp_path, build_model(small), small)
    big = tiny_cfg()
    big.data.image_size = 32
    with pytest.raises(UserError) as e:
        ckpt_weights.load_model_weights(path, build_model(big), big)
    assert str(e.value) == (
        f"export {path} was trained at data.image_size=16 (its config.json: input_size 3x16x16), this run has "
        "data.image_size=32 (pos_embed [1, 17, 32] there, [1, 65, 32] here); pass data.image_size=16"
    )
    wider = tiny_cfg()
    wider.model.kwargs = dict(wider.model.kwargs, embed_dim=48, num_heads=3)
    with pytest.raises(UserError) as e:  # another architecture: torch's first mismatch, not its bare header
        ckpt_weights.load_model_weights(path, build_model(wider), wider)
    assert str(e.value).startswith(f"{path} does not fit model vit_tiny_patch16_224: size mismatch for ")


def test_export_to_a_full_or_read_only_workdir_is_one_line_and_leaves_nothing(tmp_path, cfg):
    model, _, _ = trained(cfg)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.access(ro, os.W_OK):  # root ignores permission bits: make the file system itself read-only
            mounts.bind_read_only(ro)
            mounted = True
        else:
            mounted = False
        with pytest.raises(UserError, match=rf"exporting {ro / 'model'} failed .*run the same command again"):
            export(ro, model, cfg)
        assert list(ro.iterdir()) == []
    finally:
        if mounted:
            mounts.unmount(ro)
        ro.chmod(0o700)


def test_the_export_declares_the_last_phases_eval_size():
    from vitlarge.checkpoint.export import data_config

    c = demo([{"epoch": 0, "image_size": 8}, {"epoch": 40, "image_size": 16, "eval_size": 20}])
    assert data_config(c)["input_size"] == (3, 20, 20) and c.data.image_size == 16
    assert data_config(demo([{"epoch": 0, "image_size": 8}, {"epoch": 40, "image_size": 12}]))["input_size"] == (
        3,
        12,
        12,
    )
    assert data_config(load_recipe(DEMO))["input_size"] == (3, 16, 16)


def test_the_export_says_how_the_final_top1_was_validated(tmp_path):
    """``vitlarge_validation``: the last phase's crop, ``rectangular`` (``rect_val``) or ``square``; a model that
    validated rectangular batches takes any grid when timm loads it (``dynamic_img_size`` in its arguments)."""
    import json

    from vitlarge.checkpoint.export import validation

    assert validation(load_recipe(DEMO)) == "square"
    fastai = demo([{"epoch": 0, "image_size": 8}, {"epoch": 40, "image_size": 16, "rect_val": True}])
    assert validation(fastai) == "rectangular"
    assert validation(demo([{"epoch": 0, "rect_val": True}, {"epoch": 40, "rect_val": False}])) == "square"
    rect = tiny_cfg()
    rect.data.rect_val = True
    path = export(tmp_path, build_model(rect), rect)
    assert json.loads((path / "config.json").read_text())["vitlarge_validation"] == "rectangular"
    loaded = timm.create_model(f"local-dir:{path}", pretrained=True).eval()
    with torch.no_grad():
        assert loaded(torch.randn(1, 3, 16, 24)).shape == (1, 10)


@pytest.mark.parametrize("scope", ["model", "blocks"])
def test_compiled_model_saves_exports_and_initialises_under_the_plain_names(tmp_path, scope):
    """Checkpoint, export and init_from round trip with compile on, the whole model or each block compiled
    (``train.compile_scope``): the keys are the eager model's. Compiling itself waits for a forward: none here."""
    c = tiny_cfg(compile="on")
    c.model.kwargs = {**c.model.kwargs, "depth": 2}
    plan = make_plan(c, 1, 1437)
    torch.manual_seed(0)
    eager = build_model(c)
    names = list(eager.state_dict())
    torch.manual_seed(0)
    model = build_model(c)
    compile_model(model, plan, scope)
    compiled = [m._compiled_call_impl is not None for m in (model, *model.blocks)]
    assert compiled == ([True, False, False] if scope == "model" else [False, True, True])
    assert list(model.state_dict()) == names and [n for n, _ in model.named_parameters()] == [
        n for n, _ in eager.named_parameters()
    ]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)  # weights no fresh model has
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt = store.save(tmp_path, RunState(model, opt, torch.amp.GradScaler("cpu", enabled=False), step=1), c, keep=1)
    assert sorted(ckpt_weights.weights_of(ckpt, layout.read_meta(ckpt))) == sorted(names)
    out = export(tmp_path, model, c, [str(i) for i in range(10)])
    assert sorted(load_file(str(Path(out) / "model.safetensors"))) == sorted(names)

    target = tiny_cfg(compile="on")
    target.model.kwargs, target.model.init_from = c.model.kwargs, str(out)
    torch.manual_seed(1)
    fresh = build_model(target)
    compile_model(fresh, plan, scope)
    load_into(fresh, target)
    for (n, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), n
    again = build_model(target)
    compile_model(again, plan, scope)
    ckpt_weights.load_model_weights(ckpt, again, target)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))


def test_an_ema_export_holds_the_average_and_says_so_and_a_plain_one_says_raw(tmp_path, cfg):
    """``train.export_ema``: the run exports `ModelEma.full` (the average) with ``ema=True``; both files say
    which weights they hold (config.json ``vitlarge_weights``, the safetensors metadata)."""
    import json

    from safetensors import safe_open

    from tests.helpers.tiny_model import train_step
    from vitlarge.model.ema import ModelEma

    model, opt, scaler = trained(cfg)
    ema = ModelEma(model, decay=0.9)
    train_step(model, opt, scaler, seed=5)
    ema.update(2)
    for which, tensors in (("raw", None), ("ema", ema.full(rank=0))):
        out = export(tmp_path / which, model, cfg, [str(i) for i in range(10)], tensors=tensors, ema=which == "ema")
        assert json.loads((out / "config.json").read_text())["vitlarge_weights"] == which
        with safe_open(str(out / "model.safetensors"), "pt") as f:
            assert f.metadata()["weights"] == which
        loaded = timm.create_model(f"local-dir:{out}", pretrained=True).state_dict()
        expected = ema.state_dict() if which == "ema" else model.state_dict()
        assert all(torch.equal(v, expected[k]) for k, v in loaded.items())
        assert any(not torch.equal(v, model.state_dict()[k]) for k, v in loaded.items()) == (which == "ema")


def test_an_older_timm_without_data_config_exports_the_same_config_json(tmp_path, monkeypatch):
    """The first GPU run's timm 1.0.29 (the pin is 1.0.31) trained, then died at the export: its
    ``save_config_for_hf`` has no ``data_config``. The export then writes ``pretrained_cfg`` itself, and
    the folder's config.json is what the pinned timm writes; the phases recipe's declares its eval size.
    Here timm's own function is called through the older signature (checked with timm 1.0.29 itself by
    hand: the same config.json up to default model arguments, and it loads in both versions)."""
    import json

    from timm.models import _hub

    from vitlarge.model.vit import build_model as build

    c = demo([{"epoch": 0, "image_size": 8}, {"epoch": 40, "image_size": 16, "eval_size": 20}])
    model = build(c)
    names = [str(i) for i in range(10)]
    native = json.loads((export(tmp_path / "new", model, c, names) / "config.json").read_text())
    current = _hub.save_config_for_hf

    def older(model, config_path, model_config=None, model_args=None):  # timm 1.0.29's parameters
        return current(model, config_path, model_config=model_config, model_args=model_args)

    monkeypatch.setattr(_hub, "save_config_for_hf", older)
    out = export(tmp_path / "old", model, c, names)
    assert json.loads((out / "config.json").read_text()) == native
    loaded = timm.create_model(f"local-dir:{out}", pretrained=True)
    assert tuple(timm.data.resolve_data_config(model=loaded)["input_size"]) == (3, 20, 20)


def test_timms_reader_and_vitlarge_agree_on_each_images_class_by_name(tmp_path):
    """Issue 55: class folders ``1, 2, 10`` are labelled 0, 1, 2 by timm's reader (natural sort) and 0, 2, 1 by the
    converter (sorted as text, torchvision's order): comparing indices mislabels silently. Names carry the mapping:
    dataset.json's classes and the export's label_names are in vitlarge's index order, so every image's class is the
    same name through either, and timm's reader given the export's names (``class_map``) yields vitlarge's indices
    (docs/DATA.md, "Class order")."""
    from tfrecord.reader import tfrecord_loader

    from data_tools.imagenet_to_tfrecord import convert
    from tests.helpers.data_fixtures import make_colour_folder
    from vitlarge.config.load import load_config
    from vitlarge.data.manifest import load_manifest

    src, out = tmp_path / "src", tmp_path / "tfr"
    for split, n in (("train", 2), ("val", 2)):
        make_colour_folder(str(src), {"1": 0, "2": 120, "10": 240}, n, split)
    convert(str(src), str(out), workers=0, progress=False, min_class_images=1)
    manifest = load_manifest(str(out))
    names = [c.synset for c in manifest.classes]  # what a run exports (vitlarge/run/job.py)
    assert names == ["1", "10", "2"]
    cfg = load_config(DEMO, ["data.num_classes=3"])
    path = export(tmp_path / "run", build_model(cfg), cfg, names)
    label_names = timm.create_model(f"local-dir:{path}", pretrained=True).pretrained_cfg["label_names"]
    assert label_names == names

    fields = {"image/class/label": "int", "image/filename": "byte"}
    records = [r for s in manifest.shards("validation") for r in tfrecord_loader(str(out / s.file), None, fields)]
    ours = {r["image/filename"].decode(): int(r["image/class/label"][0]) - manifest.label_offset for r in records}
    timms = timm.data.create_dataset("", root=str(src / "val"))
    by_index = {i: c for c, i in timms.reader.class_to_idx.items()}
    theirs = {Path(p).name: t for p, t in timms.reader.samples}
    assert sorted(ours) == sorted(theirs) and len(ours) == 6
    assert {n: by_index[theirs[n]] for n in ours} == {n: label_names[ours[n]] for n in ours}  # the same names
    assert any(theirs[n] != ours[n] for n in ours)  # not the same indices: "10" is timm's 2, vitlarge's 1
    mapped = timm.data.create_dataset("", root=str(src / "val"), class_map={c: i for i, c in enumerate(label_names)})
    assert {Path(p).name: t for p, t in mapped.reader.samples} == ours
