"""vitlarge/checkpoint/init_from.py: fine-tuning starts from an export, a checkpoint folder or a timm checkpoint file,
with the position embedding resampled to the recipe's grid and a classifier of another class count new."""

import pytest
import torch
from timm.layers import resample_abs_pos_embed

from tests.helpers import ROOT
from vitlarge.checkpoint import store
from vitlarge.checkpoint.export import export
from vitlarge.checkpoint.init_from import check_source, load_into, plan_notes
from vitlarge.checkpoint.state import RunState
from vitlarge.config.load import load_recipe
from vitlarge.config.schema import OptimConfig
from vitlarge.errors import UserError
from vitlarge.model.vit import build_model
from vitlarge.optim.lamb import build_optimizer

DEMO = ROOT / "recipes" / "demo_digits.py"

torch.set_num_threads(1)


def cfg(**changes):
    c = load_recipe(DEMO)
    for key, value in changes.items():
        section, name = key.split("__")
        setattr(getattr(c, section), name, value)
    return c


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A trained-looking 16 px demo model (random weights, seed 0) exported as vitlarge exports it."""
    c = cfg()
    torch.manual_seed(0)
    model = build_model(c)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)  # not the initialisation any target model gets
    out = export(tmp_path_factory.mktemp("src"), model, c, [str(i) for i in range(10)])
    return model, out


def fresh(c):
    torch.manual_seed(1)
    return build_model(c)


def test_export_at_16_px_into_24_px_resamples_the_position_embedding(source, caplog):
    src, path = source
    c = cfg(data__image_size=24, model__init_from=str(path))
    model = fresh(c)
    notes = load_into(model, c)
    assert notes == [f"initialised from {path}", "position embedding resampled from a 4x4 to a 6x6 token grid"]
    want = resample_abs_pos_embed(src.pos_embed.detach(), new_size=[6, 6], old_size=[4, 4], num_prefix_tokens=1)
    assert model.pos_embed.shape == (1, 37, 96) and torch.equal(model.pos_embed.detach(), want)
    assert torch.equal(model.pos_embed[0, 0], src.pos_embed[0, 0])  # the class token's own embedding is kept
    other = {k: v for k, v in src.state_dict().items() if k != "pos_embed"}
    assert all(torch.equal(model.state_dict()[k], v) for k, v in other.items())
    with torch.no_grad():
        assert model(torch.randn(2, 3, 24, 24)).shape == (2, 10)


def test_another_class_count_gets_a_new_classifier_and_says_so(source):
    src, path = source
    c = cfg(data__num_classes=3, model__init_from=str(path / "model.safetensors"))
    model = fresh(c)
    head = model.head.weight.detach().clone()
    notes = load_into(model, c)
    assert notes[-1] == "classifier re-initialised: 10 classes in the source, 3 here"
    assert torch.equal(model.head.weight, head) and not torch.equal(model.head.weight[:3], src.head.weight[:3])
    assert torch.equal(model.blocks[3].mlp.fc2.weight, src.blocks[3].mlp.fc2.weight)


def test_a_checkpoint_folder_and_a_timm_checkpoint_file_load_the_same_weights(source, tmp_path):
    src, _ = source
    c = cfg()
    opt = build_optimizer(src, OptimConfig(lr=1e-2, weight_decay=0.1))
    ckpt = store.save(tmp_path / "run", RunState(src, opt, torch.amp.GradScaler("cpu"), step=7), c, keep=1)
    pth = tmp_path / "timm.pth"  # timm's train.py layout, saved from a DDP model
    torch.save({"epoch": 3, "state_dict": {f"module.{k}": v for k, v in src.state_dict().items()}}, pth)
    for path in (ckpt, pth):
        c.model.init_from = str(path)
        model = fresh(c)
        load_into(model, c)
        assert all(torch.equal(model.state_dict()[k], v) for k, v in src.state_dict().items())
    weights = ckpt / "__0_0.distcp"  # a checkpoint cut short: its meta.json's size check, one line
    weights.write_bytes(weights.read_bytes()[:-10])
    c.model.init_from = str(ckpt)
    with pytest.raises(UserError, match=r"__0_0.distcp has [\d,]+ bytes, meta.json records [\d,]+; pass a complete"):
        check_source(c)


def test_the_dry_runs_notes_say_what_the_run_does_to_the_head_and_position_embedding(source, tmp_path):
    """``--dry-run`` (`plan_notes`) says what `load_into` will do, for each kind of source: an export, its
    model.safetensors, a checkpoint folder (format 3: its DCP index) and a timm ``.pth``, from their shapes."""
    src, export_dir = source
    ckpt = store.save(
        tmp_path / "run",
        RunState(src, build_optimizer(src, OptimConfig(lr=1e-2)), torch.amp.GradScaler("cpu"), step=7),
        cfg(),
        keep=1,
    )
    torch.save({"state_dict": src.state_dict()}, tmp_path / "timm.pth")
    for path in (export_dir, export_dir / "model.safetensors", ckpt, tmp_path / "timm.pth"):
        assert plan_notes(cfg(model__init_from=str(path))) == [
            "classifier kept: 10 classes, as in the source",
            "position embedding kept: a 4x4 token grid, as in the source",
        ], path
        c = cfg(model__init_from=str(path), data__num_classes=5, data__image_size=24)
        notes = plan_notes(c)
        assert notes == [
            "classifier re-initialised: 10 classes in the source, 5 here",
            "position embedding resampled from a 4x4 to a 6x6 token grid",
        ], path
        if path == ckpt:  # the run's own notes, in its order (one source kind: the others read the same weights)
            assert load_into(fresh(c), c)[1:] == notes[::-1]
    c = cfg(model__init_from=str(export_dir))
    c.model.kwargs = dict(patch_size=2, embed_dim=96, depth=4, num_heads=3)
    with pytest.raises(UserError, match="its patch embedding is 4x4 px, 96 wide; the recipe's model is 2x2 px"):
        plan_notes(c)  # the run's one line, before any data


def test_a_timm_training_checkpoint_with_args_loads_its_ema_weights_and_says_so(source, tmp_path):
    """timm/DeiT/MAE checkpoints hold 'args': argparse.Namespace; weights_only alone refuses them."""
    import argparse

    src, _ = source
    sd = src.state_dict()
    ema = {k: v + 1 for k, v in sd.items()}
    pth = tmp_path / "checkpoint-3.pth.tar"
    torch.save(
        {
            "epoch": 3,
            "arch": "vit",
            "args": argparse.Namespace(lr=5e-4, model="vit", betas=None, drop=[0.1]),
            "state_dict": {f"module.{k}": v for k, v in sd.items()},
            "state_dict_ema": {**ema, "dist_token": torch.zeros(1, 1, 96)},
        },
        pth,
    )
    c = cfg(model__init_from=str(pth))
    check_source(c)
    model = fresh(c)
    notes = load_into(model, c)
    assert notes == [
        f"initialised from {pth} (its 'state_dict_ema')",
        "warning: 1 source tensor(s) not in the recipe's model, dropped: dist_token",
    ]
    assert all(torch.equal(model.state_dict()[k], v) for k, v in ema.items())


def test_a_global_pool_mismatch_is_one_line_naming_it(source):
    _, path = source
    c = cfg(model__init_from=str(path))
    c.model.kwargs = {**c.model.kwargs, "global_pool": "avg"}
    with pytest.raises(
        UserError,
        match=r"was trained with global_pool=token \(norm\), the recipe's model uses "
        r"global_pool=avg \(fc_norm\); set model.kwargs global_pool",
    ):
        check_source(c)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            dict(kwargs=dict(patch_size=2, embed_dim=96, depth=4, num_heads=3)),
            "its patch embedding is 4x4 px, 96 wide; the recipe's model is 2x2 px, 96 wide; fine-tune from a model with "
            "the same patch size",
        ),
        (
            dict(kwargs=dict(patch_size=4, embed_dim=96, depth=6, num_heads=3)),
            "is another architecture: it lacks 'blocks.4.norm1.weight' (24 of the recipe's 80 tensors missing)",
        ),
        (
            dict(kwargs=dict(patch_size=4, embed_dim=96, depth=4, num_heads=3, mlp_ratio=2.0)),
            "is another architecture: 'blocks.0.mlp.fc1.weight' is (384, 96), the recipe's model has (192, 96)",
        ),
    ],
)
def test_another_architecture_or_patch_size_is_one_line(source, change, message):
    _, path = source
    c = cfg(model__init_from=str(path))
    c.model.kwargs = change["kwargs"]
    with pytest.raises(UserError) as e:
        check_source(c)
    assert str(e.value).startswith(f"model.init_from={path}") and message in str(e.value)


def test_a_deit3_export_fine_tunes_at_a_larger_size_and_loads_into_timm(tmp_path):
    """A DeiT III-shaped model (timm's ``deit3_*``: LayerScale; position embedding of the patch grid only,
    ``no_embed_class``) exported at 16 px: timm loads the export as is, and ``model.init_from`` at 24 px
    resamples the grid-only position embedding (no prefix token) and copies the LayerScale gammas."""
    import timm

    deit3 = dict(
        model__name="deit3_base_patch16_224", model__kwargs=dict(patch_size=4, embed_dim=32, depth=2, num_heads=2)
    )
    c = cfg(**deit3)
    torch.manual_seed(0)
    src = build_model(c).eval()
    with torch.no_grad():
        for p in src.parameters():
            p.add_(0.01)
    path = export(tmp_path, src, c, [str(i) for i in range(10)])
    loaded = timm.create_model(f"local-dir:{path}", pretrained=True).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), src(x), rtol=0, atol=0)
    c = cfg(**deit3, data__image_size=24, model__init_from=str(path))
    model = fresh(c)
    notes = load_into(model, c)
    assert notes[1] == "position embedding resampled from a 4x4 to a 6x6 token grid"
    want = resample_abs_pos_embed(src.pos_embed.detach(), new_size=[6, 6], old_size=[4, 4], num_prefix_tokens=0)
    assert model.pos_embed.shape == (1, 36, 32) and torch.equal(model.pos_embed.detach(), want)
    assert torch.equal(model.blocks[1].ls2.gamma, src.blocks[1].ls2.gamma) and torch.equal(
        model.cls_token, src.cls_token
    )
    with torch.no_grad():
        assert model(torch.randn(2, 3, 24, 24)).shape == (2, 10)


def test_a_missing_init_from_is_one_line_before_timm_loads(monkeypatch, tmp_path):
    # The pre-flight check of a bad model.init_from path says so without importing timm (~1 s, with wandb
    # through timm.utils) first: timm is blocked and the module imported afresh.
    import importlib
    import sys

    monkeypatch.setitem(sys.modules, "timm", None)
    monkeypatch.setitem(sys.modules, "timm.layers", None)
    monkeypatch.setattr(
        importlib.import_module("vitlarge.checkpoint"), "init_from", sys.modules.get("vitlarge.checkpoint.init_from")
    )
    monkeypatch.delitem(sys.modules, "vitlarge.checkpoint.init_from", raising=False)  # both restored afterwards
    fresh = importlib.import_module("vitlarge.checkpoint.init_from")
    missing = tmp_path / "nowhere.pt"
    with pytest.raises(UserError, match=f"model.init_from={missing} does not exist"):
        fresh.check_source(cfg(model__init_from=str(missing)))


def test_the_dry_run_refuses_a_format2_checkpoints_linked_or_fifo_weights_as_the_run_does(source, tmp_path):
    """The dry run reads a format-2 checkpoint's model.safetensors only as the run's `weights_of` would: a link out of
    the folder or a FIFO (which blocked the header read for ever) is the run's one line, nothing read."""
    import os

    from tests.helpers.tiny_model import trained
    from tests.unit.checkpoint.test_store import write_format2

    c = cfg()
    ckpt = tmp_path / "run" / "checkpoints" / "step_0000002"
    write_format2(ckpt, *trained(c), c, 2)
    weights = ckpt / "model.safetensors"
    weights.rename(tmp_path / "outside.safetensors")
    os.symlink(tmp_path / "outside.safetensors", weights)
    with pytest.raises(
        UserError, match=r"model.safetensors is a symbolic link \(refused.*; pass a complete checkpoint"
    ):
        plan_notes(cfg(model__init_from=str(ckpt)))
    weights.unlink()
    os.mkfifo(weights)
    with pytest.raises(UserError, match="model.safetensors is not a regular file; pass a complete checkpoint"):
        plan_notes(cfg(model__init_from=str(ckpt)))


def _peak_rss_during(fn):
    """``fn()``'s result and the most this process's resident memory grew while it ran (sampled each 0.5 ms)."""
    import os
    import threading
    import time

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    before, peak, done = rss(), [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.0005)

    t = threading.Thread(target=sample)
    t.start()
    try:
        out = fn()
    finally:
        done.set()
        t.join()
    return out, max(peak[0], rss()) - before


def test_the_dry_runs_shape_reads_are_bounded_in_absolute_terms(tmp_path):
    """Shapes alone: a .pth's tensors are mapped, not read (32 MB of weights add a few MB at most); a safetensors
    header past `HEADER_MAX_BYTES` or listing more than `HEADER_MAX_TENSORS` tensors is one line, never parsed."""
    import json
    import struct

    from vitlarge.checkpoint.init_from import source_shapes
    from vitlarge.checkpoint.trust.torch_files import HEADER_MAX_BYTES, HEADER_MAX_TENSORS

    pth = tmp_path / "big.pth"
    torch.save({"state_dict": {"w": torch.ones(8 << 20)}}, pth)  # 32 MB
    shapes, grew = _peak_rss_during(lambda: source_shapes(pth))
    assert shapes["w"].shape == (8 << 20,) and grew < 12 << 20, grew
    big = tmp_path / "big.safetensors"
    big.write_bytes(struct.pack("<Q", HEADER_MAX_BYTES + 1) + b" " * 16)
    with pytest.raises(UserError, match=rf"big.safetensors has a header of {HEADER_MAX_BYTES + 1:,} bytes, more than"):
        source_shapes(big)
    many = tmp_path / "many.safetensors"
    empty = {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}
    header = json.dumps({f"{i}": empty for i in range(HEADER_MAX_TENSORS + 1)}, separators=(",", ":"))
    many.write_bytes(struct.pack("<Q", len(header)) + header.encode())
    with pytest.raises(UserError, match=rf"many.safetensors lists {HEADER_MAX_TENSORS + 1:,} tensors, more than"):
        source_shapes(many)


def test_weights_holding_nan_are_one_line_at_load_not_a_nan_guard_stop(tmp_path):
    """A source with a NaN weight trained 5 steps of nan losses, then stopped with exit 3 and "lower the lr or use
    bf16": the cause was the file."""
    c = cfg()
    model = fresh(c)
    with torch.no_grad():
        model.blocks[0].attn.qkv.weight[0, 0] = float("nan")
    path = export(tmp_path / "src", model, c, [str(i) for i in range(10)])
    c = cfg(model__init_from=str(path))
    with pytest.raises(UserError) as e:
        load_into(fresh(c), c)
    assert str(e.value) == (
        f"model.init_from={path}: blocks.0.attn.qkv.weight holds NaN or inf (the file was damaged, or its run "
        "diverged); pass another model's weights"
    )
    assert e.value.same_on_all_ranks  # every rank loads the same file: printed once
