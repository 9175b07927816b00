"""vitlarge/distributed/plugins.py: the Booster plugin puts the model on the device we chose, not on Colossal-AI's guess.

Colossal-AI's TorchDDPPlugin moves the model to its global accelerator's current device, which it
detects as CUDA whenever CUDA is available. These tests put Colossal-AI in that state (its CUDA
accelerator, as on a GPU host) and check that ``train.device=cpu`` still boosts onto the CPU, on
a real Booster with a gloo group of one.
"""

from __future__ import annotations

import pytest
import torch
from colossalai.accelerator import api as accelerator_api
from colossalai.accelerator import get_accelerator, set_accelerator
from colossalai.booster import Booster
from colossalai.booster.plugin import TorchDDPPlugin

from vitlarge.config.schema import Config
from vitlarge.distributed.plugins import build_plugin
from vitlarge.errors import UserError

CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("process_group")  # a gloo group of one (tests/helpers/process_group.py)


@pytest.fixture
def cuda_host_accelerator():
    """Colossal-AI as it configures itself on a CUDA host; restored afterwards (it is process-global)."""
    before = accelerator_api._ACCELERATOR
    set_accelerator("cuda")
    yield
    accelerator_api._ACCELERATOR = before


def boost(plugin):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, *_ = Booster(plugin=plugin).boost(model, opt)
    return model


def test_cpu_device_keeps_the_model_on_cpu_where_colossalai_would_pick_cuda(cuda_host_accelerator):
    cfg = Config()
    model = boost(build_plugin(cfg, CPU, "fp32"))
    assert {p.device for p in model.parameters()} == {CPU}
    assert get_accelerator().get_current_device() == CPU  # and the rest of Colossal-AI agrees


def test_without_the_explicit_device_colossalai_moves_the_model_to_cuda(cuda_host_accelerator):
    """The control: the stock plugin follows the accelerator (to CUDA, or fails where there is none)."""
    if torch.cuda.is_available():
        assert {p.device.type for p in boost(TorchDDPPlugin()).parameters()} == {"cuda"}
    else:
        with pytest.raises(RuntimeError, match="NVIDIA driver|CUDA"):
            boost(TorchDDPPlugin())


def test_zero_is_refused_with_a_pointer_to_fsdp():
    from vitlarge.config.load import validate

    cfg = Config()
    cfg.train.plugin = "zero"
    with pytest.raises(UserError, match="train.plugin=zero was removed; use train.plugin=fsdp"):
        validate(cfg)


def test_fsdp_refuses_a_model_without_transformer_blocks():
    from vitlarge.distributed.fsdp import FSDPPlugin

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(UserError, match="train.plugin=fsdp needs a model with transformer blocks"):
        Booster(plugin=FSDPPlugin("fp32", CPU)).boost(model, opt)
