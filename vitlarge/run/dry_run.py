"""``--dry-run``: the resolved config and what it will do, computed without data or a process group, for the
device it plans for (`vitlarge.train.settings.plan_settings`: its precision and fsdp's accumulation as a run there
resolves them)."""

from __future__ import annotations

import json

from vitlarge.config.schema import Config
from vitlarge.model.vit import describe_model, memory_estimate
from vitlarge.plan.plan import Plan, phase_config
from vitlarge.text import plural
from vitlarge.train.settings import Settings, plan_settings


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _no_sync(cfg: Config, settings: Settings, accum_steps: int) -> bool:
    """Whether fsdp keeps whole gradients between micro-steps (``train.fsdp_accumulation`` resolved, `Settings`)."""
    return cfg.train.plugin == "fsdp" and accum_steps > 1 and not settings.fsdp_reduce_every_micro_step


def plan_device(cfg: Config, requested: str | None) -> tuple[str, str]:
    """The device ``--dry-run`` plans for, and what chose it: ``--device``, else the recipe's ``train.device``,
    where ``auto`` plans for CUDA (the GPUs a launch takes; a CPU machine plans a GPU run)."""
    if requested:
        return requested, "--device"
    if cfg.train.device == "auto":
        return "cuda", "train.device=auto: the GPUs a launch takes; --device cpu plans for the CPU"
    return cfg.train.device, f"train.device={cfg.train.device}"


def device_line(settings: Settings, chosen_by: str) -> str:
    """The plan's line naming the device it is for and the precision a run there trains in."""
    why = f" ({settings.precision_why})" if settings.precision_why else ""
    return f"  device {settings.device.type} ({chosen_by}), precision {settings.precision}{why}"


OPTIMIZER_NAMES = {"lamb": "LAMB", "adamw": "AdamW"}

# What a GPU holds beyond the tensors `memory_estimate` counts (and beyond the trainer's `mem` column, which
# reads PyTorch's allocator): stated constants, each with where it comes from. Not measured by the plan.
CUDA_CONTEXT_BYTES = 2**30
"""The CUDA context, the kernels of cuBLAS, cuDNN, NCCL and Inductor loaded into it, and library workspaces
outside PyTorch's allocator. Measured on an NVIDIA H200 (torch 2.11.0+cu130, total minus free memory minus
PyTorch's reserved): 527 MiB at the first CUDA call, 767 MiB once a matmul, attention, a convolution and a
LayerNorm had run forward and backward (703 MiB with ``CUBLAS_WORKSPACE_CONFIG=:4096:8``, as
``train.deterministic`` sets it); kernels load lazily (CUDA_MODULE_LOADING=LAZY, PyTorch's default) and add to it
as a run uses them: 1 GiB leaves room for them."""
NCCL_BUFFSIZE = 4 * 2**20
"""NCCL's buffer per peer, channel and protocol (``NCCL_BUFFSIZE``, default 4 MiB: NCCL user guide,
environment variables)."""
NCCL_BYTES = 558 * 2**20
"""One NCCL communicator (the run's process group, made at its first collective: DDP's all-reduce on CUDA, at any
world size). Measured: 558 MiB outside PyTorch's allocator after one all-reduce at world size 1 on an NVIDIA H200
(torch 2.11.0+cu130's NCCL). With more ranks it holds buffers per ring peer, channel and protocol (2 peers x up
to 32 channels x 2 protocol sets x ``NCCL_BUFFSIZE`` 4 MiB = 512 MiB by the NCCL user guide's defaults), and
NVLink SHARP (NVSwitch systems) adds its own (``NCCL_NVLS_ENABLE=0`` leaves them out): not measured here.
`NCCL_PEER_BYTES` is that estimate, added at world size > 1."""
NCCL_PEER_BYTES = 2 * 32 * 2 * NCCL_BUFFSIZE
"""NCCL's buffers for ring peers at world size > 1 (see `NCCL_BYTES`): an estimate, likely low (LL128 and tree
channels add buffers; NVLink SHARP on NVSwitch systems 1-2 GiB more)."""
DALI_QUEUE_DEPTH = 2
"""Batches DALI keeps ready on the GPU (``prefetch_queue_depth``, `vitlarge.data.loader`'s default)."""
IMAGENET_DECODED_BYTES = 469 * 387 * 3
"""One ImageNet JPEG decoded at full size by the ``mixed`` (nvJPEG) decoder: its mean resolution, 469x387 px."""


def gpu_overheads(cfg: Config, plan: Plan) -> list[tuple[str, float, str]]:
    """``(what, bytes, where the number comes from)`` per GPU beyond `memory_estimate`'s total."""
    out: list[tuple[str, float, str]] = [
        (
            "CUDA context and kernels",
            CUDA_CONTEXT_BYTES,
            "527 MiB measured at the first CUDA call on an H200, 767 MiB once the kernels a ViT uses loaded",
        )
    ]
    if plan.world_size == 1:
        out.append(("NCCL buffers", NCCL_BYTES, "558 MiB measured after one all-reduce at world size 1 on an H200"))
    else:
        out.append(
            (
                "NCCL buffers",
                NCCL_BYTES + NCCL_PEER_BYTES,
                "558 MiB measured at world size 1 on an H200 + 512 MiB for peers (2 ring peers x 32 channels x "
                "2 protocols x NCCL_BUFFSIZE 4 MiB; not measured)",
            )
        )
    if cfg.data.source == "tfrecord":

        def dali(ph) -> int:  # the crop (uint8) and the output (fp32) beside each decoded image
            return DALI_QUEUE_DEPTH * ph.micro_batch * (IMAGENET_DECODED_BYTES + 3 * ph.image_size**2 * (1 + 4))

        ph = max(plan.phases, key=dali)  # the pool keeps the largest phase's peak
        out.append(
            (
                "DALI pool",
                dali(ph),
                f"{DALI_QUEUE_DEPTH} batches ready x {ph.micro_batch} images x (a decoded 469x387 px JPEG + its "
                f"{ph.image_size} px crop and fp32 output); DALI keeps its pool's peak",
            )
        )
    return out


def print_gpu_overheads(cfg: Config, plan: Plan, settings: Settings, estimate: float) -> None:
    """The lines that add `gpu_overheads` to ``estimate`` (bytes per device) and say they are constants; none
    for a plan on the CPU (``train.device=cpu``, ``--device cpu``)."""
    if settings.device.type == "cpu":
        return
    extra = gpu_overheads(cfg, plan)
    parts = ", ".join(f"{what} {_gib(n)}" for what, n, _ in extra)
    print(
        f"  on a GPU add (stated constants, vitlarge/run/dry_run.py; not in the memory above): {parts}; "
        f"about {_gib(estimate + sum(n for _, n, _ in extra))} per GPU"
    )
    for what, _, source in extra:
        print(f"    {what}: {source}")


def print_plan(
    cfg: Config, plan: Plan, show_config: bool = False, device: str | None = None, init_from: list[str] | None = None
) -> None:
    """The plan for ``plan.world_size`` processes (``--world-size`` may name more than are running) on the
    device `plan_device` picks (``device``: ``--device``), with the settings a run there resolves
    (`vitlarge.train.settings.plan_settings`); ``show_config``: the resolved config first, as JSON
    (``--show-config``); ``init_from``: what ``model.init_from`` will do (`vitlarge.run.job.init_from_notes`), a
    line under the model's."""
    device, chosen_by = plan_device(cfg, device)
    settings = plan_settings(cfg, device)
    if show_config:
        print("resolved config:")
        print(json.dumps(cfg.to_dict(), indent=2))
    info = describe_model(cfg)
    first = plan.phases[0]
    mem = memory_estimate(
        info,
        first.micro_batch,
        settings.precision,
        cfg.train.activation_checkpointing,
        cfg.train.plugin == "fsdp",
        plan.world_size,
        _no_sync(cfg, settings, first.accum_steps),
        ema=cfg.train.ema_decay > 0,
    )
    train_flops = 3 * info["fwd_flops"]  # backward costs about twice the forward
    print("plan:")
    print(f"  {plan.describe()}")
    print(device_line(settings, chosen_by))
    where = "made on the device, no files" if cfg.data.source == "synthetic" else cfg.data.path
    print(f"  data {cfg.data.source} ({where}), {cfg.data.image_size} px, {cfg.data.num_classes} classes")
    print(
        f"  model {cfg.model.name}: {info['params'] / 1e6:.2f}M parameters, "
        f"{info['fwd_flops'] / 1e9:.2f} GFLOPs/image forward, {train_flops / 1e9:.2f} GFLOPs/image train step"
    )
    if init_from:
        print(f"  model.init_from {cfg.model.init_from}: {'; '.join(init_from)}")
    if cfg.train.phases:  # FLOPs and memory differ per phase: the table below
        print(f"  epochs {cfg.train.epochs} over {plan.num_train_examples} images in {len(plan.phases)} phases")
    else:
        print(
            f"  epochs {cfg.train.epochs} over {plan.num_train_examples} images; "
            f"total {train_flops * first.global_batch * plan.total_steps:.3g} FLOPs"
        )
        print(
            f"  memory per device (rough, train.plugin={cfg.train.plugin}, {plural(plan.world_size, 'device')}): "
            f"weights {_gib(mem['weights'])}, grads {_gib(mem['grads'])}, {OPTIMIZER_NAMES[cfg.optim.name]} states {_gib(mem['optimizer'])}, "
            + (f"EMA {_gib(mem['ema'])}, " if mem["ema"] else "")
            + f"activations {_gib(mem['activations'])}, total {_gib(mem['total'])}"
        )
        print_gpu_overheads(cfg, plan, settings, mem["total"])
    every = cfg.train.checkpoint_every_steps
    evals = eval_schedule(plan)
    print(
        f"  eval {evals}, checkpoint "
        f"{'every ' + plural(every, 'step') if every else 'at the end only'} into {cfg.workdir}/checkpoints"
    )
    if cfg.train.phases:
        print_phases(cfg, plan, settings)


def eval_schedule(plan: Plan) -> str:
    """When the run evaluates, and where it validates rectangular batches (``rect_val``) which phases do."""
    evals = f"every {plural(plan.eval_every_steps, 'step')}" if plan.eval_every_steps else "at the end only"
    rect = [ph.index for ph in plan.phases if ph.rect_val]
    if rect:  # which phases: the rest validate square crops
        where = (
            ""
            if len(rect) == len(plan.phases)
            else f" in phase{'s' if len(rect) > 1 else ''} {', '.join(map(str, rect))}"
        )
        evals += f" (rectangular{where}: batches of the aspect-sorted validation split at their own aspect ratio)"
    return evals


def print_phases(cfg: Config, plan: Plan, settings: Settings) -> None:
    """The phase table: epochs, size, batch = micro x accum x devices, steps, lr range, FLOPs and memory."""
    print("phases:")
    print(
        f"  {'#':>2} {'epochs':>15} {'size':>5} {'eval':>5} {'batch = micro x accum x dev':>28} {'steps':>7} "
        f"{'lr range':>19} {'GFLOPs/img':>10} {'total FLOPs':>11} {'memory':>9}"
    )
    total, fixed, largest = 0.0, 0.0, 0.0
    full = describe_model(cfg)["fwd_flops"] * 3
    for ph in plan.phases:
        info = describe_model(phase_config(cfg, ph))
        mem = memory_estimate(
            info,
            ph.micro_batch,
            settings.precision,
            cfg.train.activation_checkpointing,
            cfg.train.plugin == "fsdp",
            plan.world_size,
            _no_sync(cfg, settings, ph.accum_steps),
            ema=cfg.train.ema_decay > 0,
        )
        largest = max(largest, mem["total"])
        flops = 3 * info["fwd_flops"] * ph.global_batch * ph.steps
        total += flops
        fixed += full * ph.global_batch * ph.steps
        lrs = [plan.lr_at(cfg, s) for s in range(ph.start_step, ph.end_step)] or [0.0]
        batch = f"{ph.global_batch} = {ph.micro_batch} x {ph.accum_steps} x {plan.world_size}"
        print(
            f"  {ph.index:>2} {ph.start_epoch:>7g}-{ph.end_epoch:<7g} {ph.image_size:>5} {ph.eval_size:>5} "
            f"{batch:>28} {ph.steps:>7} {min(lrs):>9.3g}-{max(lrs):<9.3g} {3 * info['fwd_flops'] / 1e9:>10.3g} "
            f"{flops:>11.3g} {_gib(mem['total']):>9}"
        )
    print(
        f"  total {total:.3g} FLOPs = {total / fixed:.1%} of the same images at {cfg.data.image_size} px "
        f"({fixed:.3g} FLOPs)"
    )
    print_gpu_overheads(cfg, plan, settings, largest)
