"""``train.deterministic`` (`vitlarge.train.settings.apply_determinism`): what it sets, up to the device call.

On this CPU-only machine the CUDA kernels cannot run; the test shows every process-wide switch that a
CUDA run relies on is set (and unset), the line a CUDA run logs, and that an op with no deterministic
kernel ends the run with one line naming the key. A GPU session runs the kernels themselves.
"""

from __future__ import annotations

import os

import pytest
import torch

from vitlarge.train.settings import DETERMINISTIC_CUBLAS, apply_determinism, explain_nondeterministic


@pytest.fixture
def restore_flags():
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.utils.deterministic.fill_uninitialized_memory,
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    )
    yield
    torch.use_deterministic_algorithms(before[0])
    torch.utils.deterministic.fill_uninitialized_memory = before[1]
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[2], before[3]
    if before[4] is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    else:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = before[4]


def test_on_sets_what_bitwise_resume_needs_and_the_cuda_line_says_so(restore_flags, monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    line = apply_determinism(True, "cuda")
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.is_deterministic_algorithms_warn_only_enabled()  # warn_only keeps the nondeterministic kernels
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert not torch.utils.deterministic.fill_uninitialized_memory
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == DETERMINISTIC_CUBLAS == ":4096:8"
    assert line.startswith("deterministic: on") and ":4096:8" in line
    assert apply_determinism(True, "cpu") == ""  # said nothing on CPU


def test_a_users_cublas_setting_is_kept(restore_flags, monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    assert ":16:8" in apply_determinism(True, "cuda")
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


def test_off_is_torchs_defaults(restore_flags):
    apply_determinism(True, "cpu")
    line = apply_determinism(False, "cuda")
    assert not torch.are_deterministic_algorithms_enabled()
    assert torch.utils.deterministic.fill_uninitialized_memory  # torch's default
    assert not torch.backends.cudnn.deterministic
    assert "not bitwise" in line


def test_training_steps_on_cpu_are_unchanged_by_it(restore_flags):
    """The CPU kernels vitlarge's ViT uses have deterministic versions (nothing raises) and the same numbers."""
    import timm

    def steps() -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, num_classes=10, depth=2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
        for _ in range(3):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        return [p.detach().clone() for p in model.parameters()]

    apply_determinism(False, "cpu")
    plain = steps()
    apply_determinism(True, "cpu")
    strict = steps()
    assert all(torch.equal(a, b) for a, b in zip(plain, strict, strict=True))


def test_an_op_without_a_deterministic_kernel_is_one_line_naming_the_key():
    # torch's message for such an op (aten/src/ATen/Context.cpp, alertNotDeterministic)
    e = RuntimeError(
        "adaptive_max_pool2d_backward_cuda does not have a deterministic implementation, but you set "
        "'torch.use_deterministic_algorithms(True)'. You can turn off determinism just for this operation, ..."
    )
    line = explain_nondeterministic(e)
    assert line.startswith("adaptive_max_pool2d_backward_cuda has no deterministic kernel on this device")
    assert "train.deterministic=false" in line and "\n" not in line
    assert explain_nondeterministic(RuntimeError("CUDA out of memory")) is None


def test_a_cublas_setting_torch_refuses_is_replaced(restore_flags, monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")
    apply_determinism(True, "cuda")
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
