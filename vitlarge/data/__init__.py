"""Data for training: the dataset manifest and DALI loaders over TFRecord shards.

    from vitlarge.data import load_manifest, TrainLoader, TrainSpec, ValLoader, ValSpec

    loader = TrainLoader(TrainSpec(data_dir, batch_size, image_size, seed=0), rank=0, world_size=1, device=cpu)

``TrainLoader`` is an infinite, rank-sharded, exactly resumable stream of augmented batches;
``ValLoader`` is one exact pass over the validation split per iteration. Both yield
``(images float32 [B,3,H,W] normalized, labels int64 [B] in 0..C-1)`` on the given torch device.
The loaders (DALI, torch) are imported lazily so that ``vitlarge.data.manifest`` stays light for
the offline tools. ``data.source=synthetic`` swaps them for ``synthetic.SyntheticTrain``/``SyntheticVal``
(random batches made on the device, no DALI); `vitlarge.data.sources` chooses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vitlarge.data.manifest import Manifest, load_manifest
from vitlarge.data.spec import TrainSpec, ValSpec

if TYPE_CHECKING:
    from vitlarge.data.loader import TrainLoader, ValLoader

__all__ = ["Manifest", "load_manifest", "TrainLoader", "TrainSpec", "ValLoader", "ValSpec"]


def __getattr__(name: str) -> type[TrainLoader] | type[ValLoader]:
    if name in ("TrainLoader", "ValLoader"):
        from vitlarge.data import loader  # lazy: keeps DALI and torch off the data tools, which import vitlarge.data

        return getattr(loader, name)
    raise AttributeError(f"module 'vitlarge.data' has no attribute {name!r}")
