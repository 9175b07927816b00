"""train.compile (vitlarge/train/assemble.py): the model's forward through torch.compile, in place, before the Booster.

Here, in process: ``auto`` resolved by device with the line that says why, and the recompile limit that
fits a run's graphs. The parameter names of a compiled model in checkpoints, the export and
model.init_from are in tests/unit/checkpoint/test_export.py; whole compiled runs (losses that follow
eager's, graphs across phases, an exact resume, DDP) in tests/e2e/test_compile_runs.py.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import ROOT
from vitlarge.config.load import load_recipe
from vitlarge.errors import UserError
from vitlarge.plan.plan import make_plan
from vitlarge.train.assemble import compile_model, recompile_limit
from vitlarge.train.settings import compile_choice, compile_scope_choice, resolve_settings

DEMO = ROOT / "recipes" / "demo_digits.py"
TINY = "model.kwargs={'patch_size': 4, 'embed_dim': 32, 'depth': 1, 'num_heads': 2}"

torch.set_num_threads(1)


def tiny_cfg(**train):
    c = load_recipe(DEMO)
    c.model.kwargs = dict(patch_size=4, embed_dim=32, depth=1, num_heads=2)
    c.train.precision = "fp32"
    c.augment.mixup_alpha = 0.0
    for k, v in train.items():
        setattr(c.train, k, v)
    return c


def test_auto_is_on_with_cuda_off_on_cpu_and_the_log_line_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_LIBCUDA_PATH", str(tmp_path))  # no GPU driver here: Triton's libcuda found
    on, why = compile_choice("auto", torch.device("cpu"))
    assert not on and why.startswith("compile auto -> off: CPU: ")
    assert why.endswith("(train.compile in vitlarge-train --help)")  # installed, there is no docs/ to point at
    on, why = compile_choice("auto", torch.device("cuda"))
    assert on and why.startswith("compile auto -> on: CUDA")
    assert compile_choice("on", torch.device("cpu")) == (True, "compile on: set by the recipe")
    c = tiny_cfg(compile="auto")
    settings = resolve_settings(c, "cpu")
    assert c.train.compile == "auto" and not settings.compile  # the recipe's object untouched


def test_compile_scope_auto_is_blocks_under_fsdp_and_model_under_ddp_and_the_line_says_which():
    assert compile_scope_choice("auto", "fsdp").scope == "blocks"
    assert compile_scope_choice("auto", "ddp").scope == "model"
    assert (
        compile_scope_choice("blocks", "ddp").scope == "blocks"
        and compile_scope_choice("model", "fsdp").scope == "model"
    )
    on = resolve_settings(tiny_cfg(compile="on", plugin="fsdp"), "cpu")
    assert (on.compile, on.compile_scope) == (True, "blocks")
    assert on.compile_why == (
        "compile on: set by the recipe; each transformer block compiled on its own (train.compile_scope auto: fsdp, "
        "whose per-block hooks would break a whole-model graph at every block)"
    )
    assert resolve_settings(tiny_cfg(compile="on", compile_scope="model"), "cpu").compile_why == (
        "compile on: set by the recipe; the whole model as one graph (train.compile_scope=model)"
    )
    off = resolve_settings(tiny_cfg(compile="off", plugin="fsdp"), "cpu")
    assert off.compile_why == "compile off: set by the recipe"  # no scope where nothing is compiled


def test_blocks_scope_refuses_a_model_without_transformer_blocks():
    with pytest.raises(UserError, match="^train.compile_scope=blocks compiles transformer blocks one by one; Linear"):
        compile_model(torch.nn.Linear(2, 2), make_plan(tiny_cfg(), 1, 1437), "blocks")


def test_recompile_limit_fits_three_graphs_per_phase():
    c = load_recipe(ROOT / "recipes" / "demo_digits_progressive.py")
    assert recompile_limit(make_plan(c, 2, 1437)) == 3 * 3 + 2
    assert recompile_limit(make_plan(load_recipe(DEMO), 2, 1437)) == 3 + 2


def hide_compilers(monkeypatch, tmp_path):
    """PATH with no compiler on it (an empty folder), and no CC/CXX: a compute node without build-essential."""
    bare = tmp_path / "bin"
    bare.mkdir()
    monkeypatch.setenv("PATH", str(bare))
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.delenv("CXX", raising=False)


def test_compile_on_without_a_compiler_is_one_line_naming_the_package_and_auto_runs_eager(monkeypatch, tmp_path):
    """Item 4 of issue 31: Inductor's toolchain before step 1, not a traceback from inside Inductor at step 1."""
    monkeypatch.setenv("TRITON_LIBCUDA_PATH", str(tmp_path))
    hide_compilers(monkeypatch, tmp_path)
    with pytest.raises(UserError) as e:
        compile_choice("on", torch.device("cpu"))
    assert str(e.value) == (
        "train.compile=on, but g++ (Inductor's C++ compiler; set CXX for another) is not on PATH: install it "
        "(Debian/Ubuntu: apt install build-essential; RHEL: dnf install gcc-c++), or set train.compile=off to "
        "train eager"
    )
    with pytest.raises(UserError, match=r"^train.compile=on, but no C compiler for Triton \(CC unset"):
        compile_choice("on", torch.device("cuda"))
    assert compile_choice("auto", torch.device("cuda")) == (
        False,
        "compile auto -> off: no C compiler for Triton (CC unset, neither gcc nor clang on PATH): "
        "install gcc (Debian/Ubuntu: apt install build-essential; RHEL: dnf install gcc), so eager",
    )
    assert compile_choice("off", torch.device("cuda")) == (False, "compile off: set by the recipe")
    monkeypatch.setenv("CXX", "/opt/nowhere/clang++")  # the user's compiler, named but absent
    with pytest.raises(
        UserError, match=r"^train.compile=on, but /opt/nowhere/clang\+\+ \(Inductor's C\+\+ compiler, from CXX\)"
    ):
        compile_choice("on", torch.device("cpu"))


def test_missing_python_headers_and_triton_and_libcuda_are_named(monkeypatch, tmp_path):
    import sys
    import sysconfig

    monkeypatch.setenv("TRITON_LIBCUDA_PATH", str(tmp_path))
    real = sysconfig.get_paths
    monkeypatch.setattr(sysconfig, "get_paths", lambda *a, **k: {**real(*a, **k), "include": str(tmp_path)})
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    with pytest.raises(UserError) as e:
        compile_choice("on", torch.device("cpu"))
    assert str(e.value) == (
        f"train.compile=on, but the Python headers are missing ({tmp_path}/Python.h, which Inductor's "
        f"kernels include): install them (Debian/Ubuntu: apt install python{py}-dev; RHEL: dnf install "
        f"python{py}-devel), or set train.compile=off to train eager"
    )
    monkeypatch.setattr(sysconfig, "get_paths", real)
    monkeypatch.setitem(sys.modules, "triton", None)  # an import of it fails, as where it is not installed
    on, why = compile_choice("auto", torch.device("cuda"))
    assert not on and why.startswith("compile auto -> off: triton is not importable (Inductor's GPU kernels): ")
    monkeypatch.delitem(sys.modules, "triton")
    from triton.backends.nvidia import driver

    def no_driver():  # Triton's lookup on a node without the driver's library (a device query: faked here)
        raise AssertionError("libcuda.so cannot found!")

    monkeypatch.setattr(driver, "libcuda_dirs", no_driver)
    assert compile_choice("auto", torch.device("cuda")) == (
        False,
        "compile auto -> off: Triton finds no libcuda.so.1 (not in `ldconfig -p` nor LD_LIBRARY_PATH): set "
        "TRITON_LIBCUDA_PATH to the folder of the driver's libcuda.so.1, so eager",
    )
