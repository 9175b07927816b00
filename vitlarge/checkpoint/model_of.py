"""What model an export or a checkpoint folder holds, read from its own files: architecture, class count, class names.

``vitlarge.evaluate`` builds an export's model from its config.json alone (timm's, `vitlarge.checkpoint.export`:
``architecture``, ``model_args``, ``num_classes``, ``label_names``), and compares a ``--config`` with what the model's
files record before anything is built, so another recipe's config is one line naming the keys to set, not torch's
``size mismatch for head.weight``. The files are data: config.json is read up to `EXPORT_CONFIG_LIMIT` bytes, a
regular file of the folder; a value of another type is left out (the weights' own check then says what does not
fit), class names that cannot be an export's (not one string per class, repeated) are one line naming the file.
Imports nothing heavy (``vitlarge-evaluate --help``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from vitlarge.config.schema import Config
from vitlarge.data.manifest_schema import MAX_CLASSES, MAX_SYNSET, distinct_names
from vitlarge.errors import UserError
from vitlarge.fileio import read_capped

EXPORT_CONFIG_LIMIT = (
    16 * 2**20
)  # an export's config.json (1000 class names and texts: ~100 KB); a larger one is not read

# model_args keys that the config sets elsewhere (data.num_classes, data.image_size: `vitlarge.model.vit.model_kwargs`)
_DERIVED_ARGS = ("num_classes", "img_size")


def export_doc(folder: Path) -> dict:
    """An export folder's config.json as a dict, read as data (a regular file of the folder, never a link, at most
    `EXPORT_CONFIG_LIMIT` bytes); {} where it is not there, not readable or not a JSON object."""
    try:
        doc = json.loads(read_capped(folder / "config.json", EXPORT_CONFIG_LIMIT, follow=False))
    except (OSError, ValueError, RecursionError):
        return {}
    return doc if isinstance(doc, dict) else {}


@dataclass(frozen=True)
class ModelOf:
    """A model as its own files record it; None where they do not say (an older checkpoint, an edited file).

    ``recorded``: ``{config key: value}`` the model was built with (``model.name``, ``data.num_classes``,
    ``model.kwargs.<name>``), what a ``--config`` is compared with. ``names``: the classes in output order."""

    where: str
    name: str | None = None
    num_classes: int | None = None
    kwargs: dict = field(default_factory=dict)
    names: tuple[str, ...] | None = None

    @property
    def recorded(self) -> dict:
        found = {"model.name": self.name, "data.num_classes": self.num_classes}
        found.update({f"model.kwargs.{k}": v for k, v in self.kwargs.items()})
        return {k: v for k, v in found.items() if v is not None}


def _dict(x) -> dict:
    return x if isinstance(x, dict) else {}


def _count(x) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= MAX_CLASSES else None


def of_export(folder: Path) -> ModelOf:
    """What export ``folder``'s config.json records of its model; its ``label_names`` must be one distinct string of
    at most `MAX_SYNSET` characters per class (a `UserError` naming the file and key otherwise)."""
    path = folder / "config.json"
    doc = export_doc(folder)
    name = doc.get("architecture") if isinstance(doc.get("architecture"), str) else None
    count = _count(doc.get("num_classes"))
    args = _dict(doc.get("model_args"))
    kwargs = {k: v for k, v in args.items() if k not in _DERIVED_ARGS and isinstance(v, (int, float, str, bool))}
    names = doc.get("label_names")
    if names is not None:
        if not (distinct_names(names) and len(names) == count):
            raise UserError(
                f"{path}: label_names is not {count or 'num_classes'} distinct class names of at most {MAX_SYNSET:,} "
                "characters; the file was edited or damaged: use another export or the run's checkpoint folder"
            )
    return ModelOf(str(path), name, count, kwargs, tuple(names) if names is not None else None)


def of_checkpoint(folder: Path, meta: dict) -> ModelOf:
    """What a checkpoint's meta.json (``meta``, read and checked: `vitlarge.checkpoint.trust.layout.read_meta`)
    records of its model: the name, the classifier's outputs (its ``head.weight`` shape, else the recorded
    ``data.num_classes``) and the recipe's model kwargs, and the class names its run's data set had (``classes``,
    checked by `vitlarge.checkpoint.trust.meta.classes_problem`; None in a checkpoint written before they were)."""
    config = _dict(meta.get("config"))
    data, model = _dict(config.get("data")), _dict(config.get("model"))
    head = _dict(meta.get("param_shapes")).get("head.weight")
    count = _count(head[0]) if isinstance(head, list) and head else None
    if count is None:
        count = _count(data.get("num_classes"))
    kwargs = _dict(model.get("kwargs"))
    name = meta.get("model") if isinstance(meta.get("model"), str) else None
    kwargs = {k: v for k, v in kwargs.items() if isinstance(v, (int, float, str, bool))}
    names = meta.get("classes")
    names = tuple(names) if isinstance(names, list) and len(names) == count else None
    return ModelOf(str(folder / "meta.json"), name, count, kwargs, names)


def build_config(model: ModelOf) -> Config:
    """The config an export is evaluated with where no ``--config`` is given: the schema's defaults (precision
    ``auto``), the export's architecture, model arguments and class count; the size and preprocessing are then
    the export's too (`vitlarge.evaluate.as_exported`). A `UserError` where config.json does not say."""
    if model.name is None or model.num_classes is None:
        raise UserError(
            f"{model.where} records no architecture or num_classes (an older or edited export); pass --config with "
            "the recipe that trained it"
        )
    cfg = Config()
    cfg.model.name, cfg.model.kwargs, cfg.data.num_classes = model.name, dict(model.kwargs), model.num_classes
    cfg.train.precision = "auto"  # fp16 only where the CPU or GPU computes it fast
    return cfg


# What a ViT's tensors say of the model_args that shaped them: (key, tensor, read the value from its shape).
_SHAPED_BY = (
    ("embed_dim", "patch_embed.proj.weight", lambda s: s[0]),
    ("patch_size", "patch_embed.proj.weight", lambda s: s[-1]),
    ("in_chans", "patch_embed.proj.weight", lambda s: s[1]),
)


def _depth(shapes: dict) -> int:
    return len({k.split(".")[1] for k in shapes if k.startswith("blocks.")})


def weights_misfit(cfg: Config, weights: Path, config_json: Path | None) -> UserError | None:
    """A one-line `UserError` where ``cfg``'s model does not have the shapes of the tensors in safetensors file
    ``weights``, found before anything is allocated: the model built on the meta device, the weights' header read
    (bounded: `vitlarge.checkpoint.trust.torch_files.header_shapes`). ``config_json``: the export's config.json that ``cfg``
    was built from (no ``--config``): the line names its ``model_args.<key>``; None: the ``model.kwargs.<key>`` to
    set. A key the shapes show (width, depth, patch size, channels) is named with both values, else the first
    tensor that differs. None where they fit, or where there is no such file (the weights' reader then says so)."""
    from vitlarge.checkpoint.trust.torch_files import header_shapes  # lazy: torch, off vitlarge-evaluate --help
    from vitlarge.model.vit import build_model  # lazy: torch and timm, off vitlarge-evaluate --help

    if not weights.is_file():
        return None
    where = f"{config_json}: model_args" if config_json else "model.kwargs"
    try:
        built = {k: tuple(v.shape) for k, v in build_model(cfg, "meta").state_dict().items()}
    except UserError as e:
        if config_json is None:
            raise
        return UserError(f"{config_json}: its model_args build no model ({str(e)[:300]}); {_DAMAGED}")
    held = {k: tuple(v.shape) for k, v in header_shapes(weights, str(weights), follow=False).items()}
    if all(held.get(k) == v for k, v in built.items()):
        return None
    if not held.keys() & built.keys():
        return UserError(f"{weights} holds none of the {len(built):,} tensors of a {cfg.model.name}; {_DAMAGED}")
    found = [(key, read(built[t]), read(held[t])) for key, t, read in _SHAPED_BY if t in built and t in held]
    found.append(("depth", _depth(built), _depth(held)))
    key, ours, theirs = next(((k, a, b) for k, a, b in found if a != b), (None, None, None))
    fix = _DAMAGED if config_json else f"pass model.kwargs.{key}={theirs} or the recipe that trained it"
    if key is not None:
        return UserError(f"{where}.{key} is {ours}, its {weights.name} holds {theirs}; {fix}")
    name = next(k for k, v in built.items() if held.get(k) != v)
    shown = "missing" if name not in held else f"{list(held[name])}"
    return UserError(f"{where} build {name} {list(built[name])}, its {weights.name} holds {shown}; {fix}")


_DAMAGED = "the file was edited or damaged: use another export or the run's checkpoint folder"


def config_mismatch(model: ModelOf, cfg: Config, recipe: str, export: bool) -> UserError | None:
    """A one-line `UserError` where ``cfg`` (from ``--config recipe`` and overrides) builds another model than the
    files record: another architecture, class count or model kwarg the recipe sets. Each differing key is named
    with the value to set. Kwargs the recipe leaves unset are not compared (timm records its defaults too);
    where they differ, loading the weights says so."""
    have = {"model.name": cfg.model.name, "data.num_classes": cfg.data.num_classes}
    have.update({f"model.kwargs.{k}": v for k, v in cfg.model.kwargs.items()})
    differ = [(k, v) for k, v in model.recorded.items() if k in have and have[k] != v]
    if not differ:
        return None
    shown = ", ".join(f"{k}={have[k]}" for k, _ in differ[:4])
    fix = " ".join(f"{k}={v}" for k, v in differ[:4]) + (" ..." if len(differ) > 4 else "")
    tail = (
        ", or leave out --config: the export's config.json is enough" if export else " (or the recipe that trained it)"
    )
    return UserError(f"{model.where} records another model than --config {recipe} gives ({shown}); pass {fix}{tail}")
