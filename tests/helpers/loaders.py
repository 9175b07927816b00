"""DALI loaders from a data folder and keyword settings, for tests that build them outside a run.

``open_train(data_dir, batch_size, image_size, rank=..., seed=..., repeats=3)``: the keywords that place the
loader (``rank``, ``world_size``, ``device``, ``state``) go to the loader, the rest to its spec
(`vitlarge.data.spec.TrainSpec` / `ValSpec`), so a test names only what it varies.
"""

from __future__ import annotations

import torch

PLACE = ("rank", "world_size", "device", "state")


def _split(kw: dict) -> tuple[dict, dict]:
    place = {k: kw.pop(k) for k in PLACE if k in kw}
    place.setdefault("rank", 0)
    place.setdefault("world_size", 1)
    place.setdefault("device", torch.device("cpu"))
    return place, kw


def open_train(data_dir: str, batch_size: int, image_size: int, **kw):
    """A `TrainLoader`."""
    from vitlarge.data import TrainLoader, TrainSpec

    place, fields = _split(dict(kw))
    return TrainLoader(TrainSpec(data_dir, batch_size, image_size, **fields), **place)


def open_val(data_dir: str, batch_size: int, image_size: int, **kw):
    """A `ValLoader`."""
    from vitlarge.data import ValLoader, ValSpec

    place, fields = _split(dict(kw))
    return ValLoader(ValSpec(data_dir, batch_size, image_size, **fields), **place)
