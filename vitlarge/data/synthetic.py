"""Synthetic data: random images and labels made on the device, for runs without a data set or DALI.

``data.source=synthetic`` (`vitlarge.data.sources`) gives train.py these loaders in place of the DALI
ones, so a throughput check or a run on a GPU machine without ImageNet goes through exactly the
same trainer, engine, checkpoints and evaluation; only the batch source differs (timm's
``benchmark.py`` and torchtitan's synthetic datasets measure the same way).

Contract, as the DALI loaders' (`vitlarge.data.loader`): batches are ``(images, labels)`` on
``device``, images float32 ``[B, 3, S, S]`` contiguous (NCHW), labels int64 ``[B]`` in
``0..num_classes-1``. An image is uniform noise in the pixel range normalised with ``mean``/``std``
(0..1 convention), so its values span what a normalised photo's do. Every tensor is made on
``device`` by a ``torch.Generator`` there: no file, no host-to-device copy, no DALI.

* `SyntheticTrain`: an infinite stream. Micro-batch ``i`` of a rank comes from a generator seeded
  with ``(seed, rank, i)``, so it is reproducible, different on every rank, and ``state()`` (the
  number of batches returned) resumes it exactly. The stream has no epochs of its own: the epoch
  length (``data.num_train_examples``) only sizes the plan, as ``dataset.json``'s count does.
* `SyntheticVal`: a fixed validation set of ``num_examples`` images. Example ``j`` comes from a
  generator seeded with ``j`` alone (not the run's seed, not the rank), and ranks hold the same
  slices as DALI's reader (`vitlarge.data.common.shard_range`) with the same padding to
  `val_forwards` batches, so every example counts once and a pass is the same set at any world size
  and batch size.

A generator draws different numbers on a CPU and a GPU: the streams are reproducible per device type.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import torch

from vitlarge.data.common import STATE_VERSION, SettingsChanged, rank_slice, val_forwards
from vitlarge.data.manifest import ClassInfo, Manifest
from vitlarge.data.spec import TrainSpec, ValSpec
from vitlarge.errors import UserError

SOURCE = "synthetic"  # the "source" of a synthetic loader state (a DALI state has none)


def class_names(num_classes: int) -> list[str]:
    """``class_0000``, ``class_0001``, ...: the names the export writes for a synthetic run."""
    return [f"class_{i:04d}" for i in range(num_classes)]


@dataclass
class SyntheticManifest(Manifest):
    """A `Manifest` for the synthetic source: classes and per-split counts, no shards on disk."""

    counts: dict[str, int] = field(default_factory=dict)

    def num_examples(self, split: str) -> int:
        return self.counts[split]


def manifest(num_classes: int, num_train_examples: int, num_val_examples: int) -> SyntheticManifest:
    """What train.py reads from ``dataset.json`` (class count and names, the train split's size), made up."""
    return SyntheticManifest(
        num_classes=num_classes,
        label_offset=0,
        splits={},
        tool="vitlarge.data.synthetic",
        classes=[ClassInfo(label=i, synset=name) for i, name in enumerate(class_names(num_classes))],
        counts={"train": num_train_examples, "validation": num_val_examples},
    )


def is_state(state: str | None) -> bool:
    """Whether a checkpoint's data state was written by `SyntheticTrain` (else by the DALI loader, or none)."""
    if state is None:
        return False
    try:
        return json.loads(state).get("source") == SOURCE
    except (ValueError, TypeError, AttributeError, RecursionError):
        return False


def _seed(*parts) -> int:
    """A 63-bit generator seed from ``parts`` (hashed: nearby seeds, ranks and indices share no stream)."""
    digest = hashlib.blake2b(json.dumps(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class _Maker:
    """Fills batches of normalised noise images and labels on ``device`` with its own generator."""

    def __init__(self, image_size: int, num_classes: int, device: torch.device, mean, std):
        self.size, self.num_classes, self.device = image_size, num_classes, torch.device(device)
        self.gen = torch.Generator(device=self.device)
        # Pixels u in [0, 1) normalised as the loaders do: (u - mean) / std = u * scale + shift.
        std_t = torch.tensor(std, dtype=torch.float32).view(3, 1, 1)
        self.scale = (1.0 / std_t).to(self.device)
        self.shift = (-torch.tensor(mean, dtype=torch.float32).view(3, 1, 1) / std_t).to(self.device)

    def empty(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            torch.empty(batch_size, 3, self.size, self.size, dtype=torch.float32, device=self.device),
            torch.empty(batch_size, dtype=torch.int64, device=self.device),
        )

    def fill(self, images: torch.Tensor, labels: torch.Tensor, seed: int) -> None:
        self.gen.manual_seed(seed)
        images.uniform_(0.0, 1.0, generator=self.gen)
        labels.random_(0, self.num_classes, generator=self.gen)

    def normalise(self, images: torch.Tensor) -> torch.Tensor:
        return images.mul_(self.scale).add_(self.shift)


class SyntheticTrain:
    """Infinite stream of random training batches for one rank; exactly resumable (module docstring).

    ``next(loader)`` never raises StopIteration. ``state()`` is the position after the last batch
    returned; a loader built with ``state=``, an equal `TrainSpec` and the same rank and world size yields
    bitwise the same batches from there on (on the same device type)."""

    def __init__(self, spec: TrainSpec, *, rank: int, world_size: int, device: torch.device, state: str | None = None):
        self._maker = _Maker(spec.image_size, spec.num_classes, device, spec.mean, spec.std)
        begin, end = rank_slice(rank, world_size, spec.num_examples, "data.num_train_examples")
        self.num_examples_this_rank = end - begin
        self.spec, self.batch_size, self.seed, self.rank = spec, spec.batch_size, spec.seed, rank
        self._fingerprint = spec.fingerprint(rank, world_size)
        self._batches = self._decode_state(state) if state else 0

    def __iter__(self) -> SyntheticTrain:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = self._maker.empty(self.batch_size)
        self._maker.fill(images, labels, _seed("train", self.seed, self.rank, self._batches))
        self._batches += 1
        return self._maker.normalise(images), labels

    def state(self) -> str:
        """Opaque string; pass it back as ``state=`` to continue after the last batch returned."""
        return json.dumps(
            {"version": STATE_VERSION, "source": SOURCE, "fingerprint": self._fingerprint, "batches": self._batches}
        )

    def _decode_state(self, state: str) -> int:
        try:
            doc = json.loads(state)
            if not isinstance(doc, dict) or doc.get("source") != SOURCE:
                raise ValueError("not a synthetic loader state")
            batches = doc["batches"]
            if not isinstance(batches, int) or batches < 0 or not isinstance(doc["fingerprint"], str):
                raise ValueError(f"batches={batches!r}")
        except (ValueError, TypeError, KeyError, RecursionError) as e:
            raise UserError(
                f"SyntheticTrain state is not one SyntheticTrain.state() returned ({e}); resume from "
                "the checkpoint's data state or start without state"
            ) from None
        if doc["fingerprint"] != self._fingerprint:
            raise SettingsChanged(
                "SyntheticTrain state was saved with different settings (batch size, image size, classes, "
                "rank/world size, seed, mean/std); resume with the same settings or start without state"
            )
        return batches


class SyntheticVal:
    """One exact pass over this rank's slice of the fixed synthetic validation set per ``iter()``.

    The same interface and padding as `vitlarge.data.loader.ValLoader`: ``masked()`` yields
    `val_forwards` ``(images, labels, keep)`` batches on every rank (only the first ``keep`` rows
    are real; padding rows repeat the slice's last example), ``iter()`` the real rows only."""

    def __init__(self, spec: ValSpec, *, rank: int, world_size: int, device: torch.device):
        self._begin, self._end = rank_slice(rank, world_size, spec.num_examples, "data.synthetic_val_examples")
        self.num_examples_this_rank = self._end - self._begin
        self.spec, self.batch_size = spec, spec.batch_size
        self._forwards = val_forwards(spec.num_examples, world_size, spec.batch_size)
        self._maker = _Maker(spec.image_size, spec.num_classes, device, spec.mean, spec.std)

    def __len__(self) -> int:
        """Batches one pass yields (padding-only batches are not counted)."""
        return -(-self.num_examples_this_rank // self.batch_size)

    def __iter__(self):
        for images, labels, keep in self.masked():
            if keep > 0:
                yield images[:keep], labels[:keep]

    def masked(self):
        """One pass as ``(images, labels, keep)`` per batch: only the first ``keep`` rows are real."""
        for i in range(self._forwards):
            first = self._begin + i * self.batch_size
            keep = max(0, min(self.batch_size, self._end - first))
            images, labels = self._maker.empty(self.batch_size)
            for row in range(self.batch_size):  # one seed per example: the same image at any world/batch size
                example = min(first + row, self._end - 1)
                self._maker.fill(images[row], labels[row : row + 1], _seed("validation", example))
            yield self._maker.normalise(images), labels, keep
