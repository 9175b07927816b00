"""Data folders are files from elsewhere (issue 30): every name dataset.json lists stays inside the folder and is
a regular file; writes never follow a planted link; every read is bounded; every malformed file is one line.

Each case crafts the file a hostile or broken source would hand over and goes through the real reader
(`load_manifest`, `shard_files` as the loaders call it, `make_index`, the converter)."""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import struct
import tracemalloc

import pytest
from PIL import Image

from data_tools import imagefolder, imagenet_to_tfrecord, make_index, tfrecord_io
from tests.helpers import call_main
from tests.helpers.data_fixtures import SYNSETS
from vitlarge.data.manifest import MANIFEST_CAP, load_manifest, shard_files, validate_data_dir
from vitlarge.errors import UserError

FIX = "a data folder holds its shards and indexes as regular files"


@pytest.fixture
def data(tiny_converted, tmp_path):
    dst = tmp_path / "data"
    shutil.copytree(tiny_converted, dst)
    return dst


def edit_manifest(data, fn) -> str:
    path = data / "dataset.json"
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc))
    return str(path)


def one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


# --- A. confined reads --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key,value",
    [
        ("file", "/etc/hostname"),
        ("file", "../elsewhere/train-00000-of-00003"),
        ("file", "sub/train-00000-of-00003"),
        ("index", "/dev/zero"),
        ("index", "../../etc/hostname"),
    ],
)
def test_manifest_names_outside_the_folder_are_refused(data, key, value):
    path = edit_manifest(data, lambda d: d["splits"]["train"]["shards"][0].update({key: value}))
    with pytest.raises(UserError) as e:
        validate_data_dir(str(data))
    assert one_line(e).startswith(
        f"{path}: invalid manifest (splits.train.shards[0].{key} is {value!r}, expected a file name inside the "
        "data folder (no '/', no '..', not hidden)); re-convert, or run python -m data_tools.make_index"
    )


def test_a_shard_linked_outside_the_folder_is_refused(data, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shard = data / "train-00001-of-00003"
    shutil.move(shard, elsewhere / shard.name)
    os.symlink(elsewhere / shard.name, shard)
    with pytest.raises(UserError) as e:
        shard_files(load_manifest(str(data)), "train")
    assert one_line(e) == (
        f"{shard}: leads outside {data} (to {elsewhere / shard.name}); vitlarge reads and writes only inside it; "
        f"{FIX} (links only to files inside it); to keep shards on another disk, point --data at the folder there "
        "(or a link to that folder): see docs/DATA.md"
    )


def test_an_index_that_is_a_fifo_is_refused_without_blocking(data):
    index = data / "validation-00001-of-00002.idx"
    index.unlink()
    os.mkfifo(index)
    with pytest.raises(UserError) as e:
        shard_files(load_manifest(str(data)), "validation")
    assert one_line(e).startswith(f"{index}: is not a regular file; {FIX}")


def test_an_index_that_is_a_device_is_refused(data):
    index = data / "train-00000-of-00003.idx"
    index.unlink()
    try:
        os.mknod(index, stat.S_IFCHR | 0o666, os.makedev(1, 5))  # what /dev/zero is
    except PermissionError:
        pytest.skip("mknod needs root here")
    with pytest.raises(UserError) as e:
        shard_files(load_manifest(str(data)), "train")
    assert one_line(e).startswith(f"{index}: is not a regular file; {FIX}")


def test_the_documented_ways_to_keep_shards_elsewhere_work(tiny_converted, tmp_path):
    """--data may be a link to the folder; links inside the folder to files inside it are followed."""
    real = tmp_path / "disk2" / "imagenet-tfr"
    shutil.copytree(tiny_converted, real)
    os.symlink(real, tmp_path / "data")
    validate_data_dir(str(tmp_path / "data"))
    os.mkdir(real / "shards")
    shutil.move(real / "train-00000-of-00003", real / "shards" / "train-00000-of-00003")
    os.symlink("shards/train-00000-of-00003", real / "train-00000-of-00003")
    assert validate_data_dir(str(tmp_path / "data")).num_examples("train") == 18


# --- B. confined writes: make_index and the converter with planted links ----------------------


def test_make_index_replaces_planted_links_and_never_writes_through_them(data, victim):
    others = [victim.parent / f"v{i}" for i in range(4)]
    for v in others:
        v.write_bytes(b"precious")
    (data / "dataset.json").unlink()
    (data / "train-00000-of-00003.idx").unlink()
    os.symlink(others[0], data / "dataset.json")
    os.symlink(others[1], data / "dataset.json.tmp")
    os.symlink(others[2], data / "train-00000-of-00003.idx")
    os.symlink(others[3], data / "train-00001-of-00003.idx.tmp")
    shutil.rmtree(data / ".progress")  # shards as from elsewhere
    make_index.make_index(str(data))
    assert all(v.read_bytes() == b"precious" for v in others)
    for name in ("dataset.json", "train-00000-of-00003.idx", "train-00001-of-00003.idx"):
        assert stat.S_ISREG(os.lstat(data / name).st_mode)
    assert not [n for n in os.listdir(data) if n.endswith(".tmp")]
    validate_data_dir(str(data))


def test_shard_writer_removes_a_link_planted_as_its_tmp(tmp_path, victim):
    path = tmp_path / "train-00000-of-00001"
    os.symlink(victim, str(path) + ".tmp")
    os.symlink(victim, str(path) + ".idx.tmp")
    with tfrecord_io.ShardWriter(str(path)) as w:
        w.write(tfrecord_io.encode_example({"image/class/label": (1, "int")}))
        w.commit()
    assert victim.read_bytes() == b"precious"
    assert stat.S_ISREG(os.lstat(path).st_mode) and stat.S_ISREG(os.lstat(str(path) + ".idx").st_mode)


def test_converter_refuses_a_progress_folder_linked_outside(tiny_imagefolder, tmp_path, victim, capsys):
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(victim.parent, out / ".progress")
    rc = imagenet_to_tfrecord.main(
        ["--src", tiny_imagefolder, "--out", str(out), "--workers", "0", "--no-progress", "--train-shards", "2"]
    )
    assert rc == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: {out / '.progress'}: leads outside {out} (to {victim.parent}); vitlarge reads and writes only "
        "inside it; remove it, or choose another --out"
    )
    assert os.listdir(victim.parent) == ["victim"] and os.listdir(out) == [".progress"]


def test_converter_replaces_links_planted_under_its_final_names(tiny_imagefolder, tmp_path, victim):
    out = tmp_path / "out"
    out.mkdir()
    for name in ("dataset.json", "train-00000-of-00002", "train-00000-of-00002.idx", "skipped.txt"):
        os.symlink(victim, out / name)
    imagenet_to_tfrecord.convert(tiny_imagefolder, str(out), train_shards=2, val_shards=1, workers=0, progress=False)
    assert victim.read_bytes() == b"precious"
    assert all(stat.S_ISREG(os.lstat(out / n).st_mode) for n in os.listdir(out) if n != ".progress")
    validate_data_dir(str(out))


# --- C. bounded reads ---------------------------------------------------------------------------


def test_manifest_over_the_size_cap_is_one_line_naming_the_cap(data):
    path = data / "dataset.json"
    with open(path, "r+b") as f:
        f.truncate(MANIFEST_CAP + 1)
    with pytest.raises(UserError) as e:
        load_manifest(str(data))
    assert one_line(e) == (
        f"{path}: is larger than the 16,777,216-byte cap for this file; a manifest of ImageNet-21K's size is ~4 MB, "
        f"its images' sizes in files of their own; one written before they were (sizes inline) is written again by "
        f"python -m data_tools.make_index {data}"
    )


def test_index_is_streamed_not_read_whole(data):
    index = data / "train-00000-of-00003.idx"
    with open(index, "r+b") as f:
        f.truncate(256 << 20)  # 256 MB of zeros after the real lines: one f.read() would hold it all
    tracemalloc.start()
    try:
        with pytest.raises(UserError, match="stale or padded DALI index"):
            shard_files(load_manifest(str(data)), "train")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20


def test_make_index_refuses_a_fifo_named_like_a_shard(data):
    shutil.rmtree(data / ".progress")
    shard = data / "train-00002-of-00003"
    shard.unlink()
    os.mkfifo(shard)  # opening it for reading would wait for a writer forever
    r = call_main("data_tools.make_index", str(data), "--workers", "1")
    assert r.returncode == 2 and r.stderr.strip() == f"error: {shard}: is not a regular file; {FIX} " + (
        "(links only to files inside it); to keep shards on another disk, point --data at the folder there "
        "(or a link to that folder): see docs/DATA.md"
    )


def jpeg_header_only(width: int, height: int) -> bytes:
    """A baseline JPEG whose frame header declares ``width`` x ``height``, ending in the end marker."""
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (1, 2, 3)).save(buf, "JPEG")
    data = bytearray(buf.getvalue())
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def test_the_pixel_limit_is_checked_from_a_jpeg_header_and_can_be_raised(tmp_path):
    big = tmp_path / "big.jpg"
    big.write_bytes(jpeg_header_only(40000, 40000))
    with pytest.raises(imagefolder.BadImage) as e:
        imagefolder.prepare_image(str(big))
    assert e.value.args[1] == (
        "40000 x 40000 = 1,600,000,000 pixels, more than --max-image-pixels 89,478,485 (a decompression-bomb "
        "guard; raise --max-image-pixels if you trust it)"
    )
    small = tmp_path / "small.png"
    Image.new("RGB", (120, 100)).save(small)
    with pytest.raises(imagefolder.BadImage) as e:
        imagefolder.prepare_image(str(small), max_pixels=11999)
    assert e.value.args[1].startswith("120 x 100 = 12,000 pixels, more than --max-image-pixels 11,999 ")
    assert imagefolder.prepare_image(str(small), max_pixels=12000)[1:3] == (100, 120)


def test_a_file_larger_than_any_image_within_the_pixel_limit_is_refused_before_it_is_read(tmp_path):
    """A sparse "JPEG" (a 4 GiB one took 4.1 GiB of memory to be skipped; 64 GiB a MemoryError traceback even with
    --skip-bad): refused from its size. At a pixel limit of 1,000,000 (a cap of 4 MB), a sparse 64 MiB file."""
    sparse = tmp_path / "sparse.JPEG"
    with open(sparse, "wb") as f:
        f.truncate(64 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(imagefolder.BadImage) as e:
            imagefolder.prepare_image(str(sparse), max_pixels=1_000_000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert e.value.args[1] == (
        "67,108,864 bytes, more than 4 a pixel of --max-image-pixels 1,000,000 (a memory guard; raise "
        "--max-image-pixels if you trust it)"
    )
    assert peak < 1 << 20, peak


def test_a_file_larger_than_any_image_is_skipped_with_skip_bad_and_one_line_without(tiny_imagefolder, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(tiny_imagefolder, src)
    sparse = src / "train" / SYNSETS[0] / "sparse.JPEG"
    with open(sparse, "wb") as f:
        f.truncate(64 << 20)
    argv = ["--src", str(src), "--out", str(tmp_path / "out"), "--workers", "0", "--no-progress"]
    with pytest.raises(UserError) as e:
        imagenet_to_tfrecord.convert(str(src), str(tmp_path / "out"), workers=0, progress=False, max_image_pixels=10**6)
    assert one_line(e).startswith(f"{sparse}: unreadable image (67,108,864 bytes, more than 4 a pixel of ")
    assert imagenet_to_tfrecord.main([*argv, "--skip-bad", "--max-image-pixels", "1000000"]) == 0
    assert (tmp_path / "out" / "skipped.txt").read_text().startswith(f"{sparse}\t67,108,864 bytes, more than 4 a ")


def test_a_file_named_in_bytes_that_are_not_utf8_converts_under_its_own_name(tiny_imagefolder, tmp_path):
    """``\\xff\\xfe.JPEG`` (a UnicodeEncodeError once): its record's filename and the skipped list hold the bytes of
    the names on disk (os.fsencode), a class folder's name too."""
    from tfrecord.reader import tfrecord_loader

    src = tmp_path / "src"
    shutil.copytree(tiny_imagefolder, src)
    train = os.fsencode(src / "train")
    first = sorted(os.listdir(os.path.join(train, os.fsencode(SYNSETS[0]))))[1]
    os.rename(
        os.path.join(train, os.fsencode(SYNSETS[0]), first),
        os.path.join(train, os.fsencode(SYNSETS[0]), b"\xff\xfe.JPEG"),
    )
    with open(os.path.join(train, os.fsencode(SYNSETS[1]), b"\xfe\xffbad.JPEG"), "wb") as f:
        f.write(b"not an image")
    for split in (b"train", b"val"):
        os.rename(
            os.path.join(os.fsencode(src), split, os.fsencode(SYNSETS[2])),
            os.path.join(os.fsencode(src), split, b"\xfeclass"),
        )
    out = tmp_path / "out"
    imagenet_to_tfrecord.convert(str(src), str(out), workers=0, progress=False, skip_bad=True, train_shards=1)
    m = load_manifest(str(out))
    records = list(
        tfrecord_loader(
            str(out / m.shards("train")[0].file), None, {"image/filename": "byte", "image/class/synset": "byte"}
        )
    )
    assert b"\xff\xfe.JPEG" in {bytes(r["image/filename"]) for r in records}
    assert b"\xfeclass" in {bytes(r["image/class/synset"]) for r in records}
    assert (
        os.fsencode(os.path.join(src, "train", SYNSETS[1])) + b"/\xfe\xffbad.JPEG\tcannot identify image file"
        in (out / "skipped.txt").read_bytes()
    )


# --- D. one line for every malformed manifest and shard ----------------------------------------


def _nest(depth: int) -> str:
    return "[" * depth + "]" * depth


def _inline(d: dict) -> list[list]:
    """The validation shards' sizes written inline, as manifests had them before their files: ``[[10, 10], ...]``."""
    shards = d["splits"]["validation"]["shards"]
    for s in shards:
        s["sizes"] = [[10, 10] for _ in range(s["num_records"])]
    return [s["sizes"] for s in shards]


MALFORMED = {
    "shards empty": (
        lambda d: d["splits"]["train"].update(shards=[]),
        "splits.train.shards is [], expected a list of 1..99999 entries",
    ),
    "num_classes text": (
        lambda d: d.update(num_classes="abc"),
        "num_classes is 'abc', expected an integer 1..10000000",
    ),
    "num_classes bool": (lambda d: d.update(num_classes=True), "num_classes is True, expected an integer"),
    "num_classes huge": (lambda d: d.update(num_classes=10**12), "num_classes is 1000000000000, expected an integer"),
    "splits a list": (lambda d: d.update(splits=[]), "splits is [], expected an object"),
    "document a list": (None, "the document is [1], expected an object"),
    "shard not an object": (
        lambda d: d["splits"]["train"]["shards"].__setitem__(0, 7),
        "splits.train.shards[0] is 7, expected an object",
    ),
    "records text": (
        lambda d: d["splits"]["train"]["shards"][0].update(num_records="12"),
        "splits.train.shards[0].num_records is '12', expected an integer 1..1099511627776",
    ),
    "records huge": (
        lambda d: d["splits"]["train"]["shards"][0].update(num_records=10**15),
        "splits.train.shards[0].num_records is 1000000000000000, expected an integer 1..1099511627776",
    ),
    "bytes negative": (
        lambda d: d["splits"]["train"]["shards"][0].update(bytes=-1),
        "splits.train.shards[0].bytes is -1",
    ),
    "checksum junk": (
        lambda d: d["splits"]["train"]["shards"][0].update(checksum=[1]),
        "splits.train.shards[0].checksum is [1], expected null or 'crc32c:' and 8 hex digits",
    ),
    "shard listed twice": (
        lambda d: d["splits"]["train"]["shards"].append(d["splits"]["train"]["shards"][0]),
        "splits.train.shards lists train-00000-of-00003 twice",
    ),
    "shard of another split": (
        lambda d: d["splits"]["validation"]["shards"].append(d["splits"]["train"]["shards"][0]),
        "splits.validation.shards[2].file is 'train-00000-of-00003', expected a validation shard name",
    ),
    "unknown split": (lambda d: d["splits"].update(test={}), "splits.test is not a manifest key"),
    "class entry junk": (
        lambda d: d["classes"].__setitem__(0, {"label": "1", "synset": "x"}),
        "classes[0].label is '1'",
    ),
    "deep nesting": ("deep", "nested too deeply to be a manifest"),
    "nesting in a string field": (lambda d: d.update(tool=[[[[["x"]]]]]), "tool is [[[[['x']]]]], expected a string"),
    "not utf-8": (b"\xff\xfe\x00{", "not JSON ("),
    "huge integer literal": (b'{"num_classes": ' + b"9" * 5000 + b"}", "not JSON ("),
    "NaN": (lambda d: d.update(label_offset=float("nan")), "label_offset is nan, expected an integer"),
    "sizes one short": (
        lambda d: _inline(d)[0].pop(),
        "splits.validation.shards[0].sizes is [",
    ),
    "size not a pair": (
        lambda d: _inline(d)[0].__setitem__(1, [0, 5]),
        "splits.validation.shards[0].sizes[1] is [0, 5], expected [height, width] in pixels 1..1048576",
    ),
    "unknown order": (
        lambda d: d["splits"]["validation"].update(order="random"),
        "splits.validation.order is 'random', expected one of 'stored', 'aspect'",
    ),
    "aspect order without sizes": (
        lambda d: d["splits"]["validation"]["shards"][1].pop("sizes"),
        "splits.validation.shards[1].sizes is missing, which order 'aspect' needs",
    ),
    "sizes out of aspect order": (
        lambda d: _inline(d)[0].__setitem__(0, [1, 1000]),
        "splits.validation: record 1 (",
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_manifest_is_one_line(data, case):
    change, words = MALFORMED[case]
    path = data / "dataset.json"
    if change is None:
        path.write_text("[1]")
    elif change == "deep":
        path.write_text('{"format": "vitlarge.tfrecord", "x": ' + _nest(200_000) + "}")
    elif isinstance(change, bytes):
        path.write_bytes(change)
    else:
        edit_manifest(data, change)
    with pytest.raises(UserError) as e:
        load_manifest(str(data))
    msg = one_line(e)
    assert msg.startswith(f"{path}: invalid manifest (") and words in msg, msg
    assert msg.endswith(f"re-convert, or run python -m data_tools.make_index {data} to write it again from the shards")


def _shard_of(tmp_path, payloads: list[bytes]) -> str:
    d = tmp_path / "tf"
    d.mkdir()
    with tfrecord_io.ShardWriter(str(d / "train-00000-of-00001")) as w:
        for p in payloads:
            w.write(p)
        w.commit()
    os.remove(d / "train-00000-of-00001.idx")
    return str(d)


def test_make_index_names_a_record_that_is_not_an_example(tmp_path):
    good = tfrecord_io.encode_example({"image/class/label": (1, "int")})
    d = _shard_of(tmp_path, [good, b"\xff\xff\xff\xff junk, not protobuf", good])
    r = call_main("data_tools.make_index", d)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    shard = os.path.join(d, "train-00000-of-00001")
    offset = len(tfrecord_io.frame(good))
    assert r.stderr.strip().startswith(
        f"error: {shard}: the record at byte {offset} is not a tf.train.Example with an image and an integer label (DecodeError: "
    ) and r.stderr.strip().endswith("; re-convert this shard or remove its set")
    assert not os.path.exists(os.path.join(d, "dataset.json"))


@pytest.mark.parametrize(
    "payload,words", [(None, "holds no records"), ("nolabel", "record without 'image/class/label'")]
)
def test_make_index_names_an_empty_shard_or_one_without_labels(tmp_path, payload, words):
    if payload is None:
        d = tmp_path / "tf"
        d.mkdir()
        (d / "train-00000-of-00001").write_bytes(b"")
        d = str(d)
    else:
        d = _shard_of(tmp_path, [tfrecord_io.encode_example({"image/class/label": ([], "int")})])
    with pytest.raises(UserError) as e:
        make_index.make_index(d)
    assert one_line(e).startswith(f"{os.path.join(d, 'train-00000-of-00001')}: ") and words in str(e.value)


# --- G. the fix a user needs when --data is not a data set yet ---------------------------------


def test_data_pointing_at_an_image_tree_says_convert_it(tiny_imagefolder):
    with pytest.raises(UserError) as e:
        load_manifest(tiny_imagefolder)
    assert one_line(e) == (
        f"{tiny_imagefolder}/dataset.json: missing; this is an image folder (ROOT/train/<class>/*): convert it with "
        f"python -m data_tools.imagenet_to_tfrecord --src {tiny_imagefolder} --out {tiny_imagefolder}-tfrecord, "
        f"then pass --data {tiny_imagefolder}-tfrecord"
    )
    train = os.path.join(tiny_imagefolder, "train")
    with pytest.raises(UserError) as e:
        load_manifest(train)
    assert one_line(e).startswith(
        f"{train}/dataset.json: missing; this is an image folder, a split of ROOT={tiny_imagefolder}: convert ROOT "
        f"with python -m data_tools.imagenet_to_tfrecord --src {tiny_imagefolder} "
    )


def test_missing_demo_data_suggests_the_demo_maker(tmp_path):
    with pytest.raises(UserError) as e:
        load_manifest(str(tmp_path / "data" / "digits"))
    assert one_line(e) == (
        f"{tmp_path / 'data' / 'digits'}: data directory does not exist; the demo's digits data set is made with "
        f"python -m data_tools.make_demo_dataset {tmp_path / 'data' / 'digits'} (a few seconds); for other images "
        "convert with python -m data_tools.imagenet_to_tfrecord"
    )


# --- H. a loader state's DALI checkpoint (a rank file's data state) ---------------------------


def _state_with(state: str, edit) -> str:
    """``state`` (`TrainLoader.state`) with its DALI checkpoint edited by ``edit(checkpoint, reader snapshot)``."""
    import base64

    from vitlarge.data import dali_state

    doc = json.loads(state)
    checkpoint = dali_state.parse(base64.b64decode(doc["dali"]))
    (op,) = [op for op in checkpoint.cpts if op.operator_name == "Reader"]
    snapshot = dali_state.reader_snapshot(op.operator_state)
    edit(checkpoint, snapshot.loader_state)
    op.operator_state = snapshot.SerializeToString()
    doc["dali"] = base64.b64encode(checkpoint.SerializeToString()).decode()
    return json.dumps(doc)


@pytest.fixture(scope="module")
def loader_state(tiny_converted) -> str:
    from tests.helpers.loaders import open_train

    loader = open_train(tiny_converted, 4, 32, seed=0)
    next(loader)
    return loader.state()


def test_a_dali_checkpoint_reads_back_to_its_own_bytes(loader_state):
    """The messages `vitlarge.data.dali_state` declares are DALI's: a real checkpoint parses and writes back
    byte for byte, the reader's fields where DALI puts them (a DALI that moves them fails here)."""
    import base64

    from vitlarge.data import dali_state

    blob = base64.b64decode(json.loads(loader_state)["dali"])
    checkpoint = dali_state.parse(blob)
    assert checkpoint.SerializeToString() == blob
    (op,) = [op for op in checkpoint.cpts if op.operator_name == "Reader"]
    s = dali_state.reader_snapshot(op.operator_state)
    assert s.SerializeToString() == op.operator_state
    assert (s.loader_state.current_epoch, s.loader_state.age, s.loader_state.rng.isdigit()) == (0, 4, True)
    assert json.loads(checkpoint.external_ctx_cpt.pipeline_data) == {"iter": 1, "epoch_idx": 0}


def _set(field, value):
    return lambda checkpoint, reader: setattr(reader, field, value)


def _pipeline_data(text: bytes):
    return lambda checkpoint, reader: setattr(checkpoint.external_ctx_cpt, "pipeline_data", text)


@pytest.mark.parametrize(
    "edit, words",
    [
        # DALI replays the age sample by sample while it builds, holding the GIL: ~2 h, deaf to SIGTERM.
        pytest.param(
            _set("age", 2**31 - 1),
            "reader age 2147483647 outside 0..18, the records of an epoch on this rank",
            id="age 2**31-1",
        ),
        pytest.param(_set("age", 19), "reader age 19 outside 0..18", id="age past the epoch"),
        pytest.param(_set("age", -1), "reader age -1 outside 0..18", id="age -1"),
        pytest.param(_set("current_epoch", -1), "reader epoch -1 outside 0..2147483646", id="epoch -1"),
        pytest.param(_set("rng", b"junk"), "reader random state b'junk' is not a number in 1..2147483646", id="rng"),
        pytest.param(  # more digits than Python turns into an int (4,300): a ValueError traceback before
            _set("rng", b"1" * 5000), "reader random state b'1111", id="rng of 5,000 digits"
        ),
        pytest.param(_pipeline_data(b'{"iter": "x", "epoch_idx": 0}'), "pipeline data is not DALI's", id="iter text"),
        pytest.param(_pipeline_data(b"[]"), "pipeline data is not DALI's", id="pipeline data a list"),
        pytest.param(
            _pipeline_data(b'{"iter": -1, "epoch_idx": 0}'), "pipeline position iter -1, epoch 0 outside", id="iter -1"
        ),
    ],
)
def test_a_dali_checkpoint_out_of_its_epochs_bounds_is_one_line_before_the_pipeline_is_built(
    tiny_converted, loader_state, edit, words
):
    """Each field DALI would take as it is: a replay of 2**31 samples, a shard before the first (epoch -1), a
    TypeError inside DALI's Python side (the pipeline's iter a text)."""
    from tests.helpers.loaders import open_train

    with pytest.raises(UserError) as e:
        open_train(tiny_converted, 4, 32, seed=0, state=_state_with(loader_state, edit))
    msg = one_line(e)
    assert (
        msg.startswith(f"{tiny_converted}: TrainLoader state holds no DALI checkpoint of this pipeline (")
        and words in msg
    )
    assert one_line(e).endswith("; resume another checkpoint or start without state")


def test_a_dali_checkpoint_inside_the_bounds_resumes(tiny_converted, loader_state):
    """The last record of the epoch as the age, and an epoch far ahead: each a position this loader can take."""
    from tests.helpers.loaders import open_train

    for edit in (_set("age", 18), _set("current_epoch", 1000)):
        images, labels = next(open_train(tiny_converted, 4, 32, seed=0, state=_state_with(loader_state, edit)))
        assert images.shape == (4, 3, 32, 32) and labels.shape == (4,)


# --- I. records that pass the index: junk with a valid CRC, a length header past the record --------


def _first_train_record(data, kind: str) -> str:
    """The first record of the first train shard replaced in place (shard size, index and dataset.json unchanged):
    ``junk`` bytes framed with valid CRCs, or a length header of 2**40 with its CRC recomputed."""
    shard = str(data / "train-00000-of-00003")
    raw = bytearray(open(shard, "rb").read())
    (length,) = struct.unpack("<Q", raw[:8])
    if kind == "junk":
        raw[: 16 + length] = tfrecord_io.frame(bytes((7 * i + 3) % 256 for i in range(length)))
    else:
        header = struct.pack("<Q", 1 << 40)
        raw[:12] = header + tfrecord_io._masked_crc(header)
    open(shard, "wb").write(bytes(raw))
    return shard


@pytest.mark.parametrize(
    "kind, repeats, why",
    [
        ("junk", 1, "(raw data length: "),
        ("2**40", 1, "(record payload length: 1099511627776 bytes, available payload: "),
        ("junk", 2, "(not an Example: Error parsing message"),
    ],
    ids=["junk", "length 2**40", "junk, repeated records"],
)
def test_a_record_that_passes_the_index_but_not_the_parser_is_one_line_naming_the_shard_and_record(
    data, kind, repeats, why
):
    """DALI's RuntimeError (a 20-line traceback) becomes the shard, the record's byte offset and the fix; the same
    through the repeated-augmentation source (read in this process here; its read workers say the same), which
    reads a record by the index's size (a header that lies about its length is not read there)."""
    from tests.helpers.loaders import open_train

    shard = _first_train_record(data, kind)
    loader = open_train(str(data), 6, 32, seed=0, repeats=repeats)
    with pytest.raises(UserError) as e:
        for _ in range(30):  # a few epochs: a repeated-augmentation epoch shows about half the records
            next(loader)
    msg = one_line(e)
    assert msg.startswith(f"{shard}: the record at byte 0 is not a tf.train.Example with an image and a label ("), msg
    assert why in msg
    assert msg.endswith(
        f"; re-copy or re-convert this shard (python -m data_tools.make_index {data} reads every record and names "
        "each bad one)"
    )


def test_a_record_whose_label_is_not_one_integer_is_one_line_naming_the_data_and_the_fix(data):
    """An Example that parses but holds three labels: DALI's error names the batch, not the record (make_index does)."""
    shard = data / "train-00000-of-00003"
    raw = bytearray(shard.read_bytes())
    (length,) = struct.unpack("<Q", raw[:8])
    example = tfrecord_io.encode_example({"image/encoded": (b"", "byte"), "image/class/label": ([1, 2, 3], "int")})
    framed = tfrecord_io.frame(example)
    raw[: 16 + length] = framed + b"\0" * (16 + length - len(framed))  # the size, index and manifest kept
    shard.write_bytes(bytes(raw))
    from tests.helpers.loaders import open_train

    loader = open_train(str(data), 6, 32, seed=0)
    with pytest.raises(UserError) as e:
        for _ in range(3):  # the epoch: DALI parses a record when a batch takes it
            next(loader)
    assert one_line(e).startswith(
        f"{data}: a record of the train shards holds no image and single integer label DALI can batch ("
    ) and one_line(e).endswith(
        f"); python -m data_tools.make_index {data} reads every record and names each bad one: re-copy or re-convert "
        "its shard"
    )


def test_an_index_padded_with_blank_lines_is_refused_from_its_size_and_never_read_whole(data):
    """An index padded with 200 MiB of newlines kept its "num_records lines" (blank lines skipped), passed the check
    and was read whole by `IndexedRecords`: past a line per record (48 bytes each) it is refused unread."""
    from vitlarge.data.repeats import IndexedRecords

    files = shard_files(load_manifest(str(data)), "validation")
    index = files[0][1]
    with open(index, "ab") as f:
        f.write(b"\n" * (1 << 20))
    with pytest.raises(UserError) as e:
        shard_files(load_manifest(str(data)), "validation")
    assert one_line(e).startswith(f"{index}: larger than ") and "a stale or padded DALI index: run " in str(e.value)
    with pytest.raises(UserError) as e:  # read by index without the check before it: bounded by the shard's size
        IndexedRecords(files, world_size=1)
    assert one_line(e).startswith(f"{index}: is larger than the ") and "a stale or padded DALI index" in str(e.value)


# --- E. an image tree's names and links, and a shard's class names ------------------------------


@pytest.mark.parametrize(
    "where, name, shown",
    [
        ("class", "n01440764\nerror: forged", "the class folder 'n01440764\\nerror: forged'"),
        ("class", "n01\x1b[2Kx", "the class folder 'n01\\x1b[2Kx'"),
        ("file", "a\rerror: forged.JPEG", "the file name 'a\\rerror: forged.JPEG'"),
        ("folder", "sub\u202egpj.exe", "the folder 'sub\\u202egpj.exe'"),
    ],
)
def test_a_name_with_a_control_character_is_one_line_showing_it_escaped(tiny_imagefolder, tmp_path, where, name, shown):
    """A class folder named ``n01440764\\nerror: forged`` printed a line of its own (``error: forged``) in the
    converter's output: such a name, of a class, a subfolder or a file, is refused in one line, escaped."""
    src = tmp_path / "src"
    shutil.copytree(tiny_imagefolder, src)
    cls = src / "train" / SYNSETS[0]
    image = sorted(cls.iterdir())[0]
    if where == "class":
        os.rename(src / "train" / SYNSETS[2], src / "train" / name)
        shutil.rmtree(src / "val" / SYNSETS[2])
    elif where == "file":
        os.rename(image, cls / name)
    else:
        (cls / name).mkdir()
        os.rename(image, cls / name / image.name)
    r = call_main(
        "data_tools.imagenet_to_tfrecord", "--src", str(src), "--out", str(tmp_path / "out"), "--workers", "0"
    )
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert shown in r.stderr and "which would forge or hide lines of this log; rename it" in r.stderr


def test_make_index_with_a_synset_longer_than_the_manifest_holds_lists_no_class_names(tmp_path):
    """A 2,000-character synset in the records: make_index wrote a manifest its reader refused, telling to run
    make_index again. Now one warning line names the class and the limit, and the manifest, without class names, is
    read."""
    records = [
        tfrecord_io.encode_example(
            {"image/class/label": (label, "int"), "image/class/synset": (synset.encode(), "byte")}
        )
        for label, synset in ((1, "n01440764"), (2, "n" * 2000))
    ]
    d = _shard_of(tmp_path, records)
    r = call_main("data_tools.make_index", d)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines()[0] == (
        f"warning: {d}: label 2's image/class/synset is 2,000 characters, more than the 1,024 dataset.json holds; it "
        "lists no class names (training needs none; an export names its classes by index)"
    )
    m = load_manifest(d)
    assert (m.num_classes, m.classes) == (2, [])
