"""vitlarge/model/vit.py: recipe fields reach the timm modules; sizes match the published ViT-B/16."""

import pytest
import torch

from tests.helpers import ROOT
from vitlarge.config.load import load_recipe
from vitlarge.errors import UserError
from vitlarge.model.vit import build_model, describe_model, memory_estimate

torch.set_num_threads(1)


def demo():
    return load_recipe(ROOT / "recipes" / "demo_digits.py")


def test_dropout_fields_reach_the_timm_modules():
    cfg = demo()
    cfg.model.pos_drop_rate, cfg.model.attn_drop_rate = 0.11, 0.22
    cfg.model.proj_drop_rate, cfg.model.head_drop_rate = 0.33, 0.44
    cfg.model.drop_path_rate = 0.3
    m = build_model(cfg)
    assert m.pos_drop.p == 0.11
    for block in m.blocks:
        assert block.attn.attn_drop.p == 0.22
        assert block.attn.proj_drop.p == 0.33
        assert block.mlp.drop1.p == 0.33 and block.mlp.drop2.p == 0.33
    assert m.head_drop.p == 0.44
    # Stochastic depth grows linearly with depth up to drop_path_rate in the last block.
    assert m.blocks[-1].drop_path1.drop_prob == pytest.approx(0.3)
    assert isinstance(m.blocks[0].drop_path1, torch.nn.Identity)  # rate 0 in the first block


def test_uniform_drop_path_drops_every_block_at_the_rate_as_deit3():
    """DeiT III (models_v2.py) drops every residual branch with ``drop_path_rate``; timm spreads it from 0.
    The recipe's model, built, has 0.2 in every branch; in training a branch drops whole samples at that rate."""
    cfg = load_recipe(ROOT / "recipes" / "deit3_b16.py")
    assert cfg.model.drop_path_schedule == "uniform"
    cfg.model.kwargs = dict(cfg.model.kwargs, depth=3, embed_dim=48, num_heads=3)
    m = build_model(cfg, "meta")
    probs = [getattr(b, n).drop_prob for b in m.blocks for n in ("drop_path1", "drop_path2")]
    assert probs == [pytest.approx(0.2)] * 6
    branch = build_model(cfg).blocks[0].drop_path1.train()
    torch.manual_seed(0)
    kept = (branch(torch.ones(20000, 1, 1)) != 0).float().mean().item()
    assert kept == pytest.approx(0.8, abs=0.01)
    cfg.model.drop_path_rate = 0.0  # no stochastic depth at all: identities, as timm builds rate 0
    assert all(isinstance(b.drop_path2, torch.nn.Identity) for b in build_model(cfg, "meta").blocks)
    from vitlarge.model.vit import _uniform_drop_path

    with pytest.raises(UserError, match="drop_path_schedule=linear"):  # a model without timm's blocks
        _uniform_drop_path(torch.nn.Sequential(torch.nn.Linear(2, 2)), 0.1)


def test_vit_b16_recipe_dropout_is_the_originals_single_0_1():
    cfg = load_recipe(ROOT / "recipes" / "vit_b16.py")
    cfg.model.name, cfg.model.kwargs, cfg.data.image_size = "vit_tiny_patch16_224", dict(depth=1), 32
    m = build_model(cfg, "meta")
    assert (m.pos_drop.p, m.blocks[0].attn.attn_drop.p, m.blocks[0].mlp.drop1.p, m.head_drop.p) == (0.1, 0.1, 0.1, 0.0)


def test_demo_model_shape_and_forward():
    torch.manual_seed(0)
    cfg = demo()
    m = build_model(cfg).eval()
    assert (m.patch_embed.num_patches, m.embed_dim, len(m.blocks), m.num_classes) == (16, 96, 4, 10)
    n = sum(p.numel() for p in m.parameters())
    assert 0.4e6 < n < 0.5e6  # "a 0.46M-parameter ViT"
    with torch.no_grad():
        y = m(torch.randn(2, 3, 16, 16))
    assert y.shape == (2, 10) and torch.isfinite(y).all()


def test_full_recompute_is_timms_grad_checkpointing():
    cfg = demo()
    cfg.train.activation_checkpointing = "full"
    assert build_model(cfg, "meta").grad_checkpointing is True
    cfg.train.activation_checkpointing = "off"
    assert build_model(cfg, "meta").grad_checkpointing is False


def test_describe_vit_b16():
    cfg = load_recipe(ROOT / "recipes" / "vit_b16.py")
    info = describe_model(cfg)
    assert info["params"] == pytest.approx(86.57e6, rel=0.002)
    assert info["fwd_flops"] == pytest.approx(2 * 17.56e9, rel=0.02)  # timm's 17.56 GMACs per 224px image
    assert (info["depth"], info["dim"], info["heads"], info["tokens"]) == (12, 768, 12, 197)


def test_memory_estimate_scales_as_documented():
    info = dict(params=86_570_000, tokens=197, dim=768, heads=12, depth=12)
    base = memory_estimate(info, 256, "fp16", "off", sharded=False, world=4)
    assert base["states"] == 16 * info["params"] == base["weights"] + base["grads"] + base["optimizer"]
    assert base["total"] == base["states"] + base["activations"]
    fsdp = memory_estimate(info, 256, "fp16", "off", sharded=True, world=4)
    gathered = 2 * info["params"] / 12 * 2  # two bf16/fp16 blocks of twelve
    assert fsdp["states"] == pytest.approx(16 * info["params"] / 4 + gathered)
    no_sync = memory_estimate(info, 256, "fp32", "off", sharded=True, world=4, unsharded_grads=True)
    assert no_sync["grads"] == 4 * info["params"] == 4 * fsdp["grads"]  # whole fp32 gradients between micro-steps
    assert memory_estimate(info, 256, "fp32", "off", False, 4)["activations"] == 2 * base["activations"]
    assert memory_estimate(info, 256, "fp16", "full", False, 4)["activations"] < base["activations"] / 10
    ema = memory_estimate(info, 256, "fp16", "off", sharded=True, world=4, ema=True)  # train.ema_decay: sharded fp32
    assert (ema["ema"], base["ema"]) == (4 * info["params"] / 4, 0.0) and ema["states"] == fsdp["states"] + ema["ema"]


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("name", "vit_nonexistent_patch3", "vit_nonexistent_patch3"),
        ("kwargs", {"not_a_timm_kwarg": 1}, "not_a_timm_kwarg"),
    ],
)
def test_unknown_model_or_kwarg(field, value, match):
    cfg = demo()
    setattr(cfg.model, field, value)
    with pytest.raises(UserError, match=match):
        build_model(cfg, "meta")


@pytest.mark.parametrize(
    "override, message",
    [
        # A TypeError deep inside timm (40 lines, exit 1):
        ("depth=two", "model.kwargs.depth=two: VisionTransformer takes an int for depth; write it like model.kwargs.depth=12"),
        ("mlp_ratio=x", "model.kwargs.mlp_ratio=x: VisionTransformer takes a number for mlp_ratio; write it like model.kwargs.mlp_ratio=4.0"),
        ("patch_size=x,y", "model.kwargs.patch_size=x,y: VisionTransformer takes an int or numbers separated by commas for patch_size; write it like model.kwargs.patch_size=16"),
        # timm's AssertionError:
        ("global_pool=mean", "model.kwargs.global_pool=mean: VisionTransformer takes one of '', avg, avgmax, max, token, map, prr for global_pool; write it like model.kwargs.global_pool=token"),
        # Built without a word, the text taken as true:
        ("qkv_bias=no", "model.kwargs.qkv_bias=no: VisionTransformer takes true or false for qkv_bias; write it like model.kwargs.qkv_bias=true"),
        ("init_values=abc", "model.kwargs.init_values=abc: VisionTransformer takes a number or none for init_values; write it like model.kwargs.init_values=none"),
    ],
)  # fmt: skip
def test_a_kwarg_of_the_wrong_type_is_one_line_naming_the_key_and_the_fix(override, message):
    """model.kwargs against the annotations of the class timm builds (issue 45: ``model.kwargs.depth=two``)."""
    from vitlarge.config.overrides import apply_override

    cfg = demo()
    apply_override(cfg, f"model.kwargs.{override}")
    with pytest.raises(UserError) as e:
        build_model(cfg, "meta")
    assert str(e.value) == message


@pytest.mark.parametrize(
    "override, reason",
    [
        ("num_heads=5", "AssertionError: dim should be divisible by num_heads"),
        ("num_heads=0", "ZeroDivisionError: integer modulo by zero"),
        ("patch_size=0", "ZeroDivisionError: integer division or modulo by zero"),
        ("mlp_ratio=-1", "RuntimeError: Trying to create tensor with negative dimension -96: [-96, 96]"),
    ],
)
def test_kwargs_of_the_declared_types_that_timm_refuses_are_one_line(override, reason):
    """An int where an int is declared that timm's layers still refuse (a traceback from inside timm): one line
    naming the model, its kwargs and timm's reason."""
    from vitlarge.config.load import apply_override

    cfg = demo()
    apply_override(cfg, f"model.kwargs.{override}")
    with pytest.raises(UserError) as e:
        build_model(cfg, "meta")
    assert str(e.value) == (
        f"model.name='vit_tiny_patch16_224' / model.kwargs={cfg.model.kwargs}: VisionTransformer refused them "
        f"({reason}); fix model.kwargs"
    )


def test_a_long_kwarg_of_the_wrong_type_is_one_short_line():
    """A text of 5,000 characters where an int is declared: the line names its start, not all of it."""
    from vitlarge.config.load import apply_override

    cfg = demo()
    apply_override(cfg, "model.kwargs.depth=" + "x" * 5_000)
    with pytest.raises(UserError) as e:
        build_model(cfg, "meta")
    assert str(e.value) == (
        f"model.kwargs.depth={'x' * 60}: VisionTransformer takes an int for depth; write it like model.kwargs.depth=12"
    )


@pytest.mark.parametrize("override", ["depth=3", "mlp_ratio=2", "patch_size=4,4", "global_pool=avg", "init_values=0.1"])
def test_kwargs_of_the_declared_types_build(override):
    from vitlarge.config.overrides import apply_override

    cfg = demo()
    apply_override(cfg, f"model.kwargs.{override}")
    build_model(cfg, "meta")


def test_deit3_base_builds_at_192_px_with_layer_scale():
    """DeiT III's ViT-B/16 (timm's ``deit3_base_patch16_224``: LayerScale, no class token in the position
    embedding) at its 192 px pretraining size with the recipe's stochastic depth, on the meta device."""
    cfg = load_recipe(ROOT / "recipes" / "vit_b16.py")
    cfg.model.name, cfg.data.image_size = "deit3_base_patch16_224", 192
    cfg.model.pos_drop_rate = cfg.model.attn_drop_rate = cfg.model.proj_drop_rate = 0.0
    cfg.model.drop_path_rate = 0.2
    m = build_model(cfg, "meta")
    assert m.patch_embed.grid_size == (12, 12) and m.pos_embed.shape == (1, 144, 768) and m.no_embed_class
    assert m.blocks[0].ls1.gamma.shape == (768,) and m.blocks[-1].drop_path1.drop_prob == pytest.approx(0.2)
    assert m(torch.empty(2, 3, 192, 192, device="meta")).shape == (2, 1000)
    info = describe_model(cfg)
    assert (info["depth"], info["dim"], info["tokens"]) == (12, 768, 145)
    assert 86.5e6 < info["params"] < 86.7e6  # ViT-B/16's 86.6M (fewer position tokens, 2 x 12 x 768 gammas)


def test_rectangular_validation_builds_a_model_that_resamples_its_grid_and_trains_as_the_fixed_one():
    """With ``data.rect_val`` the model takes any grid (timm's ``dynamic_img_size``); at its own square grid it is
    the fixed-size model, weights, outputs and gradients bit for bit, so training is unchanged."""
    fixed, rect = demo(), demo()
    rect.data.rect_val = True
    torch.manual_seed(0)
    a = build_model(fixed)
    torch.manual_seed(0)
    b = build_model(rect)
    assert not getattr(a, "dynamic_img_size", False) and b.dynamic_img_size
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    x = torch.randn(4, 3, 16, 16)
    a(x).square().sum().backward()
    b(x).square().sum().backward()
    assert torch.equal(a(x), b(x))
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(a.parameters(), b.parameters()))
    b.eval()
    with torch.no_grad():
        assert b(torch.randn(2, 3, 16, 28)).shape == (2, 10) and b(torch.randn(2, 3, 24, 16)).shape == (2, 10)
