"""The GPU kit's optimizer section (benchmarks/gpu/optim.py) takes Colossal-AI's LAMB from the kit's wheels alone
(requirements/gpu-kit.txt): without galore_torch and bitsandbytes, which ``colossalai.nn``'s ``__init__`` imports."""

from __future__ import annotations

import sys

import colossalai
import torch

from benchmarks.gpu import optim


def test_colossalai_lamb_loads_and_steps_without_galore_and_bitsandbytes(monkeypatch):
    for name in [n for n in sys.modules if n == "colossalai.nn" or n.startswith("colossalai.nn.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delattr(colossalai, "nn", raising=False)
    monkeypatch.setitem(sys.modules, "galore_torch", None)  # an import of it raises ImportError
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)

    colossal_lamb = optim.colossalai_lamb()

    assert colossal_lamb.__module__ == "colossalai.nn.optimizer.lamb"
    torch.manual_seed(0)
    start = torch.randn(4, 3)
    param = torch.nn.Parameter(start.clone())
    param.grad = torch.randn(4, 3)
    colossal_lamb([param], lr=0.1, weight_decay=0.05, bias_correction=True).step()
    assert torch.isfinite(param.data).all() and not torch.equal(param.data, start)
