"""The trained model in timm's own format: a folder that ``timm.create_model`` loads in one line.

    model = timm.create_model("local-dir:runs/demo_digits/model", pretrained=True)
    cfg = timm.data.resolve_data_config(model=model)            # the preprocessing it was trained with
    transform = timm.data.create_transform(**cfg)

``<workdir>/model/`` holds ``model.safetensors`` (the unwrapped model's state dict) and
``config.json`` written by timm's own `save_config_for_hf` (`save_timm_config`: also with a timm older than
the pinned one, whose function lacks ``data_config``): architecture, the model arguments
timm recorded when it built the model (patch size, depth, ...), class count, class names from the
dataset manifest, and the evaluation preprocessing vitlarge used (input size, mean/std, crop
fraction, interpolation), so timm's transform matches vitlarge's validation pipeline. Which weights the folder
holds is written in both files: ``vitlarge_weights`` in config.json and ``weights`` in the safetensors
metadata, ``raw`` (the trained weights) or ``ema`` (their moving average, ``train.export_ema``; timm's
``pretrained_cfg.tag`` is then ``vitlarge_ema``). How the final top-1 was measured is config.json's
``vitlarge_validation``: ``square`` (timm's centre crop, as ``pretrained_cfg`` declares it) or ``rectangular``
(the last phase's ``rect_val``: each batch of the aspect-sorted validation split cropped to its mean aspect
ratio, the shorter side the declared input size, `vitlarge.data.rect`; timm's transform has no such crop).

The folder is written under a temporary name, fsynced and renamed: a reader sees the old export
or the new one, never half of one.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
from pathlib import Path
from typing import Any, cast

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file
from timm.models._hub import save_config_for_hf

from vitlarge import fileio
from vitlarge.checkpoint import sharded
from vitlarge.config.phase_list import final_eval_size, final_rect_val
from vitlarge.config.schema import Config
from vitlarge.data.common import VAL_INTERPOLATION
from vitlarge.distributed.plugins import unwrap
from vitlarge.errors import UserError
from vitlarge.model.vit import model_kwargs

EXPORT_DIR = "model"


def data_config(cfg: Config) -> dict:
    """vitlarge's evaluation preprocessing in timm's terms (see `vitlarge.data.pipelines.val_pipeline`).

    With ``train.phases`` the input size is the last phase's ``eval_size`` (where the final top-1 was
    measured, e.g. FixRes' 256 px after 224 px training), not ``data.image_size``."""
    size = final_eval_size(cfg)
    return dict(
        input_size=(3, size, size),
        mean=tuple(cfg.data.mean),
        std=tuple(cfg.data.std),
        crop_pct=cfg.data.val_crop_pct,
        crop_mode="center",
        interpolation=VAL_INTERPOLATION,
    )


def weights_to_export(model: torch.nn.Module, ema, rank: int) -> dict[str, torch.Tensor]:
    """The weights an export writes, whole on CPU on rank 0 (``{}`` elsewhere): the EMA average when ``ema`` is
    given, else the model's. A collective under fsdp (gathers to rank 0): every rank calls it."""
    return ema.full(rank) if ema is not None else sharded.model_tensors(model, rank)


def export(
    workdir: str | Path,
    model: torch.nn.Module,
    cfg: Config,
    class_names: list[str] | None = None,
    class_descriptions: dict[str, str] | None = None,
    tensors: dict[str, torch.Tensor] | None = None,
    ema: bool = False,
) -> Path:
    """Writes ``<workdir>/model/`` (config.json + model.safetensors) and returns its path. Main rank only.

    ``model`` may be wrapped (DDP, Booster): the timm module inside is exported. ``class_names`` are
    the classifier's labels in index order (ImageNet synsets); ``class_descriptions`` maps a name to
    its text ("tench, Tinca tinca"). ``tensors``: the full state dict when the caller gathered it
    (``sharded.model_tensors``, a collective under FSDP); else read from ``model`` here. ``ema``: ``tensors``
    are the model EMA's average (`vitlarge.model.ema.ModelEma.full`), as the files then say.
    """
    if ema and tensors is None:
        raise ValueError("export(ema=True) needs the EMA's tensors")
    weights = "ema" if ema else "raw"
    raw = unwrap(model)
    workdir = Path(workdir)
    out = workdir / EXPORT_DIR
    tmp = workdir / f".{EXPORT_DIR}.tmp"
    model_config: dict = {
        # timm copies the architecture's hub entry (tag, license) into the export; these weights are ours.
        "pretrained_cfg": {"tag": "vitlarge" if weights == "raw" else "vitlarge_ema", "license": None},
        "vitlarge_weights": weights,  # timm keeps unknown keys at config.json's top level (and ignores them)
        "vitlarge_validation": validation(cfg),
    }
    if class_names:
        model_config["label_names"] = list(class_names)
    if class_descriptions:
        model_config["label_descriptions"] = dict(class_descriptions)
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        if tensors is None:
            tensors = {k: v.detach().contiguous().cpu() for k, v in raw.state_dict().items()}
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt", "weights": weights})
        save_timm_config(raw, tmp / "config.json", model_config, data_config(cfg), model_args(cfg))
        for name in ("model.safetensors", "config.json"):
            fileio.fsync_path(tmp / name)
        fileio.fsync_dir(tmp)
        old = workdir / f".{EXPORT_DIR}.old"
        if out.exists():  # a rerun of a finished run exports again: swap, then drop the old folder
            shutil.rmtree(old, ignore_errors=True)
            os.replace(out, old)
        os.replace(tmp, out)
        fileio.fsync_dir(workdir)
    except (OSError, SafetensorError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(
            f"exporting {out} failed ({getattr(e, 'strerror', None) or e}); free space in {workdir} and "
            "run the same command again: the final checkpoint holds the same weights",
            same_on_all_ranks=False,
        ) from None
    shutil.rmtree(old, ignore_errors=True)
    return out


def validation(cfg: Config) -> str:
    """How the final top-1 was measured: ``rectangular`` where the last phase validates rectangular batches
    (``data.rect_val`` or its ``rect_val``), else ``square``."""
    return "rectangular" if final_rect_val(cfg) else "square"


def model_args(cfg: Config) -> dict:
    """The keyword arguments that rebuild the architecture: `vitlarge.model.vit.model_kwargs` less the drop
    rates (training-only, as timm 1.0.31's ``get_model_args`` leaves them out)."""
    return {
        k: v
        for k, v in model_kwargs(cfg).items()
        if not (k in ("drop_rate", "drop_path_rate") or k.endswith("_drop_rate"))
    }


def save_timm_config(raw: torch.nn.Module, path: Path, model_config: dict, data_cfg: dict, args: dict) -> None:
    """Writes timm's config.json for ``raw`` at ``path``: timm's `save_config_for_hf` with ``data_config``
    (timm >= 1.0.31, which records the model's arguments itself), else the older function (timm 1.0.29
    has neither ``data_config`` nor recorded arguments, and would replace ``pretrained_cfg`` whole by
    ``model_config``'s) with ``args``, and ``pretrained_cfg`` completed here as 1.0.31 completes it: the
    tag and licence, the preprocessing ``data_cfg``, no test-time size or crop of the source weights.
    A run on a machine whose timm is older than requirements/common.txt's still exports after days of
    training (the first GPU run's timm 1.0.29 stopped there with a TypeError)."""
    if "data_config" in inspect.signature(save_config_for_hf).parameters:
        save_config_for_hf(raw, str(path), model_config=model_config, data_config=data_cfg)
        return
    ours = dict(model_config)
    pretrained = ours.pop("pretrained_cfg", {})
    # timm 1.0.29 annotates config_path as str but calls config_path.open(): it takes a Path
    save_config_for_hf(raw, Path(path), model_config=ours, model_args=args)  # pyright: ignore[reportArgumentType]
    written = json.loads(Path(path).read_text())
    cfg = written["pretrained_cfg"]
    for key in ("test_input_size", "test_pool_size", "test_crop_pct", "label_offset"):
        cfg.pop(key, None)  # the source checkpoint's test-time recommendations, not ours
    cfg.update(pretrained)
    cfg.update(data_cfg)
    source_cfg = cast("dict[str, Any]", raw.pretrained_cfg)  # set by timm's build_model_with_cfg; not declared
    if tuple(cfg["input_size"][1:]) != tuple(source_cfg["input_size"][1:]):
        cfg["pool_size"] = None
    cfg["num_classes"] = raw.num_classes
    strict = getattr(getattr(raw, "patch_embed", None), "strict_img_size", cfg.get("fixed_input_size", False))
    cfg["fixed_input_size"] = bool(strict and not getattr(raw, "dynamic_img_size", False))  # phases resize
    cfg["custom_load"] = False  # the safetensors beside it hold timm's own state dict
    Path(path).write_text(json.dumps(written, indent=2))
