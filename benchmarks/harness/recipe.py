"""Recipe to benchmark config: one function for every benchmark and the GPU kit."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def bench_config(recipe: str, overrides: dict, check: str | None = None):
    """``recipes/<recipe>.py`` with ``overrides`` (``{"train.precision": "fp32", ...}``) set in order;
    validated as ``check`` when given (the benchmarks that build through `vitlarge.train.assemble.build` on a
    single process check, as train.py does; the multi-process ones set exactly what they measure)."""
    from vitlarge.config.load import load_recipe, validate

    cfg = load_recipe(ROOT / "recipes" / f"{recipe}.py")
    for key, value in overrides.items():
        section, field = key.split(".")
        setattr(getattr(cfg, section), field, value)
    if check:
        validate(cfg, check)
    return cfg


def demo_config(overrides: dict, model: str | None = None, image_size: int = 32):
    """The demo recipe as the multi-process benchmarks run it: ``model`` (timm's, default size, 1000
    classes) at ``image_size`` px in place of the demo's when given, Mixup off (the same call on every
    side), a 10**6-image epoch (no schedule edge in a few steps), then ``overrides``."""
    base = swap_model(model, image_size) if model else {}
    return bench_config(
        "demo_digits", base | overrides | {"augment.mixup_alpha": 0.0, "data.num_train_examples": 10**6}
    )


def swap_model(name: str, image_size: int) -> dict:
    """Overrides that put timm's ``name`` (its default size, 1000 classes) at ``image_size`` px in the demo recipe."""
    return {"model.name": name, "model.kwargs": {}, "data.image_size": image_size, "data.num_classes": 1000}
