"""``train.plugin=fsdp``: fully sharded data parallel (torch FSDP1) under the Colossal-AI Booster.

Why our own plugin: Colossal-AI 0.5.0's TorchFSDPPlugin needs an NVIDIA driver (and re-creates the
optimizer from ``model.parameters()``, dropping our no-decay / no-trust-ratio groups); FSDP2
(``fully_shard``) needs CUDA streams. FSDP1 runs on CPU with gloo and on CUDA with NCCL through
the same code, so this path is tested here and runs on GPUs.

Contract of `FSDPPlugin.configure`:

* one FSDP unit per timm transformer ``Block`` plus the root (patch embedding, tokens, final norm,
  head); a model without ``Block`` modules is refused (`UserError`).
* ``FULL_SHARD`` (parameters, gradients and optimizer states sharded over the ranks) and
  ``use_orig_params=True``: the optimizer keeps the model's own ``nn.Parameter`` objects (and so its
  parameter groups), each a view of this rank's piece of its unit's flat shard, possibly empty.
* precision (``train.precision``): ``bf16``/``fp16`` compute with ``param_dtype`` copies gathered for
  forward/backward while the sharded masters and LAMB states stay fp32; gradients are reduced in
  fp32; ``LayerNorm`` runs in fp32 (FSDP wraps each one separately without mixed precision and
  casts its input up and its output back), so does `vitlarge.model.Fp32Conv2d`. ``fp32``: no casts. Autocast is not used.
* every rank starts from rank 0's parameters and buffers: they are broadcast before wrapping, as
  DDP does at construction (a rank-dependent RNG draw before the build, or an ``init_from`` race,
  would otherwise give a mosaic of shards). FSDP's own ``sync_module_states=True`` does the same
  broadcast but refuses CPU tensors in torch 2.5.1 ("requires them to be on GPU"), so we call the
  helper both share (``torch.distributed.utils._sync_module_states``) on every device: one path.
* ``device_id`` is our device, CPU included: without it FSDP looks for an accelerator and refuses a
  CPU-only host ("FSDP needs a non-CPU accelerator device").
* the optimizer becomes `vitlarge.sharded_optim.ShardedLamb` when it is our ``Lamb``, so trust
  ratios use the norms of whole tensors, whatever the world size.
"""

from __future__ import annotations

from typing import Callable, Iterator

import torch
import torch.distributed as dist
from colossalai.booster.plugin.dp_plugin_base import DPPluginBase
from colossalai.interface import ModelWrapper, OptimizerWrapper
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.distributed.utils import _sync_module_states

from vitlarge.errors import UserError
from vitlarge.precision import DTYPES

BROADCAST_BUCKET_BYTES = 250 * 1024 * 1024  # DDP's and FSDP's bucket for the initial broadcast
FULL_SHAPES_ATTR = "vitlarge_full_shapes"
"""Attribute of the FSDP root holding the unsharded state dict's shapes (read without a collective)."""


def block_classes(model: nn.Module) -> set[type]:
    """The transformer block classes FSDP wraps one by one (timm's ``Block`` and its subclasses)."""
    from timm.models.vision_transformer import Block

    return {type(m) for m in model.modules() if isinstance(m, Block)}


def mixed_precision(precision: str) -> MixedPrecision | None:
    """FSDP's casts for ``precision``: compute dtype for parameters, fp32 reduction and buffers, fp32 LayerNorm."""
    from vitlarge.model import Fp32Conv2d

    if precision == "fp32":
        return None
    # Fp32Conv2d: the patch embedding that vitlarge.model keeps in fp32 on CPU under fp16 (slow backward).
    return MixedPrecision(param_dtype=DTYPES[precision], reduce_dtype=torch.float32, buffer_dtype=torch.float32,
                          _module_classes_to_ignore=(nn.LayerNorm, Fp32Conv2d))


def wrap(model: nn.Module, precision: str, device: torch.device) -> FSDP:
    """``model`` sharded as the module docstring says; identical on every rank (same seed) before."""
    blocks = block_classes(model)
    if not blocks:
        raise UserError(f"train.plugin=fsdp needs a model with transformer blocks to shard one by one; "
                        f"{type(model).__name__} has no timm Block: use train.plugin=ddp or a timm ViT")
    shapes = {k: list(v.shape) for k, v in model.state_dict().items()}
    if dist.get_world_size() > 1:
        _sync_module_states(model, dist.group.WORLD, BROADCAST_BUCKET_BYTES, src=0, params_and_buffers_to_ignore=())
    fsdp = FSDP(model, auto_wrap_policy=ModuleWrapPolicy(blocks), sharding_strategy=ShardingStrategy.FULL_SHARD,
                mixed_precision=mixed_precision(precision), use_orig_params=True,
                device_id=device, limit_all_gathers=True)
    setattr(fsdp, FULL_SHAPES_ATTR, shapes)
    return fsdp


class FSDPModel(ModelWrapper):
    """Booster wrapper; ``unwrap()`` is the FSDP root (its ``.module`` the timm model)."""


class FSDPPlugin(DPPluginBase):
    """A Colossal-AI Booster plugin over torch FSDP1 that runs on CPU (gloo) and CUDA (NCCL)."""

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
        return False  # vitlarge/checkpoint.py writes sharded runs itself (exact resume, atomic)

    def get_checkpoint_io(self):
        raise NotImplementedError("vitlarge/checkpoint.py saves fsdp runs")

    def enable_lora(self, *args, **kwargs):
        raise NotImplementedError("LoRA is not supported by vitlarge's fsdp plugin")

    def no_sync(self, model: nn.Module, optimizer: OptimizerWrapper) -> Iterator[None]:
        return model.unwrap().no_sync()

    def configure(self, model: nn.Module, optimizer=None, criterion: Callable | None = None, dataloader=None,
                  lr_scheduler=None):
        from vitlarge.optim import Lamb
        from vitlarge.sharded_optim import ShardedLamb

        model = model.to(self.device)
        fsdp = wrap(model, self.precision, self.device)
        if optimizer is not None:
            if type(optimizer) is Lamb:  # same groups and settings; step() reduces the norms over the ranks
                optimizer = ShardedLamb.like(optimizer)
            optimizer = OptimizerWrapper(optimizer)
        return FSDPModel(fsdp), optimizer, criterion, dataloader, lr_scheduler
