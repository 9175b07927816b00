"""The attention kernel chosen once per built model (vitlarge/model/attention.py): the model's attention shape, the
unfused and CPU answers, and the line a run logs. The CUDA choice (torch's checks in its priority order, then only
that backend left enabled) runs in the GPU kit, whose rows show the kernel that ran (benchmarks/gpu/kit.py)."""

from __future__ import annotations

import torch

from tests.helpers import ROOT
from vitlarge.config.load import load_recipe
from vitlarge.model.attention import attention_shape, choose_attention
from vitlarge.model.vit import build_model

CPU = torch.device("cpu")


def test_the_recipes_attention_shapes_are_read_off_the_model():
    shapes = {}
    for recipe in ("vit_b16", "vit_h14", "deit3_b16"):
        cfg = load_recipe(ROOT / "recipes" / f"{recipe}.py")
        shapes[recipe] = attention_shape(build_model(cfg, "meta"))
    assert shapes == {"vit_b16": (12, 197, 64), "vit_h14": (16, 257, 80), "deit3_b16": (12, 145, 64)}


def test_cpu_and_unfused_answers_name_the_shape_precision_and_dropout():
    cfg = load_recipe(ROOT / "recipes" / "vit_b16.py")
    model = build_model(cfg, "meta")
    c = choose_attention(model, CPU, "bf16", 0.1)
    assert c.backend == "cpu" and c.line.endswith("12 heads x 197 tokens x 64 dims, bf16, dropout 0.1")
    cfg.model.fused_attn = "off"
    c = choose_attention(build_model(cfg, "meta"), CPU, "fp32", 0.0)
    assert c.backend == "unfused" and "model.fused_attn" in c.line
