"""The trained model in timm's own format: a folder that ``timm.create_model`` loads in one line.

    model = timm.create_model("local-dir:runs/demo_digits/model", pretrained=True)
    cfg = timm.data.resolve_data_config(model=model)            # the preprocessing it was trained with
    transform = timm.data.create_transform(**cfg)

``<workdir>/model/`` holds ``model.safetensors`` (the unwrapped model's state dict) and
``config.json`` written by timm's own `save_config_for_hf`: architecture, the model arguments
timm recorded when it built the model (patch size, depth, ...), class count, class names from the
dataset manifest, and the evaluation preprocessing vitlarge used (input size, mean/std, crop
fraction, interpolation), so timm's transform matches vitlarge's validation pipeline. Which weights the folder
holds is written in both files: ``vitlarge_weights`` in config.json and ``weights`` in the safetensors
metadata, ``raw`` (the trained weights) or ``ema`` (their moving average, ``train.export_ema``; timm's
``pretrained_cfg.tag`` is then ``vitlarge_ema``).

The folder is written under a temporary name, fsynced and renamed: a reader sees the old export
or the new one, never half of one.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from vitlarge import fileio
from vitlarge.checkpoint import sharded
from vitlarge.config.schema import Config
from vitlarge.errors import UserError

EXPORT_DIR = "model"


def data_config(cfg: Config) -> dict:
    """vitlarge's evaluation preprocessing in timm's terms (see `vitlarge.data.pipelines.val_pipeline`).

    With ``train.phases`` the input size is the last phase's ``eval_size`` (where the final top-1 was
    measured, e.g. FixRes' 256 px after 224 px training), not ``data.image_size``."""
    from vitlarge.config.phase_list import resolve_phases
    from vitlarge.data.common import VAL_INTERPOLATION

    size = resolve_phases(cfg)[-1].eval_size  # the last phase's (the recipe's own without train.phases)
    return dict(
        input_size=(3, size, size),
        mean=tuple(cfg.data.mean),
        std=tuple(cfg.data.std),
        crop_pct=cfg.data.val_crop_pct,
        crop_mode="center",
        interpolation=VAL_INTERPOLATION,
    )


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
    from timm.models._hub import save_config_for_hf

    if ema and tensors is None:
        raise ValueError("export(ema=True) needs the EMA's tensors")
    weights = "ema" if ema else "raw"
    raw = sharded.inner(model)
    workdir = Path(workdir)
    out = workdir / EXPORT_DIR
    tmp = workdir / f".{EXPORT_DIR}.tmp"
    model_config: dict = {
        # timm copies the architecture's hub entry (tag, license) into the export; these weights are ours.
        "pretrained_cfg": {"tag": "vitlarge" if weights == "raw" else "vitlarge_ema", "license": None},
        "vitlarge_weights": weights,  # timm keeps unknown keys at config.json's top level (and ignores them)
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
        save_config_for_hf(raw, str(tmp / "config.json"), model_config=model_config, data_config=data_config(cfg))
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
