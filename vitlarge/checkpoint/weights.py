"""Model weights from a checkpoint, an export or a ``model.safetensors``, and whether a checkpoint holds this recipe's model.

`weights_of` and `load_model_weights` read on one process, no collective (``model.init_from``, ``vitlarge.evaluate``);
`check_compatible` is the one check that a checkpoint's model (name, parameter shapes) is this recipe's, with the
override that fixes a rerun at another image size.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch.distributed.checkpoint.api import CheckpointException

from vitlarge import fileio
from vitlarge.checkpoint import sharded
from vitlarge.checkpoint.files import reason_of
from vitlarge.checkpoint.model_of import export_doc
from vitlarge.checkpoint.trust import index as dcp_index
from vitlarge.checkpoint.trust.folder import verify
from vitlarge.checkpoint.trust.layout import Unusable, missing, read_meta
from vitlarge.checkpoint.trust.torch_files import safetensors_file
from vitlarge.config.schema import Config
from vitlarge.distributed.plugins import unwrap
from vitlarge.errors import UserError
from vitlarge.model.vit import build_model


def param_shapes(model: torch.nn.Module) -> dict[str, list[int]]:
    """The unsharded state dict's shapes (never a collective: FSDP2's DTensors report their global shape)."""
    return sharded.full_shapes(model)


def check_compatible(meta: dict, path: Path, model: torch.nn.Module, cfg: Config) -> None:
    """A one-line ``UserError`` unless the checkpoint holds this recipe's model in a layout this run reads
    (any plugin and world size: the optimizer state is re-sharded where needed, see vitlarge/checkpoint/sharded.py)."""
    shapes, saved = param_shapes(model), meta["param_shapes"]
    if meta["model"] == cfg.model.name and saved == shapes:
        return
    diff = [k for k in shapes if saved.get(k) != shapes[k]]
    trained_at = meta.get("config", {}).get("data", {}).get("image_size")
    if meta["model"] == cfg.model.name and diff == ["pos_embed"] and saved.keys() == shapes.keys():
        # The same model at another input size (a rerun without the run's data.image_size): only the
        # position embedding's grid differs.
        grid = _size_of_grid(saved["pos_embed"], model)
        if trained_at and grid and trained_at != grid:  # the model is built at data.image_size: never so when trained
            raise UserError(
                f"checkpoint {path}: its meta.json records data.image_size={trained_at}, but its weights are of a "
                f"{grid} px model (pos_embed {saved['pos_embed']}); the file was edited or damaged: use another "
                "checkpoint"
            )
        trained_at = trained_at or grid
        if trained_at and trained_at != cfg.data.image_size:
            raise UserError(
                f"checkpoint {path} was trained at data.image_size={trained_at}, this run has data.image_size="
                f"{cfg.data.image_size} (pos_embed {saved['pos_embed']} there, {shapes['pos_embed']} here); "
                f"pass data.image_size={trained_at}"
            )
    if diff:
        detail = f"first difference at '{diff[0]}': {saved.get(diff[0])} there, {shapes[diff[0]]} here"
    else:
        detail = "different parameter set"
    raise UserError(
        f"checkpoint {path} holds model {meta['model']} that does not match the recipe's {cfg.model.name} "
        f"({detail}); use another --workdir or --resume a checkpoint of this recipe"
    )


def check_compatible_config(meta: dict, path: str | Path, cfg: Config) -> None:
    """`check_compatible` against the model ``cfg`` describes, built on the meta device (no memory): before a model
    is built at a size a checkpoint's meta.json gives (the evaluation as trained), so a recorded
    ``data.image_size=16000`` is one line, not a 6.6 GiB model first."""
    check_compatible(meta, Path(path), build_model(cfg, "meta"), cfg)


def _size_of_grid(pos_embed: list[int], model: torch.nn.Module) -> int | None:
    """The square input size whose patch grid ``pos_embed`` (a shape) holds, for ``model``'s patch size and
    prefix tokens; None where that is not a square grid of square patches."""
    m = unwrap(model)
    patch = tuple(getattr(getattr(m, "patch_embed", None), "patch_size", ()) or ())
    if len(pos_embed) != 3 or len(patch) != 2 or patch[0] != patch[1]:
        return None
    tokens = pos_embed[1] - (0 if getattr(m, "no_embed_class", False) else getattr(m, "num_prefix_tokens", 1))
    side = math.isqrt(max(tokens, 0))
    return side * patch[0] if tokens > 0 and side * side == tokens else None


def _export_input_size(folder: Path) -> tuple[int, ...] | None:
    """``pretrained_cfg.input_size`` that an export's config.json records (timm's), or None: the file read as data
    (`export_doc`), and only for this message."""
    pre = export_doc(folder).get("pretrained_cfg")
    size = pre.get("input_size") if isinstance(pre, dict) else None
    return tuple(size) if isinstance(size, list) and all(isinstance(x, int) for x in size) else None


def _does_not_fit(given: Path, tensors: dict, model: torch.nn.Module, cfg: Config, e: RuntimeError) -> str:
    """Why a model.safetensors does not load into ``model``: for an export of another image size, the size it
    was trained at and the override; else torch's first mismatch (its first line is only a header)."""
    mine = unwrap(model).state_dict().get("pos_embed")
    theirs = tensors.get("pos_embed")
    if mine is not None and theirs is not None and list(mine.shape) != list(theirs.shape):
        trained_at = _size_of_grid(list(theirs.shape), model)
        recorded = _export_input_size(given) if given.is_dir() else None
        if trained_at and trained_at != cfg.data.image_size:
            said = f" (its config.json: input_size {'x'.join(map(str, recorded))})" if recorded else ""
            return (
                f"export {given} was trained at data.image_size={trained_at}{said}, this run has data.image_size="
                f"{cfg.data.image_size} (pos_embed {list(theirs.shape)} there, {list(mine.shape)} here); "
                f"pass data.image_size={trained_at}"
            )
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    first = next((line for line in lines[1:] if not line.startswith("Error(s)")), lines[0] if lines else "")
    return f"{given} does not fit model {cfg.model.name}: {first}"


def weights_of(path: str | Path, meta: dict, like: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The full model state dict of checkpoint folder ``path`` (``meta``: its meta.json), on this process's
    CPU, no collective, after the check every resume runs (`vitlarge.checkpoint.trust.folder.verify`: every listed
    file's size and CRC32C, DCP's index and its byte ranges; ``Unusable`` if it fails). The one reader of a
    checkpoint's weights: ``vitlarge.evaluate`` and ``model.init_from`` come here.
    ``like``: a plain model's state dict to fill (format 3); allocated from the checkpoint otherwise.
    ``path`` is one the user named: a link (their own ``latest``) is resolved once, and the folder it names is
    checked and read (`verify` refuses links, as an automatic resume's listing must)."""
    path = Path(path).resolve()
    problem = verify(path)
    if problem:
        raise Unusable(path, problem)
    if meta["format_version"] < 3:
        return safetensors_file(path, "model.safetensors")
    try:
        # Inside DCP's load its reason would be lost ("metadata is None").
        index = dcp_index.read_index(path, meta["files"])
        return sharded.read_full_model(path, like, files=meta["files"], index=index)
    except dcp_index.IndexProblem as e:
        raise Unusable(path, str(e)) from None
    except CheckpointException as e:
        raise Unusable(path, reason_of(e)) from None


def evaluate_another(path: str | Path, problem: str) -> UserError:
    """The line for a checkpoint that fails its check where ``vitlarge.evaluate --checkpoint`` named it: that
    command's fix (`Unusable`'s is the resume's ``--resume``); every rank reads the same files."""
    return UserError(
        f"checkpoint {path} fails its check ({problem}); pass another checkpoints/step_* folder or an exported "
        "model folder as --checkpoint",
        same_on_all_ranks=True,
    )


def load_model_weights(path: str | Path, model: torch.nn.Module, cfg: Config) -> None:
    """Weights only, from a checkpoint folder, an export folder (`vitlarge.checkpoint.export`) or a ``model.safetensors``."""
    given = path = Path(path)
    if path.is_dir() and (path / "config.json").is_file() and not (path / "meta.json").exists():
        problem = fileio.regular_file_problem(path / "config.json")  # an export's files are its own: no link out
        if problem:
            raise UserError(f"{given}: {problem}; pass an exported model folder or a checkpoints/step_* folder")
        path = path / "model.safetensors"  # an export: timm's config.json beside the weights
    elif path.is_dir():
        meta = read_meta(path)
        check_compatible(meta, path, model, cfg)
        target = unwrap(model)
        like = {k: torch.empty_like(v, device="cpu") for k, v in target.state_dict().items()}
        try:
            weights = weights_of(path, meta, like)
        except Unusable as e:
            raise evaluate_another(path, e.problem) from None
        try:
            target.load_state_dict(weights)
        except (RuntimeError, TypeError) as e:  # a checkpoint whose index passed but whose entries do not fit
            problem = f"its weights do not fit the model ({str(e).splitlines()[0][:120]})"
            raise evaluate_another(path, problem) from None
        if (name := non_finite(target)) is not None:
            raise evaluate_another(path, f"its {name} holds NaN or inf")
        return
    if not path.is_file():
        raise missing(path)
    problem = fileio.regular_file_problem(path)
    if problem:
        raise UserError(f"{given}: {problem}; pass an exported model folder or a checkpoints/step_* folder")
    tensors = safetensors_file(path.parent, path.name)
    try:
        unwrap(model).load_state_dict(tensors)
    except RuntimeError as e:
        raise UserError(_does_not_fit(given, tensors, model, cfg, e)) from None
    if (name := non_finite(unwrap(model))) is not None:
        raise UserError(
            f"{path}: {name} holds NaN or inf (the file was damaged, or its run diverged): no figure scored from it "
            "means anything; pass another exported model folder or a checkpoints/step_* folder",
            same_on_all_ranks=True,
        )


def non_finite(model: torch.nn.Module) -> str | None:
    """The name of ``model``'s first parameter or buffer holding NaN or inf, None where every value is finite: what
    `load_model_weights` refuses, since no figure scored from such weights means anything (their top-1 is the
    order topk gives NaN logits). Read through each tensor's min and max (NaN and inf carry into them): one pass
    and two numbers, where ``isfinite(t).all()`` writes a mask of the tensor first (15x slower on a CPU: ViT-H's
    631M values took 5 s a process)."""
    for name, t in (*model.named_parameters(), *model.named_buffers()):
        if t.is_floating_point() and t.numel() and not bool(torch.isfinite(torch.stack(torch.aminmax(t))).all()):
            return name
    return None
