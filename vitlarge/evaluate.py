"""The command that evaluates a checkpoint or an export exactly (vitlarge/train/evaluation.py).

python -m vitlarge.evaluate --config recipes/demo_digits.py --checkpoint runs/demo/checkpoints/step_0000600
torchrun --nproc_per_node 4 -m vitlarge.evaluate --config ... --checkpoint runs/demo/model
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import NoReturn

import torch.distributed as dist

# What decides the size, crop and batches training evaluated a checkpoint at (`vitlarge.data.sources.val_spec`).
AS_TRAINED = (
    "train.phases",
    "train.global_batch",
    "train.micro_batch",
    "train.epochs",
    "data.image_size",
    "data.val_crop_pct",
    "data.mean",
    "data.std",
)


def as_trained(cfg, saved: dict) -> list[str]:
    """Sets ``cfg``'s `AS_TRAINED` keys to the checkpoint's (``saved``: the config in its meta.json), so the
    evaluation is the one training ran whatever ``--config`` and overrides say now (a phase list edited
    since, phases given as overrides then); returns the keys that differed."""
    from vitlarge.config.phase_list import entries
    from vitlarge.errors import UserError

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


def main(argv: list[str] | None = None) -> int:
    from vitlarge.checkpoint import store
    from vitlarge.config.load import load_config
    from vitlarge.config.phase_list import final_eval_size
    from vitlarge.data.manifest import load_manifest
    from vitlarge.data.phased import evaluated_phase
    from vitlarge.data.sources import val_loader
    from vitlarge.distributed import threads
    from vitlarge.errors import UserError
    from vitlarge.model.precision import Precision
    from vitlarge.model.vit import build_model
    from vitlarge.plan.plan import evaluation_plan
    from vitlarge.train.evaluation import evaluate
    from vitlarge.train.start import exit_status, start

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--config", required=True)
    p.add_argument(
        "--checkpoint",
        required=True,
        help="a checkpoints/step_* folder, an exported model folder (<workdir>/model) or a model.safetensors file",
    )
    p.add_argument("--data", default=None)
    p.add_argument("--overrides", dest="override_files", action="append", default=[], metavar="FILE")
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    args = p.parse_intermixed_args(argv)

    def work(env) -> int:
        cfg = load_config(args.config, args.overrides, override_files=args.override_files, data__path=args.data)
        meta = store.read_meta(args.checkpoint) if (Path(args.checkpoint) / "meta.json").is_file() else None
        changed = as_trained(cfg, meta.get("config", {})) if meta else []
        if meta:  # the model its meta.json describes is the checkpoint's, before one is built
            store.check_compatible_config(meta, args.checkpoint, cfg)
        # As train.py starts: precision auto resolved, the kernels training's own evaluation ran with.
        settings = start(cfg, env, threads.size_thread_pools()).settings
        device = settings.device
        model = build_model(cfg, device, settings.precision)
        store.load_model_weights(args.checkpoint, model, cfg)
        # The size and preprocessing training evaluated this checkpoint at: its phase's (a FixRes-style
        # last phase evaluates above its training size); an export evaluates as its last phase.
        # (the training split's size sets the steps of each phase; the loader checks the rest of the data)
        n_train = None if cfg.data.source == "synthetic" else load_manifest(cfg.data.path).num_examples("train")
        step = meta["step"] if meta else None
        if changed and env.is_main:
            print(
                f"warning: {args.checkpoint} was trained with other {', '.join(changed)} than --config gives; "
                "evaluating as it was trained (its meta.json)",
                file=sys.stderr,
            )
        try:
            phase, size = evaluated_phase(evaluation_plan(cfg, env.world_size, n_train), step), None
        except UserError:  # no plan on this data (fewer training images than a global batch): the last phase's size
            phase, size = None, final_eval_size(cfg)
        val = val_loader(cfg, env.rank, env.world_size, device, phase=phase, image_size=size)
        metrics = evaluate(model, val, Precision(settings.precision, device))
        if env.is_main:
            print(json.dumps(metrics))
        dist.destroy_process_group()
        return 0

    # An error every rank meets is printed once, by rank 0 (training's guard: the same lines and statuses).
    return exit_status(work)


def console() -> NoReturn:
    """The ``vitlarge-evaluate`` command: `main`, left by ``os._exit`` once a process group was up."""
    from vitlarge.distributed.launch import main_then_leave

    main_then_leave(main)


if __name__ == "__main__":
    console()
