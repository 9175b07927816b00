"""`train.precision=auto`: the precision a device trains fastest in, decided once from what it has."""

from __future__ import annotations

import pytest
import torch

from vitlarge.model.precision import Precision, choose_precision, cpu_flags

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    "flags, expected",
    [
        ({"avx", "avx2"}, "fp32"),  # AMD EPYC (these machines): no AVX-512 at all
        ({"avx512f", "avx512_bf16"}, "fp32"),  # AVX512-BF16 without AMX: bf16 trailed fp32
        ({"avx512f", "avx512_bf16", "avx512_fp16"}, "fp16"),  # Intel Xeon with AVX512-FP16
        ({"avx512f", "amx_bf16", "amx_tile"}, "bf16"),  # Sapphire Rapids without AMX-FP16
        ({"amx_fp16", "amx_bf16"}, "fp16"),
        (set(), "fp32"),  # no /proc/cpuinfo (macOS)
    ],
)
def test_auto_on_cpu_follows_the_instruction_set(flags, expected):
    name, why = choose_precision("auto", CPU, frozenset(flags))
    assert name == expected and why


@pytest.mark.parametrize("name", ["fp16", "bf16", "fp32"])
def test_an_explicit_precision_is_kept_whatever_the_cpu(name):
    assert choose_precision(name, CPU, frozenset())[0] == name
    assert choose_precision(name, CPU, frozenset({"avx512_fp16"}))[0] == name


def test_this_machines_flags_are_read_and_resolve_to_a_concrete_precision():
    flags = cpu_flags()
    assert all(isinstance(f, str) for f in flags)
    assert choose_precision("auto", CPU)[0] in ("fp16", "bf16", "fp32")


def test_an_unresolved_precision_is_refused_by_the_engine_side():
    with pytest.raises(ValueError, match="resolve"):
        Precision("auto", CPU)
    assert Precision("fp16", CPU).scaler.is_enabled() and not Precision("bf16", CPU).scaler.is_enabled()


def test_an_explicit_fp16_on_a_cpu_without_fast_fp16_is_one_warning_line():
    from vitlarge.config.schema import Config
    from vitlarge.model.precision import cpu_fp16_warning
    from vitlarge.train.settings import resolve_settings

    epyc = frozenset({"avx", "avx2"})
    assert cpu_fp16_warning("fp16", CPU, epyc) == (
        "warning: train.precision=fp16 on a CPU without AVX512-FP16/AMX-FP16 trains about 5-10x slower than "
        "fp32 here; set train.precision=auto (fp32 on this CPU) or train.precision=fp32/bf16"
    )
    assert "(bf16 on this CPU)" in cpu_fp16_warning("fp16", CPU, frozenset({"amx_bf16"}))
    assert cpu_fp16_warning("fp16", CPU, frozenset({"avx512_fp16"})) == ""
    assert cpu_fp16_warning("fp32", CPU, epyc) == cpu_fp16_warning("bf16", CPU, epyc) == ""
    assert cpu_fp16_warning("fp16", torch.device("cuda"), epyc) == ""
    # A run logs it at start (Settings.lines), where this machine's CPU lacks fast fp16.
    cfg = Config()
    cfg.train.precision = "fp16"
    lines = resolve_settings(cfg, CPU).lines()
    assert lines == ([] if cpu_flags() & {"avx512_fp16", "amx_fp16"} else [cpu_fp16_warning("fp16", CPU)])


@pytest.mark.parametrize(
    "gpu, capability, expected, line",
    [
        (
            "NVIDIA H200",
            (9, 0),
            "bf16",
            "precision auto -> bf16: NVIDIA H200 (compute capability 9.0) has bf16 tensor cores: no loss scaling",
        ),
        (
            "NVIDIA A100-SXM4-80GB",
            (8, 0),
            "bf16",
            "precision auto -> bf16: NVIDIA A100-SXM4-80GB (compute capability 8.0) has bf16 tensor cores: no "
            "loss scaling",
        ),
        (
            "Tesla V100-SXM2-32GB",
            (7, 0),
            "fp16",
            "precision auto -> fp16: Tesla V100-SXM2-32GB (compute capability 7.0) has no bf16 tensor cores "
            "(8.0 and newer): fp16 with dynamic loss scaling",
        ),
        (
            "Tesla T4",
            (7, 5),
            "fp16",
            "precision auto -> fp16: Tesla T4 (compute capability 7.5) has no bf16 tensor cores (8.0 and newer): "
            "fp16 with dynamic loss scaling",
        ),
    ],
)
def test_auto_on_cuda_is_bf16_from_compute_capability_8_and_fp16_with_the_scaler_below(
    monkeypatch, gpu, capability, expected, line
):
    """No GPU here: the device queries are faked (torch.cuda's name, capability and availability)."""
    from tests.helpers import ROOT
    from vitlarge.config.load import load_recipe
    from vitlarge.train.settings import resolve_settings

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: gpu)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = load_recipe(ROOT / "recipes" / "vit_b16.py")
    cfg.train.precision, cfg.train.compile = "auto", "off"
    settings = resolve_settings(cfg, torch.device("cuda"), "nccl")
    assert (settings.precision, settings.lines()) == (expected, [line])
    scaler = Precision(settings.precision, torch.device("cuda")).scaler
    assert scaler.is_enabled() == (expected == "fp16")
