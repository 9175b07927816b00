"""Optimizers for large-batch ViT pretraining: parameter groups, a multi-tensor LAMB, and a builder.

Contract:
- ``param_groups`` puts biases, 1-D parameters (norm weights), position embeddings and the class /
  distillation / register tokens in a group with no weight decay *and* no LAMB trust ratio. The
  original Colossal-AI ViT example applied both to every tensor, which costs a lot of accuracy
  (small ViT: 67% vs 98.6%).
- ``param_groups(..., layer_decay)`` below 1 splits those two groups per layer as timm's
  ``param_groups_layer_decay`` does, each with an ``lr_scale`` the engine applies to the schedule's lr.
- ``Lamb`` does no gradient clipping: the engine clips the global norm after unscaling, before
  ``step()``. (timm's Lamb clips inside the optimizer via ``max_grad_norm``; ours has no such knob.)
- ``step()`` never reads a device value on the host, so it queues work on the GPU without waiting.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterable
from typing import NamedTuple

import torch
from torch import nn

from vitlarge.config.schema import OptimConfig
from vitlarge.errors import UserError

IMPLEMENTATIONS = ("chunked", "foreach", "compiled")
"""`Lamb`'s forms of one update (``optim.implementation`` resolved: `vitlarge.train.settings.lamb_implementation`)."""
SHARED_SETTINGS = ("betas", "eps", "bias_correction", "grad_averaging")
"""The group settings the ``compiled`` form needs equal in every group (they are constants of its graph)."""


class Moments(NamedTuple):
    """A group's `SHARED_SETTINGS`, as the direction functions take them: the moments' decay rates, the eps added to
    the second moment's root, and the two switches of the update's form. A tuple of constants, so the ``compiled``
    form's graph holds them as constants (one graph for a run's settings)."""

    beta1: float
    beta2: float
    eps: float
    bias_correction: bool
    grad_averaging: bool

    @classmethod
    def of(cls, group: dict) -> Moments:
        beta1, beta2 = group["betas"]
        return cls(beta1, beta2, group["eps"], group["bias_correction"], group["grad_averaging"])


# Parameters that are tokens or embeddings added to activations: decaying them towards zero or
# rescaling their step by a trust ratio hurts, like for biases.
NO_DECAY_NAMES = ("pos_embed", "cls_token", "dist_token", "reg_token")


def _excluded(name: str, param: nn.Parameter, model_no_decay: set[str]) -> bool:
    leaf = name.rsplit(".", 1)[-1]
    if param.ndim <= 1 or leaf == "bias" or leaf in NO_DECAY_NAMES:
        return True
    # timm's no_weight_decay() names parameters ("pos_embed") or modules ("pos_embed_module").
    return any(name == n or name.startswith(n + ".") for n in model_no_decay)


def layer_ids(model: nn.Module) -> dict[str, int]:
    """Each parameter's layer for layer-wise lr decay, exactly as timm's ``param_groups_layer_decay`` numbers
    them: from the model's ``group_matcher(coarse=False)`` where it has one (a timm ViT: patch embedding,
    cls token and position embedding 0, block i i + 1, the final norm with the last block, the head depth + 1), else
    timm's ``auto_group_layers`` (runs of 12 parameters, then the classifier)."""
    from timm.models import group_parameters  # lazy: keeps timm off a run's checks (init_from, workdir, --resume)
    from timm.optim import auto_group_layers  # lazy: as above

    matcher = getattr(model, "group_matcher", None)
    if matcher is not None:
        return group_parameters(model, matcher(coarse=False), reverse=True)
    return auto_group_layers(model)


def param_groups(model: nn.Module, weight_decay: float, layer_decay: float = 1.0) -> list[dict]:
    """Split ``model``'s trainable parameters into decayed and excluded groups.

    ``layer_decay == 1``: up to two dicts for ``torch.optim.Optimizer``, ``{"params", "weight_decay":
    weight_decay, "trust_ratio": True}`` and ``{"params", "weight_decay": 0.0, "trust_ratio": False}``.
    ``layer_decay < 1``: that split per layer (`layer_ids`), in timm's order (by first parameter), each
    group with an ``"lr_scale"`` of ``layer_decay ** (last layer - layer)``, which the engine multiplies
    into the schedule's lr every step (as timm's schedulers do). Empty groups are left out.
    ``model.no_weight_decay()`` (timm) adds names to the excluded group.
    """
    no_decay_fn: Callable[[], Iterable[str]] | None = getattr(model, "no_weight_decay", None)
    model_no_decay = set(no_decay_fn()) if callable(no_decay_fn) else set()
    layers = layer_ids(model) if layer_decay != 1.0 else {}
    last = max(layers.values(), default=0)
    groups: dict[tuple[int, bool], dict] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        decay = not _excluded(name, param, model_no_decay)
        layer = layers.get(name, last)  # timm: a parameter no matcher names belongs to the last layer
        key = (layer, decay) if layers else (0, not decay)  # without layer decay: decayed group first
        if key not in groups:
            groups[key] = {"params": [], "weight_decay": weight_decay if decay else 0.0, "trust_ratio": decay}
            if layers:
                groups[key]["lr_scale"] = layer_decay ** (last - layer)
        groups[key]["params"].append(param)
    return list(groups.values()) if layers else [groups[k] for k in sorted(groups)]


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al. 2019, arXiv:1904.00962, Algorithm 2) over lists of tensors.

    Per parameter tensor ``p`` with gradient ``g`` and step ``t``:
        m = beta1 * m + (1 - beta1) * g        (``grad_averaging=False``: beta1 * m + g)
        v = beta2 * v + (1 - beta2) * g * g
        u = m_hat / (sqrt(v_hat) + eps) + weight_decay * p, m_hat = m / (1 - beta1**t), same for v
        ratio = ||p|| / ||u||, or 1 where either norm is 0, clamped to ``max_trust_ratio`` if set
        p -= lr * ratio * u
    ``bias_correction=False`` uses m and v as they are (paper v3). A group with ``"trust_ratio":
    False`` uses ratio = 1 (plain Adam with L2-in-update decay). ``max_trust_ratio=None`` does not
    clamp, like timm's Lamb (``trust_clip=False``) and Colossal-AI's.

    Speed: ``implementation`` picks one of three forms of the same update (``optim.implementation``):

    * ``chunked``: tensors in chunks of at most ``chunk_numel`` elements, so the chunk stays in the CPU's cache
      between the ops of one step (the update direction goes to a reused scratch buffer, never a fresh
      allocation). The fastest on a CPU.
    * ``foreach``: every tensor of a group at once, so each op is one multi-tensor kernel over all of them
      (a few launches per op on a GPU, where ``chunked`` makes one per chunk). The update directions of the
      whole group are held until its trust ratios are known (4 bytes per parameter during the step). Bit for
      bit the same numbers as ``chunked``: the same elementwise kernels and per-tensor norms.
    * ``compiled``: the step as two ``torch.compile``d functions over all tensors (`_moments_and_squares`:
      moments, then the squared norms of each weight and direction; `_apply_update`: the direction recomputed
      and applied with its trust ratio), so Inductor fuses each pass into few kernels and no direction is stored:
      per element 16 bytes read and 8 written in the first pass, 12 read and 4 written in the second. Equal to
      the others within fp32 rounding (its own order of operations). Needs `SHARED_SETTINGS` the same in every
      group (`build_optimizer`'s groups have them so).

    With ``bias_correction`` and ``grad_averaging`` (the recipes' setting) the eager forms take the moments
    and Adam direction from torch's fused Adam kernel, one pass instead of six; ``fused=False`` forces the
    plain ``torch._foreach_*`` path.

    State per parameter: ``exp_avg``, ``exp_avg_sq`` (the parameter's dtype; give it fp32 master
    parameters) and ``step``, a float32 0-d tensor on the parameter's device counting the steps in
    which this parameter had a gradient. ``lr`` may be a float or a 0-d tensor. Gradients must have
    the parameter's dtype; parameters whose ``grad`` is None are skipped. No gradient clipping.
    """

    def __init__(
        self,
        params: Iterable,
        lr: float | torch.Tensor = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        *,
        bias_correction: bool = True,
        grad_averaging: bool = True,
        trust_ratio: bool = True,
        max_trust_ratio: float | None = None,
        fused: bool = True,
        chunk_numel: int = 2**22,
        implementation: str = "chunked",
    ):
        if not 0.0 <= float(lr):
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon: {eps}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"Invalid betas: {betas}, each must be in [0, 1)")
        if max_trust_ratio is not None and max_trust_ratio <= 0:
            raise ValueError(f"Invalid max_trust_ratio: {max_trust_ratio}, must be > 0 or None")
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(f"Invalid implementation: {implementation!r}, one of {', '.join(IMPLEMENTATIONS)}")
        defaults = dict(
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            bias_correction=bias_correction,
            grad_averaging=grad_averaging,
            trust_ratio=trust_ratio,
            max_trust_ratio=max_trust_ratio,
        )
        super().__init__(params, defaults)
        self.fused = fused
        self.chunk_numel = chunk_numel
        self.implementation = implementation
        self._scratch: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    # torch's Optimizer.step is overloaded (None without a closure, a float with one); this is its implementation's
    # signature, as torch's own optimizers have.
    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # pyright: ignore[reportIncompatibleMethodOverride]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.implementation == "compiled":
            self._step_compiled()
        elif self.implementation == "foreach":
            self._step_held()
        else:
            for group in self.param_groups:
                for (device, dtype), items in self._with_grads(group).items():
                    for chunk in self._chunks(items):
                        self._update_chunk(group, chunk, self._scratch_for(device, dtype, chunk))
        return loss

    def _step_held(self) -> None:
        """Every direction computed (per group, whole or in chunks), then every trust ratio, then every update:
        the ``foreach`` form, and `vitlarge.optim.sharded_lamb.ShardedLamb`'s, whose ratios need a collective."""
        held = []  # (group, chunk, updates)
        for group in self.param_groups:
            for items in self._with_grads(group).values():
                chunks = self._chunks(items) if self.implementation == "chunked" else [items]
                held += [(group, chunk, self._direction(group, chunk)) for chunk in chunks]
        for (group, chunk, updates), ratio in zip(held, self._held_ratios(held), strict=True):
            self._apply(group, [it[0] for it in chunk], updates, ratio)

    def _held_ratios(self, held: list[tuple[dict, list, list]]) -> list[torch.Tensor | None]:
        """The trust ratio of each held chunk's tensors (None where its group has none)."""
        return [
            trust_ratio(
                torch.stack(torch._foreach_norm([it[0] for it in chunk])),
                torch.stack(torch._foreach_norm(updates)),
                group["max_trust_ratio"],
            )
            if group["trust_ratio"]
            else None
            for group, chunk, updates in held
        ]

    def _step_compiled(self) -> None:
        """The ``compiled`` form: per device and dtype, one call of each compiled pass over every group's tensors."""
        hyper = {k: self.param_groups[0][k] for k in SHARED_SETTINGS}
        for group in self.param_groups[1:]:
            if any(group[k] != v for k, v in hyper.items()):
                raise ValueError(
                    f"implementation='compiled' needs {', '.join(SHARED_SETTINGS)} equal in every parameter group"
                )
        kinds: dict[tuple[torch.device, torch.dtype], list] = {}
        for group in self.param_groups:
            for kind, items in self._with_grads(group).items():
                kinds.setdefault(kind, []).append((group, items))
        for (device, _), parts in kinds.items():
            items = [it for _, its in parts for it in its]
            p, g, m, v, s = (list(x) for x in zip(*[it[:5] for it in items]))
            wds = tuple(float(group["weight_decay"]) for group, its in parts for _ in its)
            passes = compiled_passes()
            moments = Moments.of(self.param_groups[0])
            squares = passes.moments_and_squares(p, g, m, v, s, wds, moments)
            norms = self._reduce_squares(squares).sqrt()
            scale, start = [], 0
            for group, its in parts:
                part = norms[:, start : start + len(its)]
                ratio = (
                    trust_ratio(part[0], part[1], group["max_trust_ratio"])
                    if group["trust_ratio"]
                    else torch.ones(len(its), device=device, dtype=norms.dtype)
                )
                lr = group["lr"]
                scale.append(ratio * (-lr.to(device) if isinstance(lr, torch.Tensor) else -lr))
                start += len(its)
            passes.apply(p, m, v, s, wds, torch.cat(scale).to(p[0].dtype), moments)

    def _reduce_squares(self, squares: torch.Tensor) -> torch.Tensor:
        """The ``(2, T)`` squared norms of whole tensors from this process's (all of them here; ShardedLamb's
        pieces are summed over the ranks)."""
        return squares

    def _with_grads(self, group: dict) -> dict[tuple[torch.device, torch.dtype], list]:
        """``(p, grad, exp_avg, exp_avg_sq, step)`` of the group's parameters that have a gradient, by
        device and dtype, states created where missing and step counters already advanced."""
        by_kind: dict[tuple[torch.device, torch.dtype], list] = {}
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError("Lamb does not support sparse gradients")
            state = self.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            elif state["step"].device != p.device:  # checkpoint loaded with map_location="cpu"
                state["step"] = state["step"].to(p.device)
            by_kind.setdefault((p.device, p.dtype), []).append(
                (p, p.grad, state["exp_avg"], state["exp_avg_sq"], state["step"])
            )
        for items in by_kind.values():
            torch._foreach_add_([it[4] for it in items], 1.0)
        return by_kind

    def _chunks(self, items: list) -> Iterable[list]:
        chunk, numel = [], 0
        for it in items:
            if chunk and numel + it[0].numel() > self.chunk_numel:
                yield chunk
                chunk, numel = [], 0
            chunk.append(it)
            numel += it[0].numel()
        if chunk:
            yield chunk

    def _scratch_for(self, device: torch.device, dtype: torch.dtype, chunk: list) -> list[torch.Tensor]:
        """Views shaped like the chunk's params into a buffer reused across chunks and steps."""
        numel = sum(it[0].numel() for it in chunk)
        if numel > self.chunk_numel:  # one tensor larger than a chunk: a one-off buffer
            buf = torch.empty(numel, device=device, dtype=dtype)
        else:
            buf = self._scratch.get((device, dtype))
            if buf is None:
                buf = self._scratch[(device, dtype)] = torch.empty(self.chunk_numel, device=device, dtype=dtype)
        views, offset = [], 0
        for it in chunk:
            views.append(buf[offset : offset + it[0].numel()].view_as(it[0]))
            offset += it[0].numel()
        return views

    def _update_chunk(self, group: dict, chunk: list, updates: list[torch.Tensor]) -> None:
        self._direction(group, chunk, updates)
        params = [it[0] for it in chunk]
        ratio = None
        if group["trust_ratio"]:
            # Two reductions for all norms of the chunk; the ratios stay on the device.
            ratio = trust_ratio(
                torch.stack(torch._foreach_norm(params)),
                torch.stack(torch._foreach_norm(updates)),
                group["max_trust_ratio"],
            )
        self._apply(group, params, updates, ratio)

    def _direction(self, group: dict, chunk: list, updates: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
        """Advances the chunk's moments and returns its update directions ``u``: written into ``updates`` (views
        of a scratch buffer), or into new tensors where None."""
        params, grads, exp_avgs, exp_avg_sqs, steps = (list(x) for x in zip(*[it[:5] for it in chunk]))
        beta1, beta2 = group["betas"]
        fused = self.fused and group["bias_correction"] and group["grad_averaging"]
        if updates is not None:
            out = updates
            if fused:  # the fused kernel starts from weight_decay * p (_direction_fused), the other path from 0
                for p, u in zip(params, out):
                    torch.mul(p, group["weight_decay"], out=u)
        elif fused:
            out = list(torch._foreach_mul(params, group["weight_decay"]))
        else:
            out = [torch.empty_like(p) for p in params]
        if fused:
            _direction_fused(
                grads,
                exp_avgs,
                exp_avg_sqs,
                steps,
                out,
                beta1=beta1,
                beta2=beta2,
                eps=group["eps"],
            )
        else:
            _direction_foreach(
                params, grads, exp_avgs, exp_avg_sqs, steps, out, Moments.of(group), group["weight_decay"]
            )
        return out

    @staticmethod
    def _apply(group: dict, params: list, updates: list, ratio: torch.Tensor | None) -> None:
        """``p -= lr * ratio * u`` (ratio 1 where None)."""
        neg_lr = -group["lr"]
        if ratio is not None:
            torch._foreach_addcmul_(params, updates, list((ratio * neg_lr).unbind()))
        elif isinstance(neg_lr, torch.Tensor):
            torch._foreach_addcmul_(params, updates, [neg_lr.to(params[0].device)] * len(params))
        else:
            torch._foreach_add_(params, updates, alpha=neg_lr)


def trust_ratio(w_norm: torch.Tensor, u_norm: torch.Tensor, max_trust_ratio: float | None) -> torch.Tensor:
    """``||w|| / ||u||`` per tensor, 1 where either norm is 0, clamped to ``max_trust_ratio`` if set."""
    ratio = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, 1.0)
    return ratio if max_trust_ratio is None else ratio.clamp(max=max_trust_ratio)


def _direction_fused(
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    steps: list[torch.Tensor],
    updates: list[torch.Tensor],
    *,
    beta1: float,
    beta2: float,
    eps: float,
) -> None:
    """Moments in place; ``updates``, holding ``weight_decay * params``, become ``m_hat / (sqrt(v_hat) + eps) +
    weight_decay * params``.

    torch's fused Adam kernel does ``x -= lr * m_hat / (sqrt(v_hat) + eps)`` after updating the
    moments, reading the bias corrections from the per-tensor ``steps``. Run on ``x = wd * p``
    with ``lr = -1`` it leaves exactly the LAMB update in ``x``, and ``p`` untouched.
    """
    torch._fused_adamw_(
        updates,
        grads,
        exp_avgs,
        exp_avg_sqs,
        [],
        steps,
        lr=-1.0,
        beta1=beta1,
        beta2=beta2,
        weight_decay=0.0,
        eps=eps,
        amsgrad=False,
        maximize=False,
    )


def _direction_foreach(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    steps: list[torch.Tensor],
    updates: list[torch.Tensor],
    moments: Moments,
    weight_decay: float,
) -> None:
    """Same contract as ``_direction_fused``, any ``bias_correction`` / ``grad_averaging``."""
    beta1, beta2, eps, bias_correction, grad_averaging = moments
    if grad_averaging:
        torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    else:
        torch._foreach_mul_(exp_avgs, beta1)
        torch._foreach_add_(exp_avgs, grads)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
    for v, u in zip(exp_avg_sqs, updates):
        torch.sqrt(v, out=u)
    bc1: tuple[torch.Tensor, ...] = ()
    if bias_correction:
        # Per-tensor corrections from the device step counters, in float64 as the fused kernel
        # does: in float32, 1 - 0.999**t loses ~5 digits at small t.
        t = torch.stack(steps).double()
        bc1 = (1 - beta1**t).to(updates[0].dtype).unbind()
        bc2_sqrt = (1 - beta2**t).sqrt().to(updates[0].dtype).unbind()
        torch._foreach_div_(updates, bc2_sqrt)
    torch._foreach_add_(updates, eps)
    for m, u in zip(exp_avgs, updates):
        torch.div(m, u, out=u)
    if bias_correction:
        torch._foreach_div_(updates, bc1)
    if weight_decay != 0:
        torch._foreach_add_(updates, params, alpha=weight_decay)


def _directions(
    params: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    steps: list[torch.Tensor],
    wds: tuple[float, ...],
    moments: Moments,
) -> list[torch.Tensor]:
    """``m_hat / (sqrt(v_hat) + eps) + wd * p`` per tensor (new tensors), the corrections from each tensor's step in
    float64 as the fused kernel takes them: what the ``compiled`` form's passes trace."""
    beta1, beta2, eps, bias_correction, _ = moments
    denom = list(torch._foreach_sqrt(exp_avg_sqs))
    t = torch.stack(steps).double()
    if bias_correction:
        torch._foreach_div_(denom, list((1 - torch.pow(beta2, t)).sqrt().to(denom[0].dtype).unbind()))
    torch._foreach_add_(denom, eps)
    updates = list(torch._foreach_div(exp_avgs, denom))
    if bias_correction:
        torch._foreach_div_(updates, list((1 - torch.pow(beta1, t)).to(denom[0].dtype).unbind()))
    torch._foreach_add_(updates, torch._foreach_mul(params, list(wds)))
    return updates


def _moments_and_squares(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    steps: list[torch.Tensor],
    wds: tuple[float, ...],
    moments: Moments,
) -> torch.Tensor:
    """The ``compiled`` form's first pass: the moments in place, and the ``(2, T)`` float32 squared norms of each
    weight (row 0) and update direction (row 1); the directions themselves are not kept."""
    beta1, beta2 = moments.beta1, moments.beta2
    if moments.grad_averaging:
        torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    else:
        torch._foreach_mul_(exp_avgs, beta1)
        torch._foreach_add_(exp_avgs, grads)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
    updates = _directions(params, exp_avgs, exp_avg_sqs, steps, wds, moments)
    squares = [torch.stack(torch._foreach_norm(x)).float() ** 2 for x in (params, updates)]
    return torch.stack(squares)


def _apply_update(
    params: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    steps: list[torch.Tensor],
    wds: tuple[float, ...],
    scale: torch.Tensor,
    moments: Moments,
) -> None:
    """The ``compiled`` form's second pass: ``p += scale_i * u_i`` (``scale = -lr * trust ratio`` per tensor), the
    direction recomputed from the moments, the same function of them as in the first pass."""
    updates = _directions(params, exp_avgs, exp_avg_sqs, steps, wds, moments)
    torch._foreach_addcmul_(params, updates, list(scale.unbind()))


class CompiledPasses(NamedTuple):
    moments_and_squares: Callable[..., torch.Tensor]
    apply: Callable[..., None]


@functools.cache
def compiled_passes() -> CompiledPasses:
    """`_moments_and_squares` and `_apply_update` through ``torch.compile`` (``fullgraph``, static shapes), made once
    per process: each compiles at its first call, once per set of tensor shapes (a run has one)."""
    import_inductor()
    return CompiledPasses(
        torch.compile(_moments_and_squares, fullgraph=True, dynamic=False),
        torch.compile(_apply_update, fullgraph=True, dynamic=False),
    )


def import_inductor() -> None:
    """Imports torch.compile's Inductor, without the deprecation warning torch 2.10 raises while importing it
    (``torch.utils.mkldnn``'s classes use the deprecated ``torch.jit.script_method``: torch's own import, not a call
    of ours). For every compiled form: the model's (`vitlarge.train.assemble.compile_model`) and this step's."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="`torch.jit.script_method` is deprecated", category=DeprecationWarning
        )
        import torch._inductor.compile_fx  # noqa: F401  # lazy: keeps torch._inductor (2 s) off runs without train.compile


def build_optimizer(model: nn.Module, optim: OptimConfig, implementation: str = "chunked") -> torch.optim.Optimizer:
    """``optim.name``: ``"lamb"`` (ours) or ``"adamw"`` (torch, foreach) over ``param_groups(model,
    optim.weight_decay, optim.layer_decay)``, with the section's lr, betas, eps and (LAMB) bias correction.
    ``implementation``: LAMB's form as resolved for the device (`vitlarge.train.settings.lamb_implementation`;
    ``optim.implementation`` may say ``auto``).

    AdamW's decay is decoupled (``p *= 1 - lr * wd``) and applies only to the decayed group; the
    groups' ``trust_ratio`` key and ``implementation`` (LAMB's form: `Lamb`) are ignored by AdamW.
    """
    o = optim
    groups = param_groups(model, o.weight_decay, o.layer_decay)
    betas = (float(o.betas[0]), float(o.betas[1]))
    if o.name == "lamb":
        return Lamb(
            groups,
            lr=o.lr,
            betas=betas,
            eps=o.eps,
            weight_decay=o.weight_decay,
            bias_correction=o.bias_correction,
            implementation=implementation,
        )
    if o.name == "adamw":
        return torch.optim.AdamW(groups, lr=o.lr, betas=betas, eps=o.eps, weight_decay=o.weight_decay, foreach=True)
    raise UserError(f"optimizer name {o.name!r} is unknown; use 'lamb' or 'adamw'")
