"""Rectangular validation (vitlarge/data/rect.py): the batches, their crops, and the real DALI loader on the CPU.

The schedule is simulated at world sizes 1..9 and 128 (every image in one batch, the square crop's count of
forwards); the loader runs on identifiable records of varied sizes (label = record index), so a batch's
labels name its images and their sizes its expected crop.
"""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
import torch

from data_tools.make_id_dataset import make_id_dataset
from tests.helpers.loaders import open_val
from vitlarge.data.common import val_forwards
from vitlarge.data.manifest import load_manifest, split_sizes
from vitlarge.data.rect import chunk_shapes, crop_shape, rank_chunks
from vitlarge.errors import UserError

CPU = torch.device("cpu")
PATCH = 4


def sizes_of(n: int, seed: int) -> list[tuple[int, int]]:
    """``n`` image sizes from 1:3 portrait to 3:1 landscape."""
    rng = random.Random(seed)
    return [(rng.randint(8, 30), rng.randint(8, 30)) for _ in range(n)]


@pytest.fixture(scope="module")
def aspect_ids(tmp_path_factory) -> str:
    """37 identifiable validation images of varied sizes in 3 shards, sorted by aspect ratio."""
    out = str(tmp_path_factory.mktemp("aspect_ids"))
    return make_id_dataset(out, train=9, train_shards=1, val_shards=3, val_sizes=sizes_of(37, 0)).data_dir


def test_the_crop_keeps_the_eval_size_short_and_rounds_the_long_side_to_whole_patches():
    assert crop_shape(1.0, 16, PATCH) == (16, 16)
    assert crop_shape(4 / 3, 224, 16) == (224, 304)  # 298.7 -> 19 patches
    assert crop_shape(3 / 4, 224, 16) == (304, 224)
    assert crop_shape(1.05, 224, 16) == (224, 240)  # 235.2: the nearest patch, not the floor
    assert crop_shape(1.01, 224, 16) == (224, 224)
    assert crop_shape(0.999, 16, PATCH) == (16, 16)  # never below the eval size
    # A chunk's crop is its images' mean width / height (fast.ai's map_idx2ar), chunk by chunk.
    sizes = [(10, 20), (10, 30), (30, 10), (10, 10), (10, 40)]
    assert chunk_shapes(sizes, 2, 16, PATCH) == [crop_shape(2.5, 16, PATCH), crop_shape(2 / 3, 16, PATCH), (16, 64)]


def test_a_chunk_crop_is_at_most_four_to_one_whatever_the_sizes_declare():
    """A crafted dataset.json's 1 x 1,048,576 image (or a real panorama alone in the last chunk) keeps its batch's
    crop at 4:1, not 224 x 917,808."""
    assert chunk_shapes([(375, 500)] * 255 + [(1, 1 << 20)], 256, 224, 16) == [(224, 896)]
    assert chunk_shapes([(1, 1 << 20)], 1, 224, 16) == [(224, 896)]
    assert chunk_shapes([(1 << 20, 1)], 1, 224, 16) == [(896, 224)]
    assert chunk_shapes([(300, 4000)], 1, 224, 16) == [(224, 896)]


@pytest.mark.parametrize("n", [1, 5, 37, 50, 391, 50_000])
def test_every_image_is_in_one_batch_at_world_sizes_1_to_9_and_128_with_the_square_crops_count(n):
    """The schedule alone: chunk c is batch c // world of rank c % world; each rank forwards `val_forwards`
    batches (the square loader's count), its real ones first. Chunk c holds records [c x batch, (c + 1) x batch)
    (`RectBatches.records`), so each chunk once is each image once."""
    for batch in (1, 4, 12, 256):
        chunks = -(-n // batch)
        for world in (*range(1, 10), 128):
            seen, forwards = [], set()
            for rank in range(world):
                order = rank_chunks(n, rank, world, batch)
                forwards.add(len(order))
                real = [c for c in order if c is not None]
                assert order == real + [None] * (len(order) - len(real))  # padding-only batches last
                seen += real
            assert forwards == {val_forwards(n, world, batch)}, (n, batch, world)
            assert sorted(seen) == list(range(chunks)), (n, batch, world)


def rect_pass(data: str, batch: int, world: int, **kw) -> tuple[dict, list]:
    """One pass of every rank: ``{record: image}`` and the ranks' loaders."""
    ranks = [
        open_val(
            data, batch, 8, rank=r, world_size=world, device=CPU, num_threads=1, rect_val=True, patch_size=PATCH, **kw
        )
        for r in range(world)
    ]
    images: dict[int, torch.Tensor] = {}
    for v in ranks:
        for x, y, keep in v.masked():
            assert x.shape[0] == batch  # padding rows are there, and dropped below
            for img, label in zip(x[:keep], y[:keep].tolist()):
                assert label not in images, (world, label)
                images[label] = img
    return images, ranks


def test_each_image_counts_once_cropped_to_its_chunk_and_alike_at_any_world_size(aspect_ids):
    """37 images in chunks of 4 (the last of one) at world sizes 1, 3 and 9 (ranks with a partial chunk, with a
    padding-only batch, with both): each image once per pass (twice: the second pass starts where the first
    left the source), every batch cropped to its chunk's mean aspect, and an image's pixels the same at every
    world size: a pass gives the same numbers at any world size, as the square crop's. (The schedule at world
    sizes 1..9 and 128: the test above; each loader costs ~0.1 s to build.)"""
    sizes = split_sizes(load_manifest(aspect_ids), "validation")
    assert sizes is not None
    expected = chunk_shapes(sizes, 4, 8, PATCH)
    assert len(set(expected)) > 4  # portrait, square and landscape crops
    reference, _ = rect_pass(aspect_ids, 4, 1)
    assert sorted(reference) == list(range(37))
    for label, img in reference.items():
        assert tuple(img.shape[1:]) == expected[label // 4]
    for world in (3, 9):
        images, ranks = rect_pass(aspect_ids, 4, world)
        assert sorted(images) == list(range(37)) and all(torch.equal(images[k], reference[k]) for k in images), world
        assert sum(v.num_examples_this_rank for v in ranks) == 37
        again = Counter(int(y) for v in ranks for _, labels in v for y in labels)
        assert again == Counter(range(37)), world


def test_square_images_give_the_square_crop_bit_for_bit(demo_data):
    """The digits are square: rectangular validation is the square crop, the same pixels in the same batches."""
    square = open_val(demo_data, 50, 16, rank=0, world_size=1, device=CPU, num_threads=1, crop_pct=0.875)
    rect = open_val(
        demo_data, 50, 16, rank=0, world_size=1, device=CPU, num_threads=1, crop_pct=0.875, rect_val=True, patch_size=4
    )
    pairs = list(zip(square.masked(), rect.masked()))
    assert len(pairs) == 8 and rect.num_examples_this_rank == 360
    for (a, la, ka), (b, lb, kb) in pairs:
        assert ka == kb and torch.equal(la, lb) and torch.equal(a, b)


def test_an_image_far_from_its_chunks_aspect_is_scaled_over_the_crop_never_padded(tmp_path):
    """A chunk of a 1:3 portrait and a 3:1 landscape image (mean aspect 5:3): both fill the whole crop (a padded
    pixel would be exactly 0 in every channel after normalisation; mid-gray is not)."""
    data = make_id_dataset(str(tmp_path), train=2, train_shards=1, val_sizes=[(30, 10), (10, 30)]).data_dir
    v = open_val(data, 2, 8, rank=0, world_size=1, device=CPU, num_threads=1, rect_val=True, patch_size=PATCH)
    ((images, labels, keep),) = list(v.masked())
    assert keep == 2 and tuple(images.shape) == (2, 3, 8, 12)  # 8 x 13.3 -> 3 patches of 4
    assert not (images == 0).all(dim=1).any()


def test_rect_val_on_a_data_set_without_image_sizes_is_one_line_with_the_fix(tmp_path):
    data = make_id_dataset(str(tmp_path), train=2, train_shards=1, validation=6).data_dir
    with pytest.raises(UserError) as e:
        open_val(data, 2, 8, rank=0, world_size=1, device=CPU, rect_val=True, patch_size=PATCH)
    assert str(e.value) == (
        f"{data}/dataset.json: the validation split is not stored sorted by aspect ratio with its image sizes, "
        f"which data.rect_val needs; convert it again with python -m data_tools.imagenet_to_tfrecord --src ROOT "
        f"--out {data} and the arguments it was made with (the training shards are kept, only the validation "
        "shards are rewritten), or set data.rect_val=false"
    )
    assert len(list(open_val(data, 2, 8, rank=0, world_size=1, device=CPU))) == 3  # the square crop reads it


def test_rect_batches_read_the_records_they_name(aspect_ids):
    """The source's own view: batch i's records are its chunk's, padded with the chunk's last record; a rank past
    the last chunk repeats the split's last record."""
    from vitlarge.data.manifest import shard_files
    from vitlarge.data.rect import RectBatches, val_sizes

    m = load_manifest(aspect_ids)
    sizes = val_sizes(m)
    shards = shard_files(m, "validation")
    source = RectBatches(shards, sizes, rank=4, world_size=6, batch_size=4, image_size=8, patch=4)
    assert source.runs == val_forwards(37, 6, 4) == 2 and source.num_examples_this_rank == 4
    assert [source.records(i) for i in range(2)] == [[16, 17, 18, 19], [36] * 4]  # chunk 4, then padding only
    idle = RectBatches(shards, sizes, rank=11, world_size=12, batch_size=4, image_size=8, patch=4)
    assert idle.num_examples_this_rank == 0 and idle.runs == 1  # 10 chunks for 12 ranks: forwards, counts nothing
    last = RectBatches(shards, sizes, rank=4, world_size=5, batch_size=8, image_size=8, patch=4)
    assert last.records(0) == [32, 33, 34, 35, 36, 36, 36, 36]
    encoded, labels, crop_h, crop_w = last(type("Info", (), {"iteration": 0})())
    assert labels[:, 0].tolist() == last.records(0) and len(encoded) == 8
    assert np.all(crop_h == crop_h[0]) and (crop_h[0], crop_w[0]) == chunk_shapes(sizes, 8, 8, 4)[4]
    source.close(), idle.close(), last.close()


def test_the_dry_run_plans_from_dataset_json_alone_where_the_sizes_files_are_not(tmp_path):
    """A login node with a copy of dataset.json and neither the shards nor the ``.sizes`` files: ``--dry-run`` plans
    from dataset.json (it records the sizes, in aspect order); the run's pre-flight reads the files, and one missing
    is one line naming it."""
    from vitlarge.config.load import load_config
    from vitlarge.data.sources import checked_manifest, planning_manifest

    data = make_id_dataset(str(tmp_path / "d"), train=2, train_shards=1, val_sizes=sizes_of(10, 1)).data_dir
    cfg = load_config("demo_digits", [f"data.path={data}", "data.rect_val=true"])
    sizes = tmp_path / "d" / "validation-00000-of-00001.sizes"
    sizes.unlink()
    manifest = planning_manifest(cfg)
    assert manifest is not None and manifest.num_examples("validation") == 10
    with pytest.raises(UserError) as e:
        checked_manifest(cfg)
    assert str(e.value).startswith(f"{sizes}: missing (the image sizes of validation-00000-of-00001); run ")
