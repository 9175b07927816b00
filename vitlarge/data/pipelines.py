"""DALI pipeline definitions for training and validation over TFRecord shards and WebDataset tars.

Both pipelines read each record's image and label features (TF-slim's ``image/encoded`` and ``image/class/label``,
or those the manifest names: TFDS's ``image`` and ``label``, `vitlarge.data.manifest.Manifest.features`) and return
``(images float32 [B,3,S,S] normalized, labels int64 [B,1] as stored)`` (rectangular validation:
``[B,3,H,W]``, one ``H x W`` per batch; a tar's labels: its ``.cls`` bytes, uint8 ``[B,16]``, `_tar_reader`);
images live on the DALI device (CPU or GPU), labels always on the CPU. The device is chosen once, in ``dali_device``; everything below is the same code for both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict, cast

import nvidia.dali.fn as fn
import nvidia.dali.math as dmath
import nvidia.dali.tfrecord as tfrec
import nvidia.dali.types as types
import torch
from nvidia.dali import pipeline_def

from vitlarge.data import deit_augment
from vitlarge.data import randaugment as rand_augment
from vitlarge.data.common import shard_range  # noqa: F401 (the readers' rank slices; loaders import it from here)
from vitlarge.data.manifest_schema import TF_SLIM_FEATURES
from vitlarge.data.spec import TrainSpec, ValSpec, pipe_seed
from vitlarge.data.wds_shards import LABEL_MAX_BYTES, TAR_MEMBERS
from vitlarge.errors import UserError

if TYPE_CHECKING:
    import torch
    from nvidia.dali.data_node import DataNode
    from nvidia.dali.pipeline import Pipeline

    from vitlarge.data.rect import RectBatches
    from vitlarge.data.repeats import RepeatedRecords

FEATURES = {
    "image/encoded": tfrec.FixedLenFeature([], tfrec.string, ""),
    "image/class/label": tfrec.FixedLenFeature([1], tfrec.int64, -1),
}  # TF-slim's names (`TF_SLIM_FEATURES`); `_features` gives the same two for the names a manifest lists


def _features(names: tuple[str, str]) -> dict:
    """The reader's features for ``(image, label)`` feature names: encoded bytes and one int64."""
    image, label = names
    return {image: FEATURES["image/encoded"], label: FEATURES["image/class/label"]}


READER = "Reader"  # reader op name, for reader_meta()
READ_AHEAD = 2  # batches of records the read workers prepare ahead (DALI's parallel external source)


@dataclass(frozen=True)
class DaliDevice:
    """Where a pipeline runs: ``device_id`` None means CPU-only DALI (CPU operators only)."""

    device_id: int | None
    decoder: str  # "cpu" or "mixed" (nvJPEG, output on the GPU)


def dali_device(device: torch.device) -> DaliDevice:
    """The one place a torch.device becomes DALI settings."""
    if device.type == "cuda":
        return DaliDevice(device.index if device.index is not None else torch.cuda.current_device(), "mixed")
    if device.type == "cpu":
        return DaliDevice(None, "cpu")
    raise UserError(f"device {device}: DALI loaders support 'cpu' and 'cuda' devices; pass one of those")


class _ReadOrder(TypedDict, total=False):
    """The reader's order options, by DALI's names and types."""

    random_shuffle: bool
    initial_fill: int
    shuffle_after_epoch: bool
    shuffle_after_epoch_seed: int
    stick_to_shard: bool
    pad_last_batch: bool


class _Prefetch(TypedDict, total=False):
    prefetch_queue_depth: int


class _HwLoad(TypedDict, total=False):
    hw_decoder_load: float


HW_DECODER_LOAD = 0.65
"""DALI's own default ``hw_decoder_load`` (``data.hw_decoder_load``'s): passed only when a run sets another."""


def _reader(
    files: list[tuple[str, str]],
    *,
    shard_id: int,
    num_shards: int,
    seed: int,
    training: bool,
    initial_fill: int = 1,
    file_order_seed: int = 0,
    features: tuple[str, str] = TF_SLIM_FEATURES,
) -> tuple[DataNode, DataNode]:
    """The TFRecord reader both pipelines share: ``(encoded image, label)`` of the ``features`` named;
    ``training`` picks the sample order.

    Training: every epoch the reader permutes the order of the shard files with
    ``file_order_seed`` (which must be the same on every rank) and each rank reads its contiguous
    slice of the records in that order (``shuffle_after_epoch``), so a rank sees a different part
    of the data, in a different order, every epoch, and the ranks still partition every epoch.
    A buffer of ``initial_fill`` records (seeded per rank by ``seed``) shuffles within that.
    Validation: each rank keeps its slice in stored order; DALI pads the slice to the largest
    rank's size and then to whole batches (``pad_last_batch``), the loader drops the padding.
    ``features`` `vitlarge.data.wds_shards.TAR_MEMBERS`: ``files`` are WebDataset tars and their DALI indexes
    (`_tar_reader`), read in the same order.
    """
    order: _ReadOrder
    if training:
        order = _ReadOrder(
            random_shuffle=True,
            initial_fill=initial_fill,
            shuffle_after_epoch=True,
            shuffle_after_epoch_seed=file_order_seed,
            stick_to_shard=False,
        )
    else:
        order = _ReadOrder(random_shuffle=False, stick_to_shard=True, pad_last_batch=True)
    if features == TAR_MEMBERS:
        return _tar_reader(files, shard_id=shard_id, num_shards=num_shards, seed=seed, order=order)
    # DALI's stub types every reader's result as `DataNode | Sequence[DataNode] | None`; tfrecord's is a dict by feature
    data = cast(
        "dict[str, DataNode]",
        fn.readers.tfrecord(
            path=[f for f, _ in files],
            index_path=[i for _, i in files],
            features=_features(features),
            shard_id=shard_id,
            num_shards=num_shards,
            seed=seed,
            name=READER,
            # DALI's stub of readers.tfrecord leaves out shuffle_after_epoch(_seed), which the reader takes
            **order,  # pyright: ignore[reportCallIssue]
        ),
    )
    return data[features[0]], data[features[1]]


def _tar_reader(
    files: list[tuple[str, str]], *, shard_id: int, num_shards: int, seed: int, order: _ReadOrder
) -> tuple[DataNode, DataNode]:
    """WebDataset tars in timm's layout through ``fn.readers.webdataset``: the image member (``jpg``, ``jpeg``,
    ``png`` or ``webp``) and the label, the ``.cls`` member's bytes padded with spaces to `LABEL_MAX_BYTES` (a
    longer one stays longer), which the loader parses per batch (`vitlarge.data.wds_shards.ascii_labels`): one
    operator here, where parsing in the pipeline takes ~20 a batch, a third of the reader's time on small images
    (docs/PERFORMANCE.md section 15). The reader takes the same order options, pads alike and checkpoints the same
    loader state, so the loaders and `vitlarge.data.dali_state` treat both readers as one. ``make_index`` checked
    that every sample has one image and one integer label; a sample without either fails here rather than yield
    an empty one."""
    encoded, raw = cast(
        "list[DataNode]",
        fn.readers.webdataset(
            paths=[f for f, _ in files],
            index_paths=[i for _, i in files],
            ext=list(TAR_MEMBERS),
            missing_component_behavior="error",
            shard_id=shard_id,
            num_shards=num_shards,
            seed=seed,
            name=READER,
            **order,
        ),
    )
    return encoded, fn.pad(raw, fill_value=32, shape=[LABEL_MAX_BYTES])


def train_pipeline(spec: TrainSpec, files: list[tuple[str, str]], **kwargs) -> Pipeline:
    """`train_graph` as a DALI pipeline (``kwargs``: its own and `Pipeline`'s), built with DALI's conditionals only
    where ``spec`` needs them (`needs_conditionals`). Conditionals make AutoGraph rewrite the graph's code
    (the demo's: 1.4 s of CPU in a process's first build, on the first step's path; AMD EPYC); the others are the
    same graph either way, serialized and checkpointed byte for byte (tests/e2e/test_dali_long.py)."""
    make = _train_conditional if needs_conditionals(spec) else _train_plain
    return make(spec, files, **kwargs)


def needs_conditionals(spec: TrainSpec) -> bool:
    """Whether the training graph of ``spec`` is built with DALI's conditionals: it branches per sample (RandAugment,
    3-Augment, colour jitter), or crops as DeiT III does (``src``: AutoGraph rewrites its arithmetic into another
    graph, whose checkpoints a run built without it would not read). The others are the random-resized crop, with or
    without the flip and repeats, the same graph either way."""
    randaugment = rand_augment.spec(spec.randaugment)
    return randaugment is not None or spec.three_augment or spec.color_jitter > 0 or spec.crop != "rrc"


def train_graph(
    spec: TrainSpec,
    files: list[tuple[str, str]],
    *,
    shard_id: int,
    num_shards: int,
    decoder: str,
    records: RepeatedRecords | None = None,
    read_workers: int = 0,
    features: tuple[str, str] = TF_SLIM_FEATURES,
) -> tuple[DataNode, DataNode]:
    """Training images of ``spec`` (`vitlarge.data.spec.TrainSpec`) from ``files`` (``(shard, index)`` paths):
    ``spec.crop`` (``rrc``: random-resized crop; ``src``: DeiT III's simple random crop), flip, then RandAugment,
    3-Augment and colour jitter where asked (`vitlarge.data.deit_augment`); rank ``shard_id`` of ``num_shards``.
    ``records``: a batch source of ``(encoded, label)`` by iteration (`vitlarge.data.repeats.RepeatedRecords`,
    repeated augmentation) read instead of the TFRecord reader's own order, by ``read_workers`` processes (0: in
    the thread that runs the pipeline). The pipeline is then built with ``py_num_workers=read_workers``.
    ``features``: the records' (image, label) feature names (the manifest's; `vitlarge.data.wds_shards.TAR_MEMBERS`:
    WebDataset tars, `_tar_reader`)."""
    image_size, interp = spec.image_size, interp_type(spec.interpolation)
    randaugment = rand_augment.spec(spec.randaugment)
    mean, std = spec.pixels()
    if records is not None:
        # Sample mode: DALI asks for stream positions (SampleInfo.idx_in_epoch) and its checkpoint restores
        # them, so a resume continues exactly; `read_workers` processes read them (parallel external source).
        encoded, label = fn.external_source(
            source=records,
            num_outputs=2,
            batch=False,
            parallel=read_workers > 0,
            **(_Prefetch(prefetch_queue_depth=READ_AHEAD) if read_workers > 0 else _Prefetch()),
            dtype=[types.DALIDataType.UINT8, types.DALIDataType.INT64],
        )
    else:
        encoded, label = _reader(
            files,
            shard_id=shard_id,
            num_shards=num_shards,
            seed=pipe_seed(spec.seed, shard_id),
            training=True,
            initial_fill=spec.initial_fill,
            file_order_seed=spec.seed % (2**31 - 1),  # one file order for all ranks
            features=features,
        )
    hw = _HwLoad(hw_decoder_load=spec.hw_decoder_load) if spec.hw_decoder_load != HW_DECODER_LOAD else _HwLoad()
    if spec.crop == "src":  # the whole image, shorter side to image_size (antialiased, as PIL's resize)
        images = fn.decoders.image(encoded, device=decoder, output_type=types.DALIImageType.RGB, **hw)
        resized = deit_augment.src_size(fn.peek_image_shape(encoded), image_size)
        offsets = deit_augment.draw_src_offsets(resized, image_size, spec.src_padding)
        images = deit_augment.src_crop(images, resized, offsets, image_size, interp, spec.src_padding)
    elif spec.rrc_decode == "full":  # the whole image, then the random-resized crop on the pipeline's device
        images = fn.decoders.image(encoded, device=decoder, output_type=types.DALIImageType.RGB, **hw)
        images = cast(
            "DataNode",
            fn.random_resized_crop(
                images,
                size=[image_size, image_size],
                random_area=list(spec.crop_scale),
                random_aspect_ratio=list(spec.crop_ratio),
                num_attempts=10,
                interp_type=interp,
                antialias=False,
            ),
        )
    else:
        # Decodes only the random crop window (ROI decode), so the full image is never materialized.
        images = fn.decoders.image_random_crop(
            encoded,
            device=decoder,
            output_type=types.DALIImageType.RGB,
            random_area=list(spec.crop_scale),
            random_aspect_ratio=list(spec.crop_ratio),
            num_attempts=10,
            **hw,
        )
        # antialias=False saves ~15% of the CPU pipeline's time (benchmarks/bench_data.py). Even so,
        # DALI's CPU bilinear resize costs about as much as the JPEG decode; interp "nearest" is ~8x
        # cheaper (TrainSpec(interpolation="nearest")) at the price of aliasing. GPUs don't care.
        # resize's stub allows a second output (save_attrs); without it there is one DataNode
        images = cast("DataNode", fn.resize(images, size=[image_size, image_size], interp_type=interp, antialias=False))
    mirror = fn.random.coin_flip(probability=0.5) if spec.hflip else 0
    if randaugment is not None:
        if spec.hflip:  # RandAugment must see the flipped image, as in timm (flip, then RandAugment)
            images = fn.flip(images, horizontal=mirror)
            mirror = 0
        images = rand_augment.apply(images, randaugment, [image_size, image_size])
    # Grayscale, solarize, blur and colour jitter commute with the flip, which therefore stays with
    # the normalization below (DeiT flips first).
    if spec.three_augment:
        images = deit_augment.three_augment(images, *deit_augment.draw_three_augment())
    if spec.color_jitter > 0:
        images = deit_augment.jitter(images, *deit_augment.draw_jitter(float(spec.color_jitter)))
    images = fn.crop_mirror_normalize(
        images,
        dtype=types.DALIDataType.FLOAT,
        output_layout="CHW",
        mean=list(mean),
        std=list(std),
        mirror=mirror,
    )
    return images, label


_train_conditional = pipeline_def(enable_conditionals=True)(train_graph)
_train_plain = pipeline_def(train_graph)


@pipeline_def
def val_pipeline(
    spec: ValSpec,
    files: list[tuple[str, str]],
    *,
    shard_id: int,
    num_shards: int,
    decoder: str,
    batches: RectBatches | None = None,
    features: tuple[str, str] = TF_SLIM_FEATURES,
) -> tuple[DataNode, DataNode]:
    """Validation images of ``spec`` (`vitlarge.data.spec.ValSpec`) from ``files``, in stored order: rank
    ``shard_id``'s slice, square crops. ``batches``: rectangular validation's source instead
    (`vitlarge.data.rect.RectBatches`: its records and each batch's crop, ``spec.rect_val``). ``features``: the
    records' (image, label) feature names (the manifest's; `vitlarge.data.wds_shards.TAR_MEMBERS`: WebDataset tars,
    `_tar_reader`)."""
    image_size, interp = spec.image_size, interp_type(spec.interpolation)
    mean, std = spec.pixels()
    shorter = float(int(image_size / spec.crop_pct))  # timm's eval transform: the shorter side to this, then a crop
    if batches is None:
        encoded, label = _reader(
            files, shard_id=shard_id, num_shards=num_shards, seed=0, training=False, features=features
        )
        crop = _Crop(crop=(image_size, image_size))
        resize_shorter: float | DataNode = shorter
    else:
        encoded, label, crop_h, crop_w = fn.external_source(
            source=batches,
            num_outputs=4,
            batch=True,
            batch_info=True,
            dtype=[
                types.DALIDataType.UINT8,
                types.DALIDataType.INT64,
                types.DALIDataType.FLOAT,
                types.DALIDataType.FLOAT,
            ],
        )
        # "pad" never pads (`_covering` scales every image over its crop); it is there so that a rounding
        # difference of a DALI version costs an edge pixel, not the evaluation.
        crop = _Crop(crop_h=crop_h, crop_w=crop_w, out_of_bounds_policy="pad")
        resize_shorter = _covering(
            fn.peek_image_shape(encoded, dtype=types.DALIDataType.FLOAT), crop_h, crop_w, shorter
        )
    images = fn.decoders.image(encoded, device=decoder, output_type=types.DALIImageType.RGB)
    images = cast("DataNode", fn.resize(images, resize_shorter=resize_shorter, interp_type=interp))
    images = fn.crop_mirror_normalize(
        images,
        **crop,
        dtype=types.DALIDataType.FLOAT,
        output_layout="CHW",
        mean=list(mean),
        std=list(std),
    )
    return images, label


class _Crop(TypedDict, total=False):
    """crop_mirror_normalize's window: a fixed ``crop``, or per-sample ``crop_h`` and ``crop_w``."""

    crop: tuple[int, int]
    crop_h: DataNode
    crop_w: DataNode
    out_of_bounds_policy: str


def _covering(shape: DataNode, crop_h: DataNode, crop_w: DataNode, shorter: float) -> DataNode:
    """Per image, the shorter side to resize to: ``shorter`` (the square crop's), or where that leaves the image
    smaller than its ``crop_h x crop_w`` crop (its aspect is far from its batch's), one past the side that
    covers it. ``shape``: the decoded image's ``[H, W, C]`` (``peek_image_shape``: after EXIF rotation, as the
    decoder)."""
    height, width = shape[0], shape[1]
    need = dmath.min(height, width) * dmath.max(crop_h / height, crop_w / width)
    # The scaled sides are then at least one pixel over the crop's, before DALI rounds them; R + 0 * ... is R
    # exactly, so square images in square batches get the square crop's resize bit for bit.
    return shorter + (need > shorter) * (dmath.ceil(need) + 1 - shorter)


def interp_type(name: str) -> types.DALIInterpType:
    table = {
        "bilinear": types.DALIInterpType.INTERP_LINEAR,
        "bicubic": types.DALIInterpType.INTERP_CUBIC,
        "triangular": types.DALIInterpType.INTERP_TRIANGULAR,
        "nearest": types.DALIInterpType.INTERP_NN,
    }
    if name not in table:
        raise UserError(f"interpolation={name!r}: expected one of {sorted(table)}")
    return table[name]
