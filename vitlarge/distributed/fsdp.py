"""``train.plugin=fsdp``: fully sharded data parallel (torch FSDP2, ``fully_shard``) under the Colossal-AI Booster.

Why our own plugin: Colossal-AI 0.5.0's TorchFSDPPlugin needs an NVIDIA driver and re-creates the
optimizer from ``model.parameters()``, dropping our no-decay / no-trust-ratio groups. FSDP2 runs on
CPU with gloo and on CUDA with NCCL through the same code (torch 2.10), so this path is tested here
and runs on GPUs.

Contract of `FSDPPlugin.configure`:

* ``fully_shard`` on every timm transformer ``Block``, then on the root (patch embedding, tokens,
  final norm, head): one parameter group per block, all-gathered before its forward (and again
  before its backward) and reduce-scattered after its backward. A model without ``Block`` modules
  is refused (`UserError`). FQNs and the model's class hierarchy are unchanged (FSDP2 only prepends
  ``FSDPModule`` to the class), so ``model.unwrap()`` is the timm model itself.
* every parameter becomes a ``DTensor`` sharded on dim 0 (``Shard(0)``) over a 1-D device mesh of
  all ranks; each rank's local piece is a contiguous run of rows (torch.chunk sizes: possibly empty,
  e.g. a ``(1, 65, 384)`` position embedding lives whole on rank 0). FSDP2 replaces the module's
  ``nn.Parameter`` objects, so the optimizer (built before wrapping) is pointed at the new ones by
  name; a `vitlarge.optim.lamb.Lamb` becomes `vitlarge.optim.sharded_lamb.ShardedLamb`, whose trust ratios use
  the norms of whole tensors, whatever the world size.
* precision (``train.precision``): ``bf16``/``fp16``: ``MixedPrecisionPolicy(param_dtype, reduce_dtype=
  float32)``: blocks compute with gathered half-precision copies, the sharded fp32 parameters are the
  masters, LAMB states fp32, gradients reduced (and, under ``set_requires_gradient_sync(False)``,
  accumulated) in fp32. No autocast. ``LayerNorm`` computes in fp32 (each becomes timm's
  ``LayerNormFp32``: input, weight and bias cast up inside its forward, output cast back to the
  input's dtype; same parameters and state dict), and so does the
  CPU-fp16 patch convolution `vitlarge.model.vit.Fp32Conv2d` (`_ShardedFp32Conv2d`). Why a forward
  wrapper rather than a ``fully_shard`` group per LayerNorm with an fp32 policy (what FSDP1's
  ``_module_classes_to_ignore`` amounted to): it costs no extra collective, where such groups add two
  all-gathers (forward, backward) and one reduce-scatter per LayerNorm per micro-step (2 x depth + 1
  = 65 LayerNorms on ViT-H/14, latency-bound at a few KB each; benchmarks/bench_fsdp_collectives.py
  counted 6 x depth + 3 all-gathers per micro-step with FSDP1's LayerNorm units, 2 x depth + 1 now). One group for all
  LayerNorms would still add collectives, and FSDP2's multi-module groups expect their modules to run
  forward together, which a per-block recompute under activation checkpointing does not. The price:
  the LayerNorm weight and bias enter the fp32 computation rounded to the compute dtype (as every
  Linear weight does), while the normalisation itself (mean, variance, scaling) is fp32. ``fp32``: no
  casts.
* every rank starts from rank 0's parameters and buffers: ``fully_shard`` keeps each rank's own rows
  of its own tensors (no broadcast), so a rank-dependent RNG draw before the build, or an
  ``init_from`` race, would give a mosaic of shards. We broadcast before sharding with the helper
  DDP uses at construction (``torch.distributed.utils._sync_module_states``), on CPU and CUDA: one path.
* gradient accumulation: `FSDPPlugin.no_sync` is ``set_requires_gradient_sync(False)`` on every
  FSDP module for the micro-steps that should not reduce (see `vitlarge.train.engine`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch
import torch.distributed as dist
from timm.layers import LayerNorm, LayerNormFp32
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.utils import _sync_module_states
from torch.optim.lr_scheduler import LRScheduler
from torch.utils.data import DataLoader

from vitlarge.distributed.booster import DPPluginBase, ModelWrapper, OptimizerWrapper
from vitlarge.errors import UserError
from vitlarge.model.blocks import transformer_blocks
from vitlarge.model.precision import DTYPES
from vitlarge.model.vit import Fp32Conv2d
from vitlarge.optim.lamb import Lamb
from vitlarge.optim.sharded_lamb import ShardedLamb

BROADCAST_BUCKET_BYTES = 250 * 1024 * 1024  # DDP's bucket for the initial broadcast


class _ShardedFp32Conv2d(Fp32Conv2d):
    """`Fp32Conv2d` whose weight arrives in the compute dtype (FSDP's gathered copy): cast up too."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.float()
        return self._conv_forward(input.float(), self.weight.float(), bias).to(input.dtype)


def mp_policy(precision: str) -> MixedPrecisionPolicy:
    """FSDP2's casts for ``precision``: compute-dtype parameters, fp32 gradient reduction; none for fp32."""
    if precision == "fp32":
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=DTYPES[precision], reduce_dtype=torch.float32)


def wrap(model: nn.Module, precision: str, device: torch.device) -> nn.Module:
    """``model`` sharded in place as the module docstring says (and returned); every rank must call it."""
    blocks = transformer_blocks(model)
    if not blocks:
        raise UserError(
            f"train.plugin=fsdp needs a model with transformer blocks to shard one by one; "
            f"{type(model).__name__} has no timm Block: use train.plugin=ddp or a timm ViT"
        )
    if dist.get_world_size() > 1:
        world = dist.group.WORLD
        assert world is not None  # the default group, which the run has made
        _sync_module_states(model, world, BROADCAST_BUCKET_BYTES, src=0, params_and_buffers_to_ignore=())
    if precision != "fp32":
        for m in model.modules():
            if type(m) in (nn.LayerNorm, LayerNorm):  # same parameters, state dict and maths; no fast-norm path
                m.__class__ = LayerNormFp32
            elif isinstance(m, nn.LayerNorm) and type(m) is not LayerNormFp32:
                raise UserError(
                    f"train.plugin=fsdp with train.precision={precision} computes LayerNorm in fp32 and "
                    f"knows torch's and timm's LayerNorm only, not {type(m).__name__}: use "
                    "train.precision=fp32 or train.plugin=ddp"
                )
            elif type(m) is Fp32Conv2d:
                m.__class__ = _ShardedFp32Conv2d
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = mp_policy(precision)
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def _repoint(optimizer: torch.optim.Optimizer, before: dict[int, str], model: nn.Module) -> None:
    """Points ``optimizer``'s groups at ``model``'s parameters of the same names (FSDP2 replaced them)."""
    if optimizer.state:
        raise RuntimeError("the optimizer must not have stepped before FSDP wraps the model")
    now = dict(model.named_parameters())
    for group in optimizer.param_groups:
        group["params"] = [now[before[id(p)]] for p in group["params"]]


class FSDPModel(ModelWrapper):
    """Booster wrapper; ``unwrap()`` is the timm model, sharded in place (an ``FSDPModule``)."""


class FSDPPlugin(DPPluginBase):
    """A Colossal-AI Booster plugin over torch FSDP2 that runs on CPU (gloo) and CUDA (NCCL)."""

    def __init__(self, precision: str, device: torch.device):
        super().__init__()
        self.precision, self.device = precision, torch.device(device)

    def supported_devices(self) -> list[str]:
        return ["cpu", "cuda"]

    def supported_precisions(self) -> list[str]:
        return ["fp32", "fp16", "bf16"]

    def control_precision(self) -> bool:
        return True

    def control_device(self) -> bool:
        return True

    def support_no_sync(self) -> bool:
        return True

    def support_lora(self) -> bool:
        return False

    def control_checkpoint_io(self) -> bool:
        return False  # vitlarge/checkpoint/store.py writes sharded runs itself (exact resume, atomic)

    def get_checkpoint_io(self):
        raise NotImplementedError("vitlarge/checkpoint/store.py saves fsdp runs")

    def enable_lora(self, *args: Any, **kwargs: Any) -> nn.Module:
        raise NotImplementedError("LoRA is not supported by vitlarge's fsdp plugin")

    # Colossal-AI's Plugin annotates no_sync as returning Iterator[None]; its callers (and its own plugins) use it as
    # the context manager it is.
    @contextlib.contextmanager
    def no_sync(self, model: nn.Module, optimizer: OptimizerWrapper) -> Iterator[None]:  # pyright: ignore[reportIncompatibleMethodOverride]
        """Backward passes inside keep (and add to) unsharded gradients instead of reduce-scattering
        them; FSDP2 accumulates them in ``reduce_dtype`` (fp32) when the compute dtype is lower."""
        root = cast(FSDPModule, cast(FSDPModel, model).unwrap())  # what configure returned
        root.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            root.set_requires_gradient_sync(True)

    # Colossal-AI's Plugin.configure declares every part returned as present; the ones not passed come back None,
    # as from its own plugins.
    def configure(  # pyright: ignore[reportIncompatibleMethodOverride]
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        criterion: Callable | None = None,
        dataloader: DataLoader | None = None,
        lr_scheduler: LRScheduler | None = None,
    ) -> tuple[FSDPModel, OptimizerWrapper | None, Callable | None, DataLoader | None, LRScheduler | None]:
        model = model.to(self.device)
        names = {id(p): n for n, p in model.named_parameters()}
        sharded = wrap(model, self.precision, self.device)
        assert isinstance(sharded, FSDPModule)
        wrapped = None
        if optimizer is not None:
            _repoint(optimizer, names, sharded)
            if type(optimizer) is Lamb:  # same groups and settings; step() reduces the norms over the ranks
                optimizer = ShardedLamb.like(optimizer)
            wrapped = OptimizerWrapper(optimizer)
        return FSDPModel(sharded), wrapped, criterion, dataloader, lr_scheduler
