"""Config keys that were renamed, each with its successor (one knob per concept): a recipe or an override that sets
an old key stops with one line naming the new one (`renamed_line`), and a config recorded under the old name (a
checkpoint's meta.json) is read as its successor says (`upgrade_recorded`), so old checkpoints resume and evaluate.
Imports nothing of ours."""

from __future__ import annotations

RENAMED = {
    "model.grad_checkpointing": (
        "train.activation_checkpointing",
        "set train.activation_checkpointing=full (what model.grad_checkpointing=true did), off, or selective",
    ),
}
"""Old key -> (its successor, how to set the successor)."""


def renamed_line(origin: str, key: str) -> str:
    """The one line for ``key`` (a `RENAMED` key) set by ``origin`` (the recipe, ``command line``, a file)."""
    new, how = RENAMED[key]
    return f"{origin}: {key} was renamed to {new}; {how}"


def upgrade_recorded(config: dict) -> dict:
    """``config`` (a recorded config: meta.json's ``config``) with each `RENAMED` key read as its successor, the old
    key dropped: ``model.grad_checkpointing=true`` is ``train.activation_checkpointing=full`` where that key is off
    or absent (a checkpoint written before the rename), false is nothing. A new dict; sections that are not maps
    are left for the checks to name."""
    model, train = config.get("model"), config.get("train")
    if not isinstance(model, dict) or "grad_checkpointing" not in model:
        return config
    out = {**config, "model": {k: v for k, v in model.items() if k != "grad_checkpointing"}}
    if model["grad_checkpointing"] is True and isinstance(train, dict):
        if train.get("activation_checkpointing", "off") == "off":
            out["train"] = {**train, "activation_checkpointing": "full"}
    return out
