"""The optimizer step alone, for the GPU kit: vitlarge's LAMB vs timm's Lamb vs Colossal-AI's Lamb.

Each optimizer owns a copy of ViT-B/16's fp32 parameters (the recipe's no-decay groups from
`vitlarge.optim.param_groups`) with the same random gradients; steps are timed interleaved, one
optimizer after the other (`benchmarks.gpu_device.interleaved`), medians reported. Launches per
step come from ``torch.profiler`` over a few steps: on CUDA the GPU kernels it records (copies and
memsets left out) and the host's kernel-launch API calls; on the CPU there are no kernels, so it
counts ``aten::`` operator calls (nested calls included) and says so in ``launch_kind``.
Colossal-AI's Lamb is left out, with the reason recorded, where Colossal-AI does not import.
"""

from __future__ import annotations

import copy

import torch

from benchmarks import common
from benchmarks import gpu_device as dev

LAUNCH_APIS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")


def factories(cfg) -> tuple[dict, dict]:
    """``({name: make(param_groups)}, {name: why it was left out})``, same hyper-parameters for all."""
    import timm.optim

    from vitlarge.optim import Lamb

    o = cfg.optim
    kw = dict(lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay)
    makers = {
        "vitlarge_lamb": lambda groups: Lamb(groups, bias_correction=True, **kw),
        # always_adapt=False: no trust ratio where weight decay is 0, like our no-decay group.
        "timm_lamb": lambda groups: timm.optim.Lamb(groups, max_grad_norm=None, **kw),
    }
    skipped = {}
    try:
        from colossalai.nn.optimizer import Lamb as ColossalLamb

        makers["colossalai_lamb"] = lambda groups: ColossalLamb(groups, bias_correction=True, **kw)
    except Exception as e:  # ImportError, or a version check against the torch present
        skipped["colossalai_lamb"] = f"Colossal-AI does not import here: {type(e).__name__}: {str(e)[:160]}"
    return makers, skipped


def launches(opt, device: torch.device, steps: int) -> dict:
    """Kernel launches (CUDA) or aten op calls (CPU) per ``opt.step()``, from the profiler."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(steps):
            opt.step()
        dev.synchronize(device)
    events = prof.events()
    if device.type == "cuda":
        kernels = sum(1 for e in events if e.device_type == DeviceType.CUDA
                      and not e.name.startswith(("Memcpy", "Memset", "[memory]")))
        api = sum(1 for e in events if e.name in LAUNCH_APIS)
        return {"launches_per_step": kernels / steps, "launch_api_calls_per_step": api / steps,
                "launch_kind": "CUDA kernels recorded by torch.profiler (copies and memsets left out)"}
    ops = sum(1 for e in events if e.name.startswith("aten::"))
    return {"launches_per_step": ops / steps, "launch_api_calls_per_step": None,
            "launch_kind": "CPU: aten operator calls, nested included (no kernels without a GPU)"}


def run(cfg, device: torch.device, rounds: int, profile_steps: int) -> dict:
    from vitlarge.model import build_model
    from vitlarge.optim import param_groups

    torch.manual_seed(0)
    model = build_model(cfg, device)
    grads = [torch.randn_like(p) * 1e-3 for p in model.parameters()]  # shared: no optimizer writes grads
    makers, skipped = factories(cfg)
    opts = {}
    for name, make in makers.items():
        m = copy.deepcopy(model)
        for p, g in zip(m.parameters(), grads):
            p.grad = g
        opts[name] = make(param_groups(m, cfg.optim.weight_decay))
        opts[name].step()  # warm-up: state allocation, kernel selection
    dev.synchronize(device)
    times = dev.interleaved({n: (lambda o=o: dev.time_call(o.step, device)) for n, o in opts.items()}, rounds)
    out = {}
    for name, opt in opts.items():
        out[name] = {"ms_per_step": common.summary([t * 1e3 for t in times[name]]),
                     **launches(opt, device, profile_steps)}
    return {"num_params": sum(p.numel() for p in model.parameters()), "num_tensors": len(grads),
            "rounds": rounds, "results": out, "left_out": skipped}
