"""``model.init_from=PATH``: start training from pretrained weights (fine-tuning), weights only.

PATH is one of: an export folder (`vitlarge.checkpoint.export`: ``config.json`` + ``model.safetensors``) or its
``model.safetensors``; a ``checkpoints/step_*`` folder (its weights, read on this process alone: DCP's
files, or a format-2 checkpoint's ``model.safetensors``); a timm checkpoint
file (``.safetensors``, or ``.pth``/``.pt``/``.bin`` holding a state dict, possibly under
``state_dict_ema`` (preferred, as timm's own fine-tuning does), ``state_dict`` or ``model``, with DDP's
``module.`` prefixes; the key used is logged). Loaded with ``weights_only=True``, with only
``argparse.Namespace`` (the ``args`` of timm/DeiT/MAE checkpoints) allowed, scoped to this load:
no other objects are unpickled.

Contract: every tensor of the recipe's model must be in the file with its shape, except

* ``pos_embed``: resampled to the recipe's token grid (timm ``resample_abs_pos_embed``, bicubic),
  prefix tokens (class token) kept as they are; the patch size must be the same;
* the classifier (``head.weight``/``head.bias``): when its class count differs it keeps its fresh
  initialisation, and the log says so;
* source tensors the model has no place for (register or distillation tokens) are dropped with a
  warning in the log; a ``global_pool`` mismatch (``fc_norm`` vs ``norm``) is one line naming it.

Anything else (a missing file, another architecture, a different patch size or width) is one
line naming the file and the fix (`check_source`, run by train.py before any data is touched).
``--dry-run`` says what the run will do to the head and the position embedding (`plan_notes`), from the source's
shapes alone where its format records them apart from its weights.
"""

from __future__ import annotations

import argparse
import logging
import os
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import cast

import torch
from safetensors.torch import load_file

from vitlarge import fileio
from vitlarge.checkpoint import weights as ckpt_weights
from vitlarge.checkpoint.trust import index as dcp_index
from vitlarge.checkpoint.trust import layout
from vitlarge.checkpoint.trust.meta import expected_files
from vitlarge.checkpoint.trust.torch_files import header_shapes
from vitlarge.config.schema import Config
from vitlarge.errors import UserError
from vitlarge.model.vit import build_model

log = logging.getLogger("vitlarge")
HEAD_KEYS = ("head.weight", "head.bias")
POS_EMBED = "pos_embed"
PATCH_WEIGHT = "patch_embed.proj.weight"


def _checkpoint_weights(path: str | Path) -> dict[str, torch.Tensor] | None:
    """The weights of PATH when it is a checkpoint folder (after its size check, as a resume does), else None."""
    p = Path(path)
    if not (p.is_dir() and (p / "meta.json").is_file()):
        return None

    try:
        return ckpt_weights.weights_of(p, layout.read_meta(p))
    except layout.Unusable as e:
        raise UserError(
            f"model.init_from={path}: {e.problem}; pass a complete checkpoint or an export folder"
        ) from None


def weights_file(path: str | Path) -> Path:
    """The weights file PATH names (export folder or a file); UserError if none."""
    p = Path(path)
    if p.is_dir():
        if (p / "model.safetensors").is_file():
            problem = fileio.regular_file_problem(p / "model.safetensors")  # an export's file stays in its folder
            if problem:
                raise UserError(f"model.init_from={path}: {problem}; pass an export folder that holds its own weights")
            return p / "model.safetensors"
        raise UserError(
            f"model.init_from={path}: the folder holds no model.safetensors; pass an export folder "
            "(<workdir>/model), a checkpoints/step_* folder or a timm checkpoint file"
        )
    if not p.is_file():  # a FIFO or device named here would block the read or never end
        raise UserError(
            f"model.init_from={path} {'is not a regular file' if p.exists() else 'does not exist'}; pass an export "
            "folder (<workdir>/model), a checkpoints/step_* folder or a timm checkpoint file"
        )
    return p


def _check_archive(f: Path, path: str | Path) -> bool:
    """A zip ``torch.save`` file is the archive torch.save writes (`vitlarge.checkpoint.trust.index.archive_problem`: entries stored, not
    compressed, and a pickle in proportion to its size) before ``torch.load`` inflates anything; else UserError.
    A file of torch's format before 1.6 (not a zip) is left to ``torch.load``. True for a zip archive."""
    with fileio.open_regular(f) as fh:
        if not zipfile.is_zipfile(fh):
            return False
        problem = dcp_index.archive_problem(fh, os.fstat(fh.fileno()).st_size)
    if problem:
        raise UserError(
            f"model.init_from={path}: {f} {problem}; pass a model.safetensors or a torch checkpoint of a timm model"
        )
    return True


def read_state_dict(path: str | Path, *, mapped: bool = False) -> tuple[dict[str, torch.Tensor], str | None]:
    """The state dict in PATH (see the module docstring), on the CPU, and the checkpoint key it came
    from (``state_dict_ema``, ``state_dict``, ``model``; None for a bare state dict). ``mapped``: a torch zip
    file's tensors are memory-mapped, not read (the dry run's shapes: a ViT-H's GBs never enter memory)."""
    sd = _checkpoint_weights(path)
    if sd is not None:
        if not all(isinstance(v, torch.Tensor) for v in sd.values()):
            raise UserError(f"model.init_from={path}: the checkpoint holds weights that are not tensors")
        return sd, None
    f = weights_file(path)
    key = None
    try:
        if f.suffix == ".safetensors":
            sd = load_file(str(f), device="cpu")
        else:
            is_zip = _check_archive(f, path)
            # timm, DeiT and MAE training checkpoints carry their argparse.Namespace 'args': allowed for
            # this load only (a plain attribute bag, no code runs); weights_only stays on, so any other
            # object in a foreign file is still refused.
            with torch.serialization.safe_globals([argparse.Namespace]):
                sd = torch.load(f, map_location="cpu", weights_only=True, mmap=mapped and is_zip)
            for k in ("state_dict_ema", "state_dict", "model"):  # timm train.py / DeiT / MAE checkpoints
                if isinstance(sd, dict) and isinstance(sd.get(k), dict):
                    sd, key = sd[k], k
                    break
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - torch.load and safetensors raise many types on foreign files
        raise UserError(
            f"model.init_from={path}: {f} is not a readable state dict ({type(e).__name__}); pass a "
            "model.safetensors or a torch checkpoint of a timm model"
        ) from None
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise UserError(f"model.init_from={path}: {f} holds no state dict of tensors; pass a timm model's weights")
    return {k.removeprefix("module."): v for k, v in sd.items()}, key


def _grid(model) -> tuple[int, int]:
    return tuple(model.patch_embed.grid_size)


def adapt(sd: dict[str, torch.Tensor], model: torch.nn.Module, source: str) -> tuple[dict, list[str]]:
    """The source state dict made to fit ``model``: pos-embed resampled, a head of another size dropped.

    Returns (state dict to load, notes for the log); UserError when the architecture differs."""
    from timm.layers import resample_abs_pos_embed  # lazy: keeps timm off the pre-flight check of a bad model.init_from

    # torch.fx.wrap, its decorator, is annotated as returning `str | Callable`: the function it was given
    resample = cast(Callable[..., torch.Tensor], resample_abs_pos_embed)

    target = model.state_dict()
    notes = []
    if PATCH_WEIGHT in target and PATCH_WEIGHT in sd and sd[PATCH_WEIGHT].shape != target[PATCH_WEIGHT].shape:
        got, want = tuple(sd[PATCH_WEIGHT].shape), tuple(target[PATCH_WEIGHT].shape)
        raise UserError(
            f"model.init_from={source}: its patch embedding is {got[2]}x{got[3]} px, {got[0]} wide; the "
            f"recipe's model is {want[2]}x{want[3]} px, {want[0]} wide; fine-tune from a model with the "
            "same patch size and width, or set model.name/model.kwargs to match it"
        )
    missing = [k for k in target if k not in sd]
    pool = {"fc_norm.weight": "avg (fc_norm)", "norm.weight": "token (norm)"}
    for k, theirs in (("fc_norm.weight", "norm.weight"), ("norm.weight", "fc_norm.weight")):
        if k in missing and theirs in sd and theirs not in target:
            raise UserError(
                f"model.init_from={source} was trained with global_pool={pool[theirs]}, the recipe's "
                f"model uses global_pool={pool[k]}; set model.kwargs global_pool to match the source"
            )
    if missing:
        raise UserError(
            f"model.init_from={source} is another architecture: it lacks '{missing[0]}' "
            f"({len(missing)} of the recipe's {len(target)} tensors missing); set model.name/model.kwargs "
            "to the architecture it was trained with"
        )
    out = {}
    for k, want in target.items():
        v = sd[k]
        if k == POS_EMBED and v.shape != want.shape:
            prefix = getattr(model, "num_prefix_tokens", 1) if not getattr(model, "no_embed_class", False) else 0
            old = int(round((v.shape[1] - prefix) ** 0.5))
            if old * old + prefix != v.shape[1] or v.shape[2] != want.shape[2]:
                raise UserError(
                    f"model.init_from={source}: pos_embed {tuple(v.shape)} cannot be resampled to "
                    f"{tuple(want.shape)}; fine-tune from the same architecture"
                )
            v = resample(v.float(), new_size=list(_grid(model)), old_size=[old, old], num_prefix_tokens=prefix)
            v = v.to(want.dtype)
            notes.append(
                f"position embedding resampled from a {old}x{old} to a {_grid(model)[0]}x{_grid(model)[1]} token grid"
            )
        elif k in HEAD_KEYS and v.shape != want.shape:
            if k == HEAD_KEYS[0]:
                notes.append(f"classifier re-initialised: {v.shape[0]} classes in the source, {want.shape[0]} here")
            continue
        elif v.shape != want.shape:
            raise UserError(
                f"model.init_from={source} is another architecture: '{k}' is {tuple(v.shape)}, the "
                f"recipe's model has {tuple(want.shape)}; set model.name/model.kwargs to match it"
            )
        out[k] = v
    extra = sorted(k for k in sd if k not in target)
    if extra:  # register/distillation tokens and the like: the recipe's model has no place for them
        notes.append(
            f"warning: {len(extra)} source tensor(s) not in the recipe's model, dropped: "
            f"{', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}"
        )
    return out, notes


def load_into(model: torch.nn.Module, cfg: Config) -> list[str]:
    """Loads ``cfg.model.init_from`` into the (unwrapped, unboosted) ``model``; returns the log notes."""
    sd, key = read_state_dict(cfg.model.init_from)
    sd, notes = adapt(sd, model, cfg.model.init_from)
    with torch.no_grad():
        target = model.state_dict()
        for k, v in sd.items():
            target[k].copy_(v.to(target[k].device, target[k].dtype))
    if (name := ckpt_weights.non_finite(model)) is not None:  # else nan losses, and the NaN guard blames the lr
        raise UserError(
            f"model.init_from={cfg.model.init_from}: {name} holds NaN or inf (the file was damaged, or its run "
            "diverged); pass another model's weights",
            same_on_all_ranks=True,
        )
    where = f" (its '{key}')" if key else ""
    return [f"initialised from {cfg.model.init_from}{where}"] + notes


def check_source(cfg: Config) -> None:
    """Fails (one line) when ``model.init_from`` cannot initialise the recipe's model; reads the file once
    but builds the model on the meta device, so it costs no memory for the model."""
    adapt(read_state_dict(cfg.model.init_from)[0], build_model(cfg, "meta"), cfg.model.init_from)


def source_shapes(path: str | Path) -> dict[str, torch.Tensor]:
    """The source's tensors as meta tensors of their shapes, read as the format allows: a safetensors header (an
    export, a format-2 checkpoint, a timm ``.safetensors``), a checkpoint's meta.json and DCP index (bounded reads,
    `vitlarge.checkpoint.trust`), and for a torch file, whose pickle holds the shapes beside the weights, the state
    dict as the run reads it (`read_state_dict`), its tensors memory-mapped. One line (`UserError`) where the run's read would fail."""
    p = Path(path)
    if p.is_dir() and (p / "meta.json").is_file():
        try:
            meta = layout.read_meta(p)
            if meta["format_version"] < 3:  # the run's own check of the file first (`weights_of`): no link, no FIFO
                problem = fileio.size_problem(p / "model.safetensors", expected_files(meta)["model.safetensors"])
                if problem:
                    raise layout.Unusable(p, problem)
                return header_shapes(p / "model.safetensors", f"model.init_from={path}", follow=False)
            index = dcp_index.read_index(p, meta["files"])
        except (layout.Unusable, dcp_index.IndexProblem) as e:
            problem = e.problem if isinstance(e, layout.Unusable) else str(e)
            raise UserError(
                f"model.init_from={path}: {problem}; pass a complete checkpoint or an export folder"
            ) from None
        return {
            k.removeprefix("model."): torch.empty(md.size, device="meta")
            for k, md in index.state_dict_metadata.items()
            if k.startswith("model.") and hasattr(md, "size")
        }
    f = weights_file(path)
    if f.suffix == ".safetensors":
        return header_shapes(f, f"model.init_from={path}")
    return {k: torch.empty(v.shape, device="meta") for k, v in read_state_dict(path, mapped=True)[0].items()}


def plan_notes(cfg: Config) -> list[str]:
    """What ``model.init_from`` will do to the recipe's model, for ``--dry-run``: the classifier re-initialised (the
    two class counts) or kept, the position embedding resampled (the two token grids) or kept, then any source
    tensor dropped. The same `adapt` the run applies, on shapes alone (`source_shapes`, a model on the meta
    device), so a source that does not fit is the run's one line here too."""
    model = build_model(cfg, "meta")
    _, notes = adapt(source_shapes(cfg.model.init_from), model, cfg.model.init_from)
    target = model.state_dict()
    head = next((n for n in notes if n.startswith("classifier")), None)
    if head is None and HEAD_KEYS[0] in target:
        head = f"classifier kept: {target[HEAD_KEYS[0]].shape[0]} classes, as in the source"
    grid = next((n for n in notes if n.startswith("position embedding")), None)
    if grid is None and POS_EMBED in target:
        grid = "position embedding kept: a {}x{} token grid, as in the source".format(*_grid(model))
    return [n for n in (head, grid) if n] + [n for n in notes if n not in (head, grid)]
