"""Assembly of a run (vitlarge/train/assemble.py): model, optimizer, Booster plugin, precision and engine, combined once.

On the real Colossal-AI Booster in a gloo group of one, CPU. What `build` guarantees: precision and
compile ``auto`` resolved by device before anything reads them; the same initial weights on every
build with the same seed (so on every rank); LAMB's parameter groups; the Booster's wrappers in the
engine; ``model.init_from`` loaded before the optimizer sees the weights, and skipped on a resume.
"""

from __future__ import annotations

import pytest
import torch
from colossalai.interface import ModelWrapper, OptimizerWrapper

from tests.helpers import ROOT
from vitlarge.checkpoint.export import export
from vitlarge.config.load import load_recipe
from vitlarge.model.vit import build_model
from vitlarge.optim.lamb import Lamb
from vitlarge.plan.plan import make_plan
from vitlarge.train.assemble import build
from vitlarge.train.settings import resolve_settings

CPU = torch.device("cpu")


@pytest.fixture(scope="module", autouse=True)
def one_thread_group(process_group):
    torch.set_num_threads(1)


def demo(**train):
    cfg = load_recipe(ROOT / "recipes" / "demo_digits.py")
    cfg.train.global_batch, cfg.train.micro_batch = 32, 16
    cfg.augment.mixup_alpha = 0.0
    for k, v in train.items():
        setattr(cfg.train, k, v)
    return cfg


def assemble(cfg, **kwargs):
    return build(cfg, make_plan(cfg, 1, 1437), resolve_settings(cfg, "cpu"), **kwargs)


def weights(parts) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in parts.model.unwrap().state_dict().items()}


def test_auto_precision_and_compile_are_resolved_by_device_before_the_parts_are_built():
    cfg = demo(precision="auto", compile="auto")
    parts = assemble(cfg)
    assert (cfg.train.precision, cfg.train.compile) == ("auto", "auto")  # the recipe's object is not rewritten
    assert parts.cfg is cfg  # the parts read the settings, not a rewritten copy
    settings = parts.settings
    assert settings.precision in ("fp32", "bf16", "fp16") and parts.precision.name == settings.precision
    assert not settings.compile  # CPU: compile does not pay
    assert parts.engine.settings is settings
    assert parts.model.unwrap()._compiled_call_impl is None  # the forward is the eager one
    settings = resolve_settings(demo(precision="auto"), CPU)
    assert settings.precision_why.startswith(f"precision auto -> {settings.precision}: ")
    assert resolve_settings(demo(precision="fp32"), CPU).precision_why == ""  # the recipe's own choice: no line


def test_the_engine_holds_the_boosters_wrappers_of_one_model_and_its_optimizer():
    parts = assemble(demo(precision="fp32"))
    assert isinstance(parts.model, ModelWrapper) and isinstance(parts.optimizer, OptimizerWrapper)
    e = parts.engine
    assert (e.model, e.optimizer, e.precision, e.booster) == (
        parts.model,
        parts.optimizer,
        parts.precision,
        parts.booster,
    )
    opt = parts.optimizer.optim
    assert isinstance(opt, Lamb)
    in_optimizer = {id(p) for g in opt.param_groups for p in g["params"]}
    assert in_optimizer == {id(p) for p in parts.model.unwrap().parameters()}  # the boosted model's own tensors
    decay, no_decay = opt.param_groups
    names = {id(p): n for n, p in parts.model.unwrap().named_parameters()}
    assert (decay["trust_ratio"], no_decay["trust_ratio"], no_decay["weight_decay"]) == (True, False, 0.0)
    assert decay["weight_decay"] == demo().optim.weight_decay > 0
    excluded = {names[id(p)] for p in no_decay["params"]}
    assert {"cls_token", "pos_embed", "head.bias", "norm.weight"} <= excluded
    assert not any(n.endswith(".bias") or "norm" in n for n in (names[id(p)] for p in decay["params"]))
    assert parts.precision.sharded is False and assemble(demo(precision="fp32", plugin="fsdp")).precision.sharded


def test_the_same_seed_builds_the_same_weights_whatever_ran_before():
    a = weights(assemble(demo(precision="fp32")))
    torch.manual_seed(123)  # another rank's RNG state: build reseeds
    torch.randn(1000)
    b = weights(assemble(demo(precision="fp32")))
    c = weights(assemble(demo(precision="fp32", seed=1)))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_init_from_loads_the_pretrained_weights_and_a_resume_skips_it(tmp_path):
    source = demo(precision="fp32")
    torch.manual_seed(7)
    pretrained = build_model(source)
    out = export(tmp_path, pretrained, source, [str(i) for i in range(10)])
    expected = pretrained.state_dict()

    cfg = demo(precision="fp32")
    cfg.model.init_from = str(out)
    loaded = weights(assemble(cfg))
    assert all(torch.equal(loaded[k], expected[k]) for k in expected)

    cfg = demo(precision="fp32")
    cfg.model.init_from = str(out)
    resumed = weights(assemble(cfg, init_from=False))  # a resume: the checkpoint's weights come next
    fresh = weights(assemble(demo(precision="fp32")))
    assert all(torch.equal(resumed[k], fresh[k]) for k in fresh)
    assert any(not torch.equal(resumed[k], expected[k]) for k in expected)


@pytest.mark.parametrize(("precision", "backend"), [("fp32", "cpu"), ("fp16", "unfused")])
def test_a_build_logs_the_attention_kernel_it_chose_once(caplog, precision, backend):
    """The precision is named, not ``auto``: auto is fp16 on a CPU with AVX512-FP16, where ``model.fused_attn=auto``
    keeps timm's unfused attention (`vitlarge.model.vit.build_model`), and fp32 or bf16 elsewhere."""
    with caplog.at_level("INFO", logger="vitlarge"):
        parts = assemble(demo(precision=precision))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("attention:")]
    assert parts.attention is not None and lines == [parts.attention.line]
    assert parts.attention.backend == backend and f"3 heads x 17 tokens x 32 dims, {precision}" in lines[0]


def test_optim_implementation_auto_is_chunked_on_cpu_foreach_on_cuda_and_reaches_the_optimizer():
    from vitlarge.train.settings import lamb_implementation

    assert assemble(demo(precision="fp32")).optimizer.optim.implementation == "chunked"
    cfg = demo(precision="fp32")
    cfg.optim.implementation = "foreach"
    assert assemble(cfg).optimizer.optim.implementation == "foreach"
    assert (lamb_implementation("auto", CPU), lamb_implementation("auto", torch.device("cuda"))) == (
        "chunked",
        "foreach",
    )
    assert resolve_settings(demo(plugin="fsdp"), CPU).lamb_implementation == "chunked"
    cfg = demo(precision="fp32", plugin="fsdp")  # the sharded LAMB keeps the form
    cfg.optim.implementation = "foreach"
    assert assemble(cfg).optimizer.optim.implementation == "foreach"


def test_optim_implementation_compiled_without_a_compiler_is_one_line(monkeypatch, tmp_path):
    from vitlarge.errors import UserError
    from vitlarge.train.settings import lamb_implementation

    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # a node without build-essential
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(UserError) as e:
        lamb_implementation("compiled", CPU)
    assert str(e.value).startswith("optim.implementation=compiled, but g++ (Inductor's C++ compiler; set CXX")
    assert str(e.value).endswith(", or set optim.implementation=auto")
    assert lamb_implementation("compiled", CPU, check_toolchain=False) == "compiled"  # --dry-run checks nothing


def test_the_assembly_imports_no_timm_before_the_pre_flight_checks(monkeypatch):
    # build_run imports this module before the process group and the checks of model.init_from, the workdir and
    # --resume: a bad path there is one line without waiting for timm (seconds, with wandb through timm.utils).
    # timm is blocked and the modules that could load it imported afresh.
    import importlib
    import sys

    for name in ("timm", "timm.layers", "timm.models", "timm.optim"):
        monkeypatch.setitem(sys.modules, name, None)
    for name in ("vitlarge.train.assemble", "vitlarge.optim.lamb", "vitlarge.checkpoint.init_from"):
        package, _, child = name.rpartition(".")
        monkeypatch.setattr(importlib.import_module(package), child, sys.modules.get(name), raising=False)
        monkeypatch.delitem(sys.modules, name, raising=False)  # both restored: later tests get the same modules
    assert callable(importlib.import_module("vitlarge.train.assemble").build)
