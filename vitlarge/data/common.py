"""What both data sources (DALI over TFRecords, synthetic) share, importable without DALI.

The validation interpolation the export declares, the version of a checkpoint's data state, how a
split's examples are divided over the ranks and how many forwards a validation pass takes: the
synthetic source, the export and train.py need them on a machine where DALI is not installed.
"""

from __future__ import annotations

import json
import math

from vitlarge.errors import UserError

VAL_INTERPOLATION = "bicubic"  # timm's eval resize; the export declares it (vitlarge/checkpoint/export.py)
STATE_VERSION = 2  # 2: per-epoch file-order shuffle (shuffle_after_epoch), one seed for all ranks


class SettingsChanged(UserError):
    """A loader state saved under other data or loader settings (batch size, image size, augmentation,
    shards, world size): its position means nothing to this loader. A run drops it and continues with a
    fresh epoch order (`vitlarge.data.phased.PhasedLoaders`); a caller that gives a state directly gets
    the one-line error."""


def older_state_version(state: str | None) -> int | None:
    """The version of a loader state written by an older vitlarge (whose pipeline this one cannot
    continue), else None: for the current version, and for anything malformed (the loader itself
    refuses that with its one-line error)."""
    try:
        version = json.loads(state)["version"] if state else None
    except (ValueError, TypeError, KeyError, RecursionError):
        return None
    return version if isinstance(version, int) and version < STATE_VERSION else None


def check_rank(rank: int, world_size: int) -> None:
    """UserError unless ``0 <= rank < world_size``."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise UserError(f"rank={rank}, world_size={world_size}: need 0 <= rank < world_size")


def shard_range(num_examples: int, shard_id: int, num_shards: int) -> tuple[int, int]:
    """The [begin, end) records DALI's reader gives shard ``shard_id`` (same formula as DALI)."""
    return num_examples * shard_id // num_shards, num_examples * (shard_id + 1) // num_shards


def rank_slice(rank: int, world_size: int, num_examples: int, what: str) -> tuple[int, int]:
    """This rank's ``[begin, end)`` of the synthetic source's ``num_examples`` (`shard_range`); UserError, naming the
    config key ``what``, if it holds none."""
    check_rank(rank, world_size)
    begin, end = shard_range(num_examples, rank, world_size)
    if end <= begin:
        raise UserError(
            f"{what}={num_examples} synthetic examples cannot be split over world_size={world_size}; "
            f"set {what} to at least {world_size}"
        )
    return begin, end


def val_forwards(num_examples: int, world_size: int, batch_size: int) -> int:
    """Batches per validation pass on every rank (`ValLoader.masked`): DALI pads each rank's slice to
    the largest one's size, ``ceil(num_examples / world_size)``, then to whole batches."""
    return math.ceil(math.ceil(num_examples / world_size) / batch_size)
