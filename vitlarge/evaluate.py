"""The command that evaluates a checkpoint or an export exactly (vitlarge/train/validation.py).

python -m vitlarge.evaluate --config recipes/demo_digits.py --checkpoint runs/demo/checkpoints/step_0000600
torchrun --nproc_per_node 4 -m vitlarge.evaluate --config ... --checkpoint runs/demo/model

It prints a table (what was evaluated, at what size, on how many images; top-1, top-5, loss); ``--json`` prints
the same numbers as one JSON object instead, for scripts: the form it printed by default before the table
(CHANGELOG.md), which `JSON_MOVED` says once on stderr where a script reads the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import NoReturn

from vitlarge.checkpoint import model_of
from vitlarge.checkpoint.model_of import export_doc
from vitlarge.checkpoint.trust import layout
from vitlarge.checkpoint.trust.meta import is_number
from vitlarge.config.load import add_override_arguments, load_config
from vitlarge.config.phase_list import entries, final_eval_size, patch_size
from vitlarge.config.schema import IMAGE_SIZE, MAX_EVAL_TOKENS, DataConfig, rule_of
from vitlarge.data import class_map
from vitlarge.data.manifest import MANIFEST_NAME, Manifest, load_manifest
from vitlarge.distributed import threads
from vitlarge.distributed.process import main_then_leave
from vitlarge.errors import UserError
from vitlarge.events import finite_or_none
from vitlarge.plan.plan import evaluation_plan
from vitlarge.train.command import exit_status, start

# What decides the size, crop and batches training evaluated a checkpoint at (`vitlarge.data.sources.val_spec`).
AS_TRAINED = (
    "train.phases",
    "train.global_batch",
    "train.micro_batch",
    "train.epochs",
    "data.image_size",
    "data.val_crop_pct",
    "data.rect_val",
    "data.mean",
    "data.std",
)


def as_trained(cfg, saved: dict) -> list[str]:
    """Sets ``cfg``'s `AS_TRAINED` keys to the checkpoint's (``saved``: the config in its meta.json), so the
    evaluation is the one training ran whatever ``--config`` and overrides say now (a phase list edited
    since, phases given as overrides then); returns the keys that differed."""
    # Compared in meta.json's form, through JSON: the keys each phase entry set, a recipe's tuples as lists.
    changed, plain = [], json.loads(json.dumps(cfg.to_dict()))
    for key in AS_TRAINED:
        section, name = key.split(".")
        if name not in saved.get(section, {}):
            continue  # an older checkpoint without it: the given config's
        value = saved[section][name]
        if value == plain[section][name]:
            continue
        changed.append(key)
        if key == "train.phases":  # typed, as validation types a recipe's: one line for a list of another form
            try:
                value = entries(value)
            except (TypeError, ValueError, AttributeError) as e:
                raise UserError(f"the checkpoint's meta.json: train.phases is not a phase list ({e})") from None
        elif isinstance(getattr(getattr(cfg, section), name), tuple):
            value = tuple(value)
        setattr(getattr(cfg, section), name, value)
    return changed


# What an export's config.json records of the evaluation its run made (`vitlarge.checkpoint.export.data_config`),
# read back as the keys `as_exported` sets: timm's name, the config key, and the values it takes.
EXPORTED = (("mean", "data.mean"), ("std", "data.std"), ("crop_pct", "data.val_crop_pct"))


def _refused(path: Path, key: str, value, rule: str) -> UserError:
    return UserError(
        f"{path}: {key} is {str(value)[:80]}, not {rule}; the file was edited or damaged: use another export "
        "or the run's checkpoint folder"
    )


def _beyond_exports(path: Path, value, rule: str) -> UserError:
    """An evaluation size a run may state (its recipe allows it) but an export is not evaluated at: not damage. The
    run's checkpoint folder is evaluated at its recorded sizes, bounded by `MAX_IMAGE_SIZE` alone."""
    return UserError(
        f"{path}: pretrained_cfg.input_size is {str(value)[:80]}; vitlarge.evaluate takes an export's evaluation "
        f"size only with {rule}: evaluate the run's checkpoint folder (checkpoints/step_*) instead"
    )


def exported_settings(folder: Path) -> dict:
    """``{config key: value}`` of what an export folder's config.json (timm's, `vitlarge.checkpoint.export`) records
    of the run that wrote it: ``data.image_size`` (the model's grid: ``model_args.img_size``), ``data.mean``,
    ``data.std``, ``data.val_crop_pct`` and the size it was evaluated at (``eval_size``: ``input_size``). The
    file is data: read up to `EXPORT_CONFIG_LIMIT`; a value of another type is left out (the weights' own check
    then says what does not fit), a number outside the schema's rule for its key (an image side past
    `MAX_IMAGE_SIZE`, a std of 0) or a mean or std that is not three numbers is one `UserError` naming the file
    and key, before anything is built from it;
    {} without a readable file."""
    path, doc = folder / "config.json", export_doc(folder)
    args, pre = doc.get("model_args"), doc.get("pretrained_cfg")
    args, pre = args if isinstance(args, dict) else {}, pre if isinstance(pre, dict) else {}
    out: dict = {}
    size = args.get("img_size")
    if isinstance(size, list) and len(size) == 2 and size[0] == size[1]:
        size = size[0]
    if isinstance(size, int) and not isinstance(size, bool):
        if not IMAGE_SIZE.test(size):
            raise _refused(path, "model_args.img_size", size, f"an image side {IMAGE_SIZE.words}")
        out["data.image_size"] = size
    shown = pre.get("input_size")
    if isinstance(shown, list) and len(shown) == 3 and all(isinstance(x, int) for x in shown) and shown[1] == shown[2]:
        if not IMAGE_SIZE.test(shown[2]):
            raise _refused(path, "pretrained_cfg.input_size", shown, f"[3, side, side], side {IMAGE_SIZE.words}")
        out["eval_size"] = shown[2]
    rules = {f.name: rule_of(f) for f in dataclasses.fields(DataConfig)}
    for name, key in EXPORTED:
        value, rule = pre.get(name), rules.get(key.split(".")[1])
        if key == "data.val_crop_pct" and (
            is_number(value) or (isinstance(value, int) and not isinstance(value, bool))
        ):
            if not (is_number(value) and 0 < value <= 1):  # an int past a float's range is a number, refused
                raise _refused(path, f"pretrained_cfg.{name}", value, "in (0, 1]")
            out[key] = float(value)
        elif key != "data.val_crop_pct" and name in pre:
            # Present, a mean or std is used or refused: left out, the recipe's would normalise the export's
            # images without a word.
            if not isinstance(value, list) or len(value) != 3 or not all(map(is_number, value)):
                raise _refused(path, f"pretrained_cfg.{name}", value, rule.words if rule else "three numbers")
            if rule is not None and not rule.test(*value):
                raise _refused(path, f"pretrained_cfg.{name}", value, rule.words)
            out[key] = tuple(float(x) for x in value)
    return out


def as_exported(cfg, folder: Path) -> tuple[list[str], int | None]:
    """Sets ``cfg``'s keys that `exported_settings` reads from export ``folder`` to the export's, so the export is
    evaluated as the run that wrote it evaluated (the ``data.image_size`` its weights were trained at, its
    preprocessing) whatever ``--config`` says now, as `as_trained` does for a checkpoint folder; returns the keys
    that differed and the size the run evaluated at (None: not recorded). An evaluation size other than the model's
    grid is one a run with phases evaluated at: the model is built as that run's was, resampling its position
    embedding to the input's grid (timm's ``dynamic_img_size``; a fixed grid asserts the input's size)."""
    found = exported_settings(folder)
    changed = []
    for key, value in found.items():
        if key == "eval_size":
            continue
        section, name = key.split(".")
        if getattr(getattr(cfg, section), name) != value:
            changed.append(key)
            setattr(getattr(cfg, section), name, value)
    size = found.get("eval_size")
    if size is not None and size % patch_size(cfg):
        raise _beyond_exports(
            folder / "config.json", [3, size, size], f"sides a multiple of the patch size {patch_size(cfg)}"
        )
    if size is not None and (size // patch_size(cfg)) ** 2 > MAX_EVAL_TOKENS:
        raise _beyond_exports(
            folder / "config.json",
            [3, size, size],
            f"at most {MAX_EVAL_TOKENS:,} patches of {patch_size(cfg)} px (a side of at most "
            f"{math.isqrt(MAX_EVAL_TOKENS) * patch_size(cfg)} px)",
        )
    if size is not None and size != cfg.data.image_size:
        cfg.model.kwargs = {**cfg.model.kwargs, "dynamic_img_size": True}
    return changed, size


JSON_MOVED = (
    "note: vitlarge.evaluate prints a table; the one JSON line it printed before, for scripts, is --json (CHANGELOG.md)"
)
"""Said on stderr with the table where stdout is not a terminal (a script or a pipe reads it, as scripts read the
JSON line before): the table is what a person reads, and a script that parsed the JSON learns where it went."""


def show(metrics: dict, checkpoint: str, step: int | None, size: int, as_json: bool) -> None:
    """The result on stdout: one JSON object (``--json``; a value that is not finite is null) or the `table`, with
    `JSON_MOVED` once on stderr where no terminal reads stdout."""
    if as_json:  # a loss past a float's range (fp16 logits) is null, as metrics.jsonl writes it: NaN is not JSON
        print(json.dumps(finite_or_none(metrics)))
        return
    if not sys.stdout.isatty():
        print(JSON_MOVED, file=sys.stderr)
    print(table(checkpoint, step, size, metrics))


def table(checkpoint: str, step: int | None, size: int, metrics: dict) -> str:
    """The result as a person reads it: what was evaluated, on what, and the numbers. Top-5 only where it can
    miss (more than 5 classes scored: ``val_top5`` is None otherwise, `top5_or_none`)."""
    what = f"{checkpoint} (step {step})" if step is not None else checkpoint
    rows = [
        ("evaluated", what),
        ("images", f"{metrics['val_images']:,} validation images at {size} px"),
        ("top-1", f"{100 * metrics['val_top1']:.2f}%"),
        *([("top-5", f"{100 * metrics['val_top5']:.2f}%")] if metrics.get("val_top5") is not None else []),
        ("loss", f"{metrics['val_loss']:.4f}"),
    ]
    return "\n".join(f"{k:<10} {v}" for k, v in rows)


def top5_or_none(metrics: dict, scored: int) -> dict:
    """``metrics`` with ``val_top5`` None where ``scored`` classes are 5 or fewer: every image is then in its top 5,
    a 100% that measures nothing (CHANGELOG.md)."""
    return {**metrics, "val_top5": None} if scored <= 5 else metrics


def _data_classes(cfg, model: model_of.ModelOf, manifest: Manifest | None) -> class_map.ClassMap | None:
    """How the data set's classes are scored by ``model`` (`class_map.match`), from dataset.json's names
    (``manifest``) and the model's (an export's ``label_names``); None for the synthetic source (no manifest: its
    classes are the config's)."""
    if manifest is None:
        return None
    return class_map.match(
        model.names,
        model.num_classes or cfg.data.num_classes,
        class_map.data_names(manifest),
        manifest.num_classes,
        model_where=model.where,
        data_where=f"{cfg.data.path}/{MANIFEST_NAME}",
    )


def _configured(args, given: Path, export: model_of.ModelOf | None):
    """The config to evaluate with: ``--config`` and the overrides, or for an export without ``--config`` its own
    config.json's model (`model_of.build_config`) and the overrides."""
    common = dict(override_files=args.override_files, data__path=args.data)
    if args.config is not None:
        return load_config(args.config, args.overrides, **common)
    if export is None and not given.exists():
        raise layout.missing(given)
    if export is None:
        raise UserError(
            f"{given}: --config is needed for a checkpoint folder or a model.safetensors file (an export folder's "
            "config.json is enough); pass the recipe that trained it"
        )
    cfg = load_config(given / "config.json", args.overrides, base=model_of.build_config(export), **common)
    if cfg.data.source == "tfrecord" and not cfg.data.path:
        raise UserError("--data is needed without --config: pass the converted data folder (its dataset.json)")
    return cfg


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description="Evaluates a checkpoint or an exported model exactly: top-1, top-5 (past 5 classes) and loss on every validation "
        "image, once each, with any number of processes (torchrun --nproc_per_node N -m vitlarge.evaluate ...)."
    )
    p.add_argument(
        "--config",
        default=None,
        help="the recipe the model was trained with (a file or a shipped recipe's name): its model and data settings; "
        "optional for an exported model folder, whose config.json is enough",
    )
    p.add_argument(
        "--checkpoint",
        required=True,
        help="a checkpoints/step_* folder, an exported model folder (<workdir>/model) or a model.safetensors file",
    )
    p.add_argument(
        "--data",
        default=None,
        help="TFRecord directory with dataset.json whose validation split is evaluated "
        "(sets data.path; default: the recipe's)",
    )
    p.add_argument("--json", action="store_true", help="print the result as one JSON object instead of a table")
    add_override_arguments(p)
    args = p.parse_intermixed_args(argv)
    import torch.distributed as dist  # lazy: keeps torch off vitlarge-evaluate's argument errors and --help

    from vitlarge.checkpoint import weights as ckpt_weights  # lazy: keeps torch off vitlarge-evaluate --help
    from vitlarge.data.phased import evaluated_phase  # lazy: keeps torch off vitlarge-evaluate --help
    from vitlarge.data.sources import val_loader  # lazy: keeps torch off vitlarge-evaluate --help
    from vitlarge.model.precision import Precision  # lazy: keeps torch off vitlarge-evaluate --help
    from vitlarge.model.vit import build_model  # lazy: keeps torch and timm off vitlarge-evaluate --help
    from vitlarge.train.validation import evaluate  # lazy: keeps torch off vitlarge-evaluate --help

    def work(env) -> int:
        given = Path(args.checkpoint)
        try:
            meta = layout.read_meta(given) if (given / "meta.json").is_file() else None
        except layout.Unusable as e:
            raise ckpt_weights.evaluate_another(given, e.problem) from None
        folder = given.parent if given.suffix == ".safetensors" and given.is_file() else given
        is_export = meta is None and (folder / "config.json").is_file()  # a model.safetensors: its folder's
        exported = model_of.of_export(folder) if is_export else None
        cfg = _configured(args, folder, exported)
        changed, exported_at = (as_trained(cfg, meta.get("config", {})) if meta else []), None
        if is_export:  # an export: its config.json says how it was trained
            changed, exported_at = as_exported(cfg, folder)
        model = exported or (model_of.of_checkpoint(given, meta) if meta else model_of.ModelOf(str(given)))
        mismatch = model_of.config_mismatch(model, cfg, args.config, is_export) if args.config else None
        if mismatch:
            raise mismatch
        if meta is None:  # an export's or a bare model.safetensors' model, on the meta device, against its header
            weights = given / "model.safetensors" if given.is_dir() else given
            misfit = model_of.weights_misfit(cfg, weights, None if args.config else folder / "config.json")
            if misfit:
                raise misfit
        if meta:  # the model its meta.json describes is the checkpoint's, before one is built
            ckpt_weights.check_compatible_config(meta, args.checkpoint, cfg)
        manifest = None if cfg.data.source == "synthetic" else load_manifest(cfg.data.path)
        classes = _data_classes(cfg, model, manifest)
        # As train.py starts: precision auto resolved, the kernels training's own evaluation ran with.
        settings = start(cfg, env, threads.size_thread_pools()).settings
        device = settings.device
        net = build_model(cfg, device, settings.precision)
        ckpt_weights.load_model_weights(args.checkpoint, net, cfg)
        # The size and preprocessing training evaluated this checkpoint at: its phase's (a FixRes-style
        # last phase evaluates above its training size); an export evaluates as its last phase.
        # (the training split's size sets the steps of each phase: a set converted for evaluation has none)
        n_train = manifest.num_examples("train") if manifest is not None and "train" in manifest.splits else None
        step = meta["step"] if meta else None
        if changed and args.config is not None and env.is_main:  # without --config the model's own files are the config
            print(
                f"warning: {args.checkpoint} was trained with other {', '.join(changed)} than --config gives; "
                f"evaluating as it was trained (its {'meta.json' if meta else 'config.json'})",
                file=sys.stderr,
            )
        if classes is not None and classes.line and env.is_main:
            print(classes.line, file=sys.stderr)
        try:
            phase, size = evaluated_phase(evaluation_plan(cfg, env.world_size, n_train), step), None
        except UserError:  # no plan on this data (fewer training images than a global batch): the last phase's size
            phase, size = None, final_eval_size(cfg)
        if exported_at is not None and exported_at != (phase.eval_size if phase else size):
            phase, size = None, exported_at  # the size the export's run evaluated at (its config.json)
        val = val_loader(cfg, env.rank, env.world_size, device, phase=phase, image_size=size)
        index = classes.model_index if classes is not None else None
        metrics = evaluate(net, val, Precision(settings.precision, device), index)
        scored = (classes.scored if classes is not None else None) or cfg.data.num_classes
        if env.is_main:
            shown = phase.eval_size if phase else size or cfg.data.image_size
            show(top5_or_none(metrics, scored), args.checkpoint, step, shown, args.json)
        dist.destroy_process_group()
        return 0

    # An error every rank meets is printed once, by rank 0 (training's guard: the same lines and statuses).
    return exit_status(work)


def console() -> NoReturn:
    """The ``vitlarge-evaluate`` command: `main`, left by ``os._exit`` once a process group was up."""
    main_then_leave(main)


if __name__ == "__main__":
    console()
