"""Torch-facing loaders over DALI pipelines: an infinite resumable train stream, exact validation.

Contract shared by both loaders: batches are ``(images, labels)`` with images float32
``[B, 3, S, S]`` normalized by ``mean``/``std`` (0..255 scale) and labels int64 ``[B]`` in
``0..num_classes-1``, both on ``device``. Stored labels minus the manifest's ``label_offset``
give the class; a label outside the range raises UserError (checked per batch with min/max).
Everything is rank-local: each rank reads its own slice of the split's records (see
``pipelines._reader`` for how the slices are chosen). On a GPU, DALI's output is copied into torch
on PyTorch's current stream of ``device``, so the copy is ordered with the surrounding torch work.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import shutil
import signal
import threading
from typing import TYPE_CHECKING

import torch
from nvidia.dali.plugin.pytorch import feed_ndarray
from nvidia.dali.types import DALIDataType

from vitlarge.data import dali_state, pipelines
from vitlarge.data.common import (  # noqa: F401
    STATE_VERSION,
    VAL_INTERPOLATION,
    SettingsChanged,
    check_rank,
    older_state_version,
    val_forwards,
)
from vitlarge.data.manifest import (
    MANIFEST_NAME,
    WDS_FORMAT,
    Manifest,
    convert_cmd,
    load_manifest,
    reindex_fix,
    shard_files,
)
from vitlarge.data.manifest_schema import TF_SLIM_FEATURES
from vitlarge.data.rect import RectBatches, val_sizes
from vitlarge.data.repeats import RepeatedRecords
from vitlarge.data.spec import LoaderSpec, TrainSpec, ValSpec, pipe_seed
from vitlarge.data.wds_shards import LABEL_MAX_BYTES, ascii_labels, record_keys
from vitlarge.errors import UserError

if TYPE_CHECKING:
    from nvidia.dali.pipeline import Pipeline
    from nvidia.dali.tensors import TensorListCPU, TensorListGPU

DEFAULT_MEAN, DEFAULT_STD = LoaderSpec("", 1, 1).pixels()  # ImageNet's on DALI's 0..255 pixel scale


def torch_stream(device: torch.device) -> torch.cuda.Stream | None:
    """The stream DALI must copy on so that torch sees the copy in order: None on the CPU."""
    return torch.cuda.current_stream(device) if device.type == "cuda" else None


class _Batches:
    """Copies DALI outputs into fresh torch tensors on ``device`` and maps labels to classes."""

    def __init__(self, manifest: Manifest, split: str, device: torch.device, label_offset: int | None):
        self.manifest, self.split, self.device = manifest, split, device
        self.label_offset = manifest.label_offset if label_offset is None else label_offset

    def convert(self, images, labels) -> tuple[torch.Tensor, torch.Tensor]:
        """``(images, labels)`` of one DALI batch as torch tensors on the device: labels are int64, or the
        webdataset reader's ``.cls`` bytes (uint8 ``[B, W]``), parsed here (`wds_shards.ascii_labels`)."""
        tar_labels = labels.dtype == DALIDataType.UINT8
        if tar_labels and not labels.is_dense_tensor():  # a .cls longer than the reader pads to
            raise self._no_integer()
        images, labels = images.as_tensor(), labels.as_tensor()
        if tar_labels and labels.shape()[1:] != [LABEL_MAX_BYTES]:  # every .cls of the batch that long
            raise self._no_integer()
        # The output tensor comes from torch's caching allocator, whose blocks are reused in the order
        # of torch's current stream: DALI's copy must be queued on that stream, not DALI's own.
        out = torch.empty(images.shape(), dtype=torch.float32, device=self.device)
        out = feed_ndarray(images, out, cuda_stream=torch_stream(self.device))
        if tar_labels:
            lab = ascii_labels(feed_ndarray(labels, torch.empty(labels.shape(), dtype=torch.uint8)))
        else:
            lab = feed_ndarray(labels, torch.empty(labels.shape(), dtype=torch.int64)).view(-1)
        lab = lab - self.label_offset
        lo, hi = int(lab.min()), int(lab.max())
        if self.manifest.format == WDS_FORMAT and lo + self.label_offset == -1:  # ascii_labels' "no integer"
            raise self._no_integer()
        d = self.manifest.data_dir
        if lo < 0 or hi >= self.manifest.num_classes:
            bad = lo if lo < 0 else hi
            raise UserError(
                f"{d}: stored label {bad + self.label_offset} in the {self.split} shards maps to class {bad}, "
                f"outside 0..{self.manifest.num_classes - 1} (num_classes {self.manifest.num_classes}, label offset "
                f"{self.label_offset}); fix num_classes/label_offset in {d}/{MANIFEST_NAME} or rerun "
                f"{reindex_fix(self.manifest)} --label-offset N --num-classes C"
            )
        return out, lab.to(self.device, non_blocking=True)

    def _no_integer(self) -> UserError:
        return UserError(
            f"{self.manifest.data_dir}: a .cls that is no integer: the tar changed since make_index; rerun "
            f"{reindex_fix(self.manifest)}, which names the sample"
        )


SHM = "/dev/shm"  # where DALI's parallel external source passes batches
SHM_LOW_MIB = 256  # below this much free there, a stopped read worker is put down to /dev/shm


def ended_read_workers(pipe: Pipeline) -> list[tuple[int, int]]:
    """``(pid, exit code)`` of the pipeline's read workers (DALI's parallel external source) that have ended; a
    negative code is the signal that ended it. DALI stops the pool when one ends, but its next ``run()`` can
    wait forever on the lost worker (seen when one was killed between two batches), so the loader asks first.
    DALI keeps the processes in ``Pipeline._py_pool.pool._processes`` (multiprocessing processes);
    tests/unit/data/test_repeats.py kills a worker, so a DALI that moves them fails there."""
    processes = getattr(getattr(getattr(pipe, "_py_pool", None), "pool", None), "_processes", None) or []
    return [(p.pid, p.exitcode) for p in processes if p.exitcode is not None]


def read_workers_error(manifest: Manifest, ended: list[tuple[int, int]]) -> Exception:
    """What to say when the read workers stopped. /dev/shm too small for their batches is bad input with a fix
    (a `UserError`): a worker that touches a page tmpfs cannot give dies of SIGBUS, or, with little free there,
    exits with an error or is stopped before its end is seen. A worker killed otherwise (SIGKILL: the kernel's
    OOM killer) is a `RuntimeError` naming it. DALI ends the other workers with SIGTERM once one has
    ended, so the worker named is one not ended by DALI."""
    free = shutil.disk_usage(SHM).free / 2**20 if os.path.isdir(SHM) else 0
    ours = [(pid, code) for pid, code in ended if code != -signal.SIGTERM] or ended
    signals = {-code for _, code in ours if code < 0}
    if signal.SIGBUS in signals or (free < SHM_LOW_MIB and not signals):
        return UserError(
            f"{manifest.data_dir}: the read workers (data.read_workers) stopped: they pass each batch of records "
            f"through {SHM}, which has {free:.0f} MiB free; give it more (docker run --shm-size=8g, as for "
            "torch's DataLoader) or set data.read_workers=0"
        )
    if not ours:
        return RuntimeError(
            f"{manifest.data_dir}: the read workers (data.read_workers) stopped with no worker seen to end and "
            f"{free:.0f} MiB free in {SHM}; data.read_workers=0 reads the records in the training process"
        )
    pid, code = next(((p, c) for p, c in ours if c < 0), ours[0])
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:  # a real-time signal has no name
            name = f"signal {-code}"
        how = f"was killed by {name}"
    else:
        how = f"exited with status {code}"
    hint = " (the kernel's OOM killer? see dmesg)" if -code == signal.SIGKILL else ""
    return RuntimeError(
        f"{manifest.data_dir}: read worker {pid} (data.read_workers) {how}{hint}; each worker holds about 400 MB: "
        "fewer workers, or data.read_workers=0 reads the records in the training process"
    )


# DALI's TFRecord parser names the record it could not parse this way (its tfrecord_parser.h: a length header past
# the record, or a payload that is no Example); `vitlarge.data.repeats.RepeatedRecords` writes the same words.
BAD_RECORD = re.compile(
    r"Error while parsing TFRecord file: (?P<file>.+?) at index (?P<offset>\d+) \((?P<why>[^)\n]*)\)"
)


def _run(
    pipe: Pipeline, manifest: Manifest, split: str, device: torch.device
) -> tuple[TensorListCPU | TensorListGPU, ...]:
    """``pipe.run()``; an image DALI cannot decode becomes a one-line UserError with the fix.

    On a GPU the outputs are bound to torch's current stream (DALI's default execution model): their
    buffers are then released in that stream's order, after the copy `_Batches.convert` queues there.
    Host-synchronous outputs could be reused by DALI's next iteration while that copy still waits
    behind the previous micro-step's backward."""
    stream = torch_stream(device)
    try:
        return pipe.run(stream) if stream is not None else pipe.run()
    except Exception as e:  # DALI's RuntimeError; a sample source's own error (ValueError; from a worker, Exception)
        text = str(e)
        record = BAD_RECORD.search(text)
        if record is not None:  # the reader's (or `RepeatedRecords`'s) parse of a record that passed the index
            raise UserError(
                f"{record['file']}: the record at byte {record['offset']} is not a tf.train.Example with an image and "
                f"a label ({record['why']}); re-copy or re-convert this shard ({reindex_fix(manifest)} "
                "reads every record and names each bad one)"
            ) from None
        if not isinstance(e, RuntimeError):
            raise
        if "Worker data receiving interrupted" in text:  # DALI's parallel external source (data.read_workers)
            raise read_workers_error(manifest, ended_read_workers(pipe)) from None
        if "fn.readers.tfrecord" in text:  # a record the parser took whose features are not one image and one label
            reason = text.partition("encountered:")[2].strip().splitlines()[:1] or ["reader error"]
            raise UserError(
                f"{manifest.data_dir}: a record of the {split} shards holds no image and single integer label DALI "
                f"can batch ({reason[0].rpartition(' failed: ')[2][:200]}); {reindex_fix(manifest)} "
                "reads every record and names each bad one: re-copy or re-convert its shard"
            ) from None
        if "readers.webdataset" in text:  # a tar that changed under its index (make_index checked each sample)
            reason = text.partition("encountered:")[2].strip().splitlines()[:1] or ["reader error"]
            raise UserError(
                f"{manifest.data_dir}: a sample of the {split} tars cannot be read ({reason[0][:200]}); "
                f"{reindex_fix(manifest)} reads every sample and names each bad one"
            ) from None
        if "decoders." not in text:
            raise
        lines = [ln.strip() for ln in text.splitlines() if ln.strip() and "no longer valid" not in ln]
        d = manifest.data_dir
        fix = f"re-convert the source with {convert_cmd()} --check decode --skip-bad"
        if manifest.format == WDS_FORMAT or manifest.features != TF_SLIM_FEATURES:  # read in place: no source here
            holder = "tar" if manifest.format == WDS_FORMAT else "shard"
            fix = f"re-write or re-download the {holder} that holds it, then rerun {reindex_fix(manifest)}"
        raise UserError(
            f"{d}: an image in the {split} shards cannot be decoded ({lines[-1] if lines else 'decoder error'}); {fix}"
        ) from None


class TrainLoader:
    """Infinite stream of augmented training batches for one rank; exactly resumable.

    Built from a `TrainSpec` (its fields are named below). ``next(loader)`` never raises
    StopIteration: the reader wraps over epochs. Every epoch the order of the shard files is
    permuted with ``seed`` (the phase's stream seed: the same value on every rank) and each rank reads its contiguous slice of the records in that order, shuffled
    through a buffer of ``initial_fill`` records; so each epoch is a fresh order on every rank and
    the ranks together read every record exactly once per epoch (``num_examples_this_rank``
    records each). With ``repeats > 1`` the records come instead in timm's ``RepeatAugSampler``
    order (`vitlarge.data.repeats`: each epoch's selected images ``repeats`` times, their copies
    dealt to consecutive ranks, ``ceil(n / world_size)`` records per rank and epoch), read by
    ``read_workers`` processes (DALI's parallel external source; 0: in the calling thread; the stream
    is the same either way). Augmentation: random-resized crop (area ``crop_scale``, aspect ``crop_ratio``) decoded straight
    from the JPEG and resized to ``image_size``, or with ``crop="src"`` DeiT III's simple random
    crop; horizontal flip; optional RandAugment (timm's ``"rand-m9-n2"`` strings, see
    ``randaugment.py``), DeiT III's 3-Augment (``three_augment``) and colour jitter of strength
    ``color_jitter`` (0: off; see ``deit_augment.py``); normalize. Per-rank
    augmentation streams are derived from ``seed`` and ``rank``. ``state()`` is the DALI checkpoint
    after the last batch returned; a loader built with ``state=``, an equal spec and the same rank and
    world size yields bitwise the same batches from there on (`TrainSpec.fingerprint` ties them).
    """

    def __init__(self, spec: TrainSpec, *, rank: int, world_size: int, device: torch.device, state: str | None = None):
        check_rank(rank, world_size)
        data_dir, seed, read_workers = spec.data_dir, spec.seed, spec.read_workers
        self.spec = spec
        self.manifest = load_manifest(data_dir)
        files = shard_files(self.manifest, "train")
        n = self.manifest.num_examples("train")
        begin, end = pipelines.shard_range(n, rank, world_size)
        self.num_examples_this_rank = end - begin
        if self.num_examples_this_rank < 1:
            raise UserError(f"{data_dir}: {n} training examples cannot be split over world_size={world_size}")
        self._records = None
        if self.manifest.format == WDS_FORMAT and spec.repeats > 1:
            raise UserError(
                f"{data_dir}: data.repeats={spec.repeats} reads TFRecord shards by index, and this folder holds "
                f"WebDataset tars; set data.repeats=1, or convert the images to TFRecords ({convert_cmd()})"
            )
        self._read_workers = read_workers if spec.repeats > 1 else 0
        if self._read_workers and threading.current_thread() is not threading.main_thread():
            # The workers die with the thread that starts them (PR_SET_PDEATHSIG follows the parent thread).
            raise RuntimeError("a TrainLoader with read_workers > 0 must be built in the main thread")
        if spec.repeats > 1:
            features = self.manifest.features
            self._records = RepeatedRecords(
                files, rank=rank, world_size=world_size, repeats=spec.repeats, seed=seed, features=features
            )
            self.num_examples_this_rank = self._records.per_rank
        self._batches = _Batches(self.manifest, "train", device, spec.label_offset)
        dev = pipelines.dali_device(device)
        shards = [(s.file, s.bytes) for s in self.manifest.shards("train")]
        self._fingerprint = spec.fingerprint(rank, world_size, shards)
        # The most records a rank's reader returns in an epoch (DALI's largest shard): what a state's age may reach.
        self._records_per_epoch = math.ceil(n / world_size)
        checkpoint = self._decode_state(state, data_dir) if state else None
        # DALI's RandAugment uses fn.experimental aliases DALI itself deprecates; DALI forces those
        # DeprecationWarnings on (its own catch_warnings), so they print once per build. Harmless.
        self._pipe = pipelines.train_pipeline(
            spec,
            files,
            shard_id=rank,
            num_shards=world_size,
            decoder=dev.decoder,
            records=self._records,
            read_workers=self._read_workers,
            features=record_keys(self.manifest),
            batch_size=spec.batch_size,
            num_threads=spec.num_threads,
            device_id=dev.device_id,
            seed=pipe_seed(seed, rank),  # distinct buffer and augmentation streams per rank
            prefetch_queue_depth=spec.prefetch_queue_depth,
            enable_checkpointing=True,
            checkpoint=checkpoint,
            # Spawned, not forked: the parent may hold a CUDA context and the process group's threads.
            **(dict(py_num_workers=self._read_workers, py_start_method="spawn") if self._read_workers else {}),
        )
        try:
            self._pipe.build()
        except (RuntimeError, ValueError) as e:  # UnicodeDecodeError from a junk string inside the checkpoint
            if checkpoint is None:
                raise
            # DALI parses the bytes while it builds: a damaged or crafted state fails there, as a protobuf assert.
            raise UserError(
                f"{data_dir}: TrainLoader state holds no DALI checkpoint of this pipeline "
                f"({str(e).splitlines()[0][:120]}); resume another checkpoint or start without state"
            ) from None

    def __iter__(self) -> TrainLoader:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._read_workers:
            ended = ended_read_workers(self._pipe)
            if ended:
                raise read_workers_error(self.manifest, ended)
        images, labels = _run(self._pipe, self.manifest, "train", self._batches.device)
        return self._batches.convert(images, labels)

    def state(self) -> str:
        """Opaque string; pass it back as ``state=`` to continue after the last batch returned."""
        return json.dumps(
            {
                "version": STATE_VERSION,
                "fingerprint": self._fingerprint,
                "dali": base64.b64encode(self._pipe.checkpoint()).decode("ascii"),
            }
        )

    def _decode_state(self, state: str, data_dir: str) -> bytes:
        """The DALI checkpoint inside ``state``; UserError for anything ``state()`` did not make."""
        try:
            doc = json.loads(state)
            if not isinstance(doc, dict):
                raise ValueError(f"a JSON {type(doc).__name__}, not an object")
            missing = sorted({"version", "fingerprint", "dali"} - set(doc))
            if missing:
                raise ValueError(f"missing {', '.join(missing)}")
            if doc["version"] != STATE_VERSION:
                raise ValueError(f"version {doc['version']!r}, this vitlarge writes {STATE_VERSION}")
            if not isinstance(doc["fingerprint"], str) or not isinstance(doc["dali"], str):
                raise ValueError("fingerprint and dali must be strings")
            blob = base64.b64decode(doc["dali"], validate=True)
        except (ValueError, TypeError, RecursionError) as e:  # json and base64 errors are ValueErrors
            raise UserError(
                f"{data_dir}: TrainLoader state is not one TrainLoader.state() returned ({e}); "
                "resume from the checkpoint's data state or start without state"
            ) from None
        if doc["fingerprint"] != self._fingerprint:
            raise SettingsChanged(
                f"{data_dir}: TrainLoader state was saved with different data or loader settings (shards, batch "
                "size, image size, rank/world size, seed or augmentation); resume with the same settings or start "
                "without state"
            )
        why = dali_state.problem(
            blob, reader=pipelines.READER, records_per_epoch=self._records_per_epoch, batch_size=self.spec.batch_size
        )
        if why is not None:  # before DALI replays it while the pipeline builds (holding the GIL: deaf to signals)
            raise UserError(
                f"{data_dir}: TrainLoader state holds no DALI checkpoint of this pipeline ({why}); "
                "resume another checkpoint or start without state"
            )
        return blob


class ValLoader:
    """One exact pass over this rank's slice of the validation split per ``iter()``.

    Every validation record is yielded exactly once per pass across ranks, for any world size,
    batch size and number of passes. DALI pads each rank's slice to the largest rank's size
    (``ceil(n / world_size)``) and then to whole batches, by repeating the slice's last record; a
    pass therefore takes ``ceil(padded / batch_size)`` runs of the pipeline, where ``padded`` comes
    from DALI's own reader metadata (``epoch_size_padded``). All of them are consumed, so the next
    pass starts at the first record, and only the rank's ``num_examples_this_rank`` real records
    are yielded: the last real batch may be short, and runs that hold only padding yield nothing.
    A pass abandoned early is drained first.

    ``masked()`` is the same pass as ``(images, labels, keep)`` for every run, padding-only runs
    included (``keep`` 0, a full batch of repeated records): the same number of batches on every
    rank (`val_forwards`), which a sharded model needs, since each of its forwards is collective.

    With ``spec.rect_val`` the batches are rectangular validation's (`vitlarge.data.rect`): chunks of
    ``batch_size`` consecutive records of the aspect-sorted split, dealt round robin, each cropped to its
    mean aspect ratio (``rect``: True; the image shape then varies from batch to batch). The count per
    pass, the padding and ``keep`` follow the same rule, and a pass is the same images, cropped alike, at
    any world size.
    """

    def __init__(self, spec: ValSpec, *, rank: int, world_size: int, device: torch.device):
        check_rank(rank, world_size)
        data_dir, batch_size = spec.data_dir, spec.batch_size
        self.spec, self.rect = spec, spec.rect_val
        self.manifest = load_manifest(data_dir)
        files = shard_files(self.manifest, "validation")
        n = self.manifest.num_examples("validation")
        rect = None
        if spec.rect_val:
            rect = RectBatches(
                files,
                val_sizes(self.manifest),
                rank=rank,
                world_size=world_size,
                batch_size=batch_size,
                image_size=spec.image_size,
                patch=spec.patch_size,
                features=record_keys(self.manifest),
            )
            self.num_examples_this_rank = rect.num_examples_this_rank  # 0 where the chunks run out before this rank
        else:
            begin, end = pipelines.shard_range(n, rank, world_size)
            self.num_examples_this_rank = end - begin
            if self.num_examples_this_rank < 1:
                raise UserError(f"{data_dir}: {n} validation examples cannot be split over world_size={world_size}")
        self.batch_size = batch_size
        self._batches = _Batches(self.manifest, "validation", device, spec.label_offset)
        dev = pipelines.dali_device(device)
        self._pipe = pipelines.val_pipeline(
            spec,
            files,
            shard_id=rank,
            num_shards=world_size,
            decoder=dev.decoder,
            batches=rect,
            features=record_keys(self.manifest),
            batch_size=batch_size,
            num_threads=spec.num_threads,
            device_id=dev.device_id,
            seed=0,
        )
        self._pipe.build()
        if rect is not None:
            self._runs_per_pass = rect.runs  # val_forwards, by its construction
        else:
            padded = self._pipe.reader_meta(pipelines.READER)["epoch_size_padded"] // world_size  # records per rank
            self._runs_per_pass = math.ceil(padded / batch_size)
            if self._runs_per_pass != val_forwards(n, world_size, batch_size):  # DALI's padding rule changed
                raise RuntimeError(
                    f"DALI pads {n} validation records over {world_size} ranks to {padded} per rank: "
                    f"{self._runs_per_pass} runs, vitlarge.data.loader.val_forwards expects "
                    f"{val_forwards(n, world_size, batch_size)}"
                )
        self._runs_in_pass = 0  # runs of the current pass already taken from the pipeline

    def __len__(self) -> int:
        """Batches one pass yields (padding-only runs are not counted)."""
        return math.ceil(self.num_examples_this_rank / self.batch_size)

    def __iter__(self):
        for images, labels, keep in self.masked():
            if keep > 0:
                yield images[:keep], labels[:keep]

    def masked(self):
        """One pass as ``(images, labels, keep)`` per pipeline run: only the first ``keep`` rows are real."""
        while 0 < self._runs_in_pass < self._runs_per_pass:  # finish an abandoned pass
            _run(self._pipe, self.manifest, "validation", self._batches.device)
            self._runs_in_pass += 1
        self._runs_in_pass = 0
        for i in range(self._runs_per_pass):
            images, labels = _run(self._pipe, self.manifest, "validation", self._batches.device)
            self._runs_in_pass += 1
            keep = max(0, min(self.batch_size, self.num_examples_this_rank - i * self.batch_size))
            yield (*self._batches.convert(images, labels), keep)
        self._runs_in_pass = 0
