"""Repeated augmentation (``data.repeats``): which training records a rank reads, and reading them by index.

DALI's TFRecord reader decides its own order (a file-order shuffle and a buffer), so it cannot deal one image
to several ranks. With ``repeats > 1`` the train pipeline takes its records from `RepeatedRecords` instead
(a DALI ``external_source``): the order is timm's ``RepeatAugSampler`` (DeiT's ``RASampler``) itself, and the
records are read from the shards at the offsets of their DALI index files.

Per epoch ``e`` timm's sampler permutes the ``n`` records (``torch.randperm`` seeded with the epoch key
``(seed * 0x9E3779B1 + e) mod 2**32``: with seed 0, exactly timm's ``set_epoch(e)``), repeats each ``repeats`` times in place
(``[a, a, a, b, b, b, ...]``) and deals the list round-robin over the ranks, so the copies of an image go to
consecutive ranks, in the same or the next step. Each rank keeps ``ceil(n / world)`` records per epoch, timm's
``selected_round=0``: an epoch is ``n`` images as without repeats, so the plan's steps per epoch
(``n // global_batch``), warmup and schedule do not depend on ``data.repeats`` (timm's default rounds the epoch
down to a multiple of 256 images, the batch of DeiT's GPUs; that would make the step count depend on it). An
epoch thus shows about ``n / repeats`` distinct images, each ``repeats`` times, as timm's and DeiT's do.

A rank's stream is its epochs one after another; its sample ``k`` is a pure function of ``k``. The pipeline asks
for samples by position (a sample-mode ``external_source``: DALI's ``SampleInfo.idx_in_epoch``, never reset, since
the source never ends an epoch), and DALI's checkpoint restores the position, so a resumed loader continues
exactly. The source is stateless apart from open files and cached orders, so DALI's parallel external source can
run it in worker processes (``data.read_workers``): the records are read and parsed off the training thread, and
the stream does not depend on how many workers read it. The copies are augmented independently: each rank's
pipeline has its own seed.
"""

from __future__ import annotations

import ctypes
import math
import os
import resource
import signal
import sys
from typing import TYPE_CHECKING, Any

import numpy as np
from google.protobuf.message import DecodeError
from tfrecord import example_pb2

from vitlarge.data.manifest import index_max_bytes, make_index_fix
from vitlarge.data.manifest_schema import TF_SLIM_FEATURES
from vitlarge.errors import UserError
from vitlarge.fileio import UnsafeFile, read_capped

if TYPE_CHECKING:
    from nvidia.dali.types import SampleInfo

OTHER_FILES = 1024  # descriptors left to everything else in the process (DALI, torch, the checkpoint), and
# two per rank (gloo's connections; rank 0 holds the rendezvous store's too)
FEWEST_OPEN = 64  # kept open at least, where the limit leaves less (the reader's first version kept 64)

# torch's CPU generator keeps 32 bits of a seed. An odd multiplier spreads the seeds over them: nearby seeds
# (a phase's seed + 1000) reach each other's epochs only after about 2**32 / 1000 of them.
EPOCH_KEY_MULTIPLIER = 0x9E3779B1


def epoch_key(seed: int, epoch: int) -> int:
    """What timm's sampler is ``set_epoch`` to for ``epoch`` of the stream seeded ``seed`` (seed 0: the epoch)."""
    return (seed * EPOCH_KEY_MULTIPLIER + epoch) % 2**32


def per_rank(num_examples: int, world_size: int) -> int:
    """Records a rank reads per epoch: ``ceil(n / world)`` (timm's ``num_selected_samples``, ``selected_round=0``)."""
    return math.ceil(num_examples / world_size)


def epoch_order(num_examples: int, rank: int, world_size: int, repeats: int, seed: int, epoch: int) -> list[int]:
    """The records rank ``rank`` reads in epoch ``epoch``, in order: timm's ``RepeatAugSampler`` (shuffled,
    ``num_repeats=repeats``, ``selected_round=0``) at ``epoch_key(seed, epoch)``."""
    from timm.data.distributed_sampler import RepeatAugSampler  # lazy: keeps timm off a run's pre-flight checks

    sampler = RepeatAugSampler(
        range(num_examples), num_replicas=world_size, rank=rank, num_repeats=repeats, selected_round=0
    )
    sampler.set_epoch(epoch_key(seed, epoch))
    return list(sampler)


def shard_files_to_keep_open(num_shards: int, world_size: int) -> int:
    """How many shard files a reader keeps open: all of them where the open-file limit allows. The stream's
    order takes nearly every record from another shard (ImageNet's 1024 shards kept 64 at a time: 240 opens
    and closes per batch of 256, each a metadata server round trip on Lustre or GPFS). The soft limit is
    raised toward the hard one, to the shards plus what the rest of the process needs (`reserved_files`);
    where it cannot be, the reader keeps what the limit leaves (`open_budget`), least recently used closed
    first. Idempotent: a later phase's reader finds the limit raised."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = num_shards + reserved_files(world_size)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        if target > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
            except (ValueError, OSError):
                pass
    return open_budget(num_shards, soft, world_size)


def reserved_files(world_size: int) -> int:
    """Descriptors left to the rest of a rank's process: `OTHER_FILES` and two per rank."""
    return OTHER_FILES + 2 * world_size


def open_budget(num_shards: int, soft_limit: int, world_size: int) -> int:
    """Shard files to keep open under an open-file ``soft_limit``: what it leaves after `reserved_files`, at
    least `FEWEST_OPEN`, at most all of them."""
    if soft_limit == resource.RLIM_INFINITY:
        return num_shards
    return min(num_shards, max(FEWEST_OPEN, soft_limit - reserved_files(world_size)))


def die_with_parent(parent: int) -> None:
    """End this process (SIGKILL) when process ``parent`` ends, however it ends, and not before: SIGUSR1 and
    SIGINT are ignored. DALI's read workers outlive
    a training process killed with SIGKILL or ended by ``os._exit`` otherwise: two orphans per rank after
    every preemption (measured). Linux's ``PR_SET_PDEATHSIG``; elsewhere nothing."""
    if not sys.platform.startswith("linux"):
        return

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent:  # it ended before the line above
        os._exit(1)
    # A preemption's SIGUSR1 reaches every process of a Slurm step (srun forwards it to all of them), and
    # Ctrl-C the whole process group: the training process checkpoints at its next step boundary and needs its
    # workers until then. They end with it. (SIGTERM stays: DALI stops its workers with it.)
    for s in (signal.SIGUSR1, signal.SIGINT):
        try:
            signal.signal(s, signal.SIG_IGN)
        except ValueError:  # not the worker's main thread
            pass


class IndexedRecords:
    """A split's records read by index: record ``k`` is the ``k``-th record of the shards' concatenation, read at
    the offset its DALI index gives. ``read(k)`` is ``(encoded JPEG, stored label)`` of the ``features`` named
    (``(image, label)``, the manifest's); a missing label reads as -1 and a missing image as empty bytes, as DALI's
    reader does (the loader then refuses the label).

    ``shards``: ``[(shard path, index path)]`` in the manifest's order. At most ``max_open`` shard files are kept
    open (`shard_files_to_keep_open`), least recently used closed first. Picklable: a copy (DALI's spawned read
    workers get one) opens its own files."""

    def __init__(self, shards, *, world_size: int, features: tuple[str, str] = TF_SLIM_FEATURES):
        self.features = features
        self._files: dict[int, int] = {}  # shard -> open descriptor, least recently used first (`max_open`)
        self._paths, offsets, sizes, owners = [], [], [], []
        for i, (path, index) in enumerate(shards):
            self._paths.append(path)
            # "offset size" per record; a record takes at least 16 bytes of its shard, so its index at most a line
            # for each 16 bytes (`shard_files` holds it to the manifest's count before this reads it)
            try:
                text = read_capped(index, index_max_bytes(os.path.getsize(path) // 16))
            except UnsafeFile as e:
                fix = make_index_fix(os.path.dirname(path))
                raise UserError(f"{index}: {e.strerror}; a stale or padded DALI index: run {fix}") from None
            table = np.array(text.split(), dtype=np.int64).reshape(-1, 2)
            offsets.append(table[:, 0])
            sizes.append(table[:, 1])
            owners.append(np.full(len(table), i, dtype=np.int64))
        self._offset, self._size, self._owner = (np.concatenate(a) for a in (offsets, sizes, owners))
        self.num_examples = len(self._offset)
        self.max_open = shard_files_to_keep_open(len(self._paths), world_size)  # workers inherit the raised limit

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_files"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _files={})

    def read(self, record: int) -> tuple[bytes, int]:
        owner = int(self._owner[record])
        fd = self._files.pop(owner, None)
        if fd is None:
            if len(self._files) >= self.max_open:
                os.close(self._files.pop(next(iter(self._files))))
            fd = os.open(self._paths[owner], os.O_RDONLY)
        self._files[owner] = fd  # (re)inserted last: the dict's order is the use order
        offset = int(self._offset[record])
        framed = os.pread(fd, int(self._size[record]), offset)
        try:
            # tfrecord's generated example_pb2 makes its message classes through globals(), which pyright cannot see
            features = example_pb2.Example.FromString(  # pyright: ignore[reportAttributeAccessIssue]
                memoryview(framed)[12:-4]
            ).features.feature  # length, crc, payload, crc
        except DecodeError as e:  # DALI's reader's words (`vitlarge.data.loader.BAD_RECORD` turns them into one line)
            raise ValueError(
                f"Error while parsing TFRecord file: {self._paths[owner]} at index {offset} (not an Example: {e})"
            ) from None
        image_key, label_key = self.features
        image = features[image_key].bytes_list.value if image_key in features else []
        label = features[label_key].int64_list.value if label_key in features else []
        return (image[0] if image else b""), (label[0] if label else -1)

    def close(self) -> None:
        for fd in getattr(self, "_files", {}).values():
            os.close(fd)
        self._files = {}

    __del__ = close  # a phase's loader is dropped at its end: its shard descriptors go with it


class RepeatedRecords(IndexedRecords):
    """DALI sample source of one rank's repeated-augmentation stream: sample ``k`` is ``(encoded JPEG, label [1]
    int64)`` of the ``k``-th record of the rank's stream, read by `IndexedRecords`. Two epochs' orders are kept
    in memory. Picklable (DALI's spawned workers get a copy without the open files and cached orders)."""

    def __init__(
        self,
        shards,
        *,
        rank: int,
        world_size: int,
        repeats: int,
        seed: int,
        features: tuple[str, str] = TF_SLIM_FEATURES,
    ):
        super().__init__(shards, world_size=world_size, features=features)
        self._orders: dict[int, list[int]] = {}
        self.rank, self.world_size, self.repeats, self.seed = rank, world_size, repeats, seed
        self.per_rank = per_rank(self.num_examples, world_size)

    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in super().__getstate__().items() if k != "_orders"}
        return state | {"_maker": os.getpid()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        maker = state.pop("_maker", None)
        super().__setstate__(state)
        self._orders = {}
        if maker is not None and maker != os.getpid():  # a DALI read worker, spawned by the training process
            die_with_parent(maker)

    def record_at(self, position: int) -> int:
        """The record index at ``position`` of this rank's stream."""
        epoch, k = divmod(position, self.per_rank)
        if epoch not in self._orders:
            self._orders = {e: o for e, o in self._orders.items() if e >= epoch - 1}
            self._orders[epoch] = epoch_order(
                self.num_examples, self.rank, self.world_size, self.repeats, self.seed, epoch
            )
        return self._orders[epoch][k]

    def __call__(self, info: SampleInfo) -> tuple[np.ndarray, np.ndarray]:
        image, label = self.read(self.record_at(info.idx_in_epoch))
        return np.frombuffer(image, dtype=np.uint8), np.array([label], dtype=np.int64)
