"""The optimizer step alone, for the GPU kit: vitlarge's LAMB vs timm's Lamb vs Colossal-AI's Lamb.

Each optimizer owns a copy of ViT-B/16's fp32 parameters (the recipe's no-decay groups from
`vitlarge.optim.lamb.param_groups`) with the same random gradients; steps are timed interleaved, one
optimizer after the other (`benchmarks.harness.timing.interleaved`), medians reported. Launches per
step come from ``torch.profiler`` over a few steps (`count_events`): on CUDA the GPU kernels it
records (copies and memsets left out), the host's kernel-launch API calls, and the host's waits on
the device (``syncs_per_step``: a ``.item()`` or ``float(tensor)`` in the step, each a device-to-host
copy and a stream synchronize); on the CPU there are no kernels, so it counts ``aten::`` operator
calls (nested calls included), says so in ``launch_kind`` and gives None for the CUDA-only counts.
Colossal-AI's Lamb is left out, with the reason recorded, where Colossal-AI does not import.
"""

from __future__ import annotations

import collections
import copy
import importlib
import re
import sys

import torch

from benchmarks.gpu import device as dev
from benchmarks.harness import timing

LAUNCH_API = re.compile(r"Launch\w*Kernel")  # the launch call's name varies with CUDA and CUPTI versions
MARK = "vitlarge_kit_optimizer_steps"  # the profiled steps' range (torch.profiler.record_function)


def factories(cfg) -> tuple[dict, dict]:
    """``({name: make(param_groups)}, {name: why it was left out})``, same hyper-parameters for all."""
    import timm.optim

    from vitlarge.optim.lamb import Lamb

    o = cfg.optim
    kw = dict(lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay)
    makers = {
        "vitlarge_lamb": lambda groups: Lamb(groups, bias_correction=True, **kw),
        # always_adapt=False: no trust ratio where weight decay is 0, like our no-decay group.
        "timm_lamb": lambda groups: timm.optim.Lamb(groups, max_grad_norm=None, **kw),
    }
    skipped = {}
    try:
        ColossalLamb = colossalai_lamb()
        makers["colossalai_lamb"] = lambda groups: ColossalLamb(groups, bias_correction=True, **kw)
    except Exception as e:  # ImportError, or a version check against the torch present
        skipped["colossalai_lamb"] = f"Colossal-AI does not import here: {type(e).__name__}: {str(e)[:160]}"
    return makers, skipped


def colossalai_lamb() -> type:
    """Colossal-AI's LAMB (``colossalai.nn.optimizer.lamb``: torch only) without running ``colossalai.nn``'s and
    ``colossalai.nn.optimizer``'s ``__init__``, which import GaLore's 8-bit optimizers (galore_torch, bitsandbytes)
    that the kit's wheels leave out (requirements/gpu-kit.txt). Where ``colossalai.nn.optimizer`` is imported already,
    its own class."""
    import colossalai  # noqa: F401  (its __init__: torch and the accelerator)

    from vitlarge.distributed.booster import package_without_init

    for package in ("colossalai.nn", "colossalai.nn.optimizer"):
        if package not in sys.modules:
            package_without_init(package)
    return importlib.import_module("colossalai.nn.optimizer.lamb").Lamb


def count_events(events: list[tuple[str, bool, float]], steps: int, window: tuple[float, float]) -> dict:
    """Per-step counts from profiler events ``(name, on_the_GPU, host start in us)`` of a CUDA run.

    ``window`` is the host interval of the profiled steps (the `MARK` range): host calls outside it,
    such as the profiler's own closing ``cudaDeviceSynchronize``, are not counted. Counts:

    - ``launches_per_step``: GPU kernels (copies, memsets and the `MARK` annotation left out);
    - ``launch_api_calls_per_step``: host calls whose name has ``Launch...Kernel`` in it, whatever
      the suffix (``cudaLaunchKernelExC_v11060``, ``_ptsz``, ``__cudaLaunchKernel``, ``cuLaunchKernelEx``);
    - ``syncs_per_step``: host waits on the device: ``*Synchronize`` calls and blocking ``cudaMemcpy``
      (a tensor's ``.item()`` is a ``cudaMemcpyAsync`` then a ``cudaStreamSynchronize``: one);
    - ``dtoh_copies_per_step``: device-to-host copies on the GPU (``Memcpy DtoH``);
    - ``api_calls``: every CUDA runtime/driver call in the window by name, per step (what was matched).

    No kernel recorded (CUPTI unavailable) means nothing was measured: the counts are None, not 0."""
    lo, hi = window
    host = [n for n, on_gpu, t in events if not on_gpu and lo <= t <= hi]
    gpu = [n for n, on_gpu, _ in events if on_gpu and n != MARK]
    kernels = sum(1 for n in gpu if not n.startswith(("Memcpy", "Memset", "[memory]")))
    api = collections.Counter(n for n in host if n.startswith(("cu", "__cu")))
    if kernels == 0:
        return {
            "launches_per_step": None,
            "launch_api_calls_per_step": None,
            "syncs_per_step": None,
            "dtoh_copies_per_step": None,
            "api_calls": dict(api),
            "launch_kind": "not measured: the profiler recorded no CUDA kernel (CUPTI unavailable?)",
        }
    return {
        "launches_per_step": kernels / steps,
        "launch_api_calls_per_step": sum(c for n, c in api.items() if LAUNCH_API.search(n)) / steps,
        "syncs_per_step": sum(c for n, c in api.items() if "Synchronize" in n or n == "cudaMemcpy") / steps,
        "dtoh_copies_per_step": sum(1 for n in gpu if n.startswith("Memcpy DtoH")) / steps,
        "api_calls": {n: c / steps for n, c in sorted(api.items())},
        "launch_kind": "CUDA kernels recorded by torch.profiler (copies and memsets left out)",
    }


def launches(opt, device: torch.device, steps: int) -> dict:
    """Kernel launches and host syncs (CUDA) or aten op calls (CPU) per ``opt.step()``, from the profiler."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    dev.synchronize(device)  # earlier work finishes outside the profile
    with profile(activities=acts) as prof:
        with record_function(MARK):
            for _ in range(steps):
                opt.step()
    events = prof.events()
    mark = next(e for e in events if e.name == MARK and e.device_type == DeviceType.CPU)
    window = (mark.time_range.start, mark.time_range.end)
    if device.type == "cuda":
        return count_events(
            [(e.name, e.device_type == DeviceType.CUDA, e.time_range.start) for e in events], steps, window
        )
    ops = sum(1 for e in events if e.name.startswith("aten::") and window[0] <= e.time_range.start <= window[1])
    return {
        "launches_per_step": ops / steps,
        "launch_api_calls_per_step": None,
        "syncs_per_step": None,
        "dtoh_copies_per_step": None,
        "api_calls": {},
        "launch_kind": "CPU: aten operator calls, nested included (no kernels without a GPU)",
    }


def run(cfg, device: torch.device, rounds: int, profile_steps: int) -> dict:
    from vitlarge.model.vit import build_model
    from vitlarge.optim.lamb import param_groups

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
    times = timing.interleaved(
        {n: (lambda o=o: timing.device_seconds(o.step, device)) for n, o in opts.items()}, rounds
    )
    out = {}
    for name, opt in opts.items():
        out[name] = {
            "ms_per_step": timing.summary([t * 1e3 for t in times[name]]),
            **launches(opt, device, profile_steps),
        }
    return {
        "num_params": sum(p.numel() for p in model.parameters()),
        "num_tensors": len(grads),
        "rounds": rounds,
        "results": out,
        "left_out": skipped,
    }
