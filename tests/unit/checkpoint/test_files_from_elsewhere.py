"""Checkpoints and exports handed over from elsewhere are data: crafted files never run code, never make a
read leave their folder, never read unboundedly, and each is one line naming the file.

Every crafted `.metadata` below has its CRC resealed in meta.json (anyone can recompute it), so the
size and checksum check passes and the file reaches the reader. Each payload is first shown live: plain
``pickle.loads`` runs it (the marker file appears), as the reader before this fix did through its
prefix allow-list and ``getattr``.
"""

import argparse
import dataclasses
import io
import json
import os
import pickle
import shutil
import struct
from pathlib import Path

import crc32c
import pytest
import torch

from tests.helpers import ROOT
from tests.helpers.tiny_model import make, trained
from vitlarge.checkpoint import checkpointer as ckpt_checkpointer
from vitlarge.checkpoint import init_from, resume, sharded, store
from vitlarge.checkpoint import weights as ckpt_weights
from vitlarge.checkpoint import workdir as ckpt_workdir
from vitlarge.checkpoint.state import RunState
from vitlarge.checkpoint.trust import index as dcp_index
from vitlarge.checkpoint.trust import layout
from vitlarge.checkpoint.trust.torch_files import rank_state_problem, torch_load
from vitlarge.config.load import load_recipe
from vitlarge.errors import UserError

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def cfg():
    return load_recipe(ROOT / "recipes" / "demo_digits.py")


@pytest.fixture(scope="module")
def original(tmp_path_factory, cfg) -> Path:
    """One real checkpoint, copied by each test that damages it."""
    model, opt, scaler = trained(cfg)
    return store.save(
        tmp_path_factory.mktemp("orig"), RunState(model, opt, scaler, step=1, data="loader-state"), cfg, keep=3
    )


@pytest.fixture
def ckpt(tmp_path, original) -> Path:
    dest = tmp_path / "from_elsewhere" / "checkpoints" / original.name
    dest.mkdir(parents=True)
    for f in original.iterdir():
        (dest / f.name).write_bytes(f.read_bytes())
    return dest


def reseal(path: Path) -> None:
    """Records every listed file's size and CRC32C again, as a forger would."""
    meta = json.loads((path / "meta.json").read_text())
    for name in meta["files"]:
        data = (path / name).read_bytes()
        meta["files"][name] = {"bytes": len(data), "crc32c": f"{crc32c.crc32c(data):08x}"}
    (path / "meta.json").write_text(json.dumps(meta))


def edit_meta(path: Path, **changes) -> None:
    meta = json.loads((path / "meta.json").read_text())
    meta.update(changes)
    (path / "meta.json").write_text(json.dumps(meta))


# Hand-written pickle opcodes (protocol 4): what a forger prepends to a real index.
def _str(s: str) -> bytes:
    b = s.encode()
    return b"\x8c" + bytes([len(b)]) + b  # SHORT_BINUNICODE


def _global(module: str, name: str) -> bytes:
    return _str(module) + _str(name) + b"\x93"  # STACK_GLOBAL


def _call(fn: bytes, *args: bytes) -> bytes:
    return fn + b"(" + b"".join(args) + b"tR"  # MARK args TUPLE REDUCE


FS = "torch.distributed.checkpoint.filesystem"  # a module the old allow-list admitted by prefix


def routes(marker: Path) -> dict[str, bytes]:
    """Each known route from an index to the shell, as a call whose result is popped before the real index."""
    cmd = _str(f"touch {marker}")
    getattr_ = _global("builtins", "getattr")
    return {
        "dotted name": _call(_global(FS, "os.system"), cmd),
        "getattr chain": _call(
            _call(
                getattr_,
                _call(getattr_, _global("torch.distributed.checkpoint", "filesystem"), _str("os")),
                _str("system"),
            ),
            cmd,
        ),
        "module attribute that is a module": _call(_call(getattr_, _global(FS, "os"), _str("system")), cmd),
        "__reduce__ of an allowed class's field": _call(_global("posix", "system"), cmd),
    }


def poison(path: Path, payload: bytes) -> None:
    real = (path / ".metadata").read_bytes()
    assert real[:2] == b"\x80\x04"
    (path / ".metadata").write_bytes(b"\x80\x04" + payload + b"0" + real[2:])  # POP: the index still loads
    reseal(path)


@pytest.mark.parametrize("route", list(routes(Path("x"))))
def test_a_crafted_index_never_runs_at_any_entry_point(tmp_path, ckpt, cfg, route, caplog):
    marker = tmp_path / "ran"
    poison(ckpt, routes(marker)[route])
    problem = store.verify(ckpt)  # rank 0's check before any resume
    assert problem is not None and "which a DCP index never holds" in problem
    with pytest.raises(UserError, match="never holds"):  # evaluate's and load_model_weights' read
        ckpt_weights.load_model_weights(ckpt, make(cfg)[0], cfg)
    with pytest.raises(UserError, match=r"^model.init_from=.*which a DCP index never holds"):
        init_from.read_state_dict(ckpt)
    with pytest.raises(layout.Unusable, match="never holds"):  # --resume X
        resume.choose(tmp_path / "mine", ckpt, make(cfg)[0], cfg)
    with pytest.raises(dcp_index.IndexProblem):  # the DCP reader itself, for any caller
        sharded.Reader(ckpt).read_metadata()
    # An automatic resume names it and passes over it, as over any checkpoint that fails its check.
    chosen = resume.choose(ckpt.parent.parent, None, make(cfg)[0], cfg).path
    assert chosen is None
    assert not marker.exists()
    assert not (tmp_path / "mine" / "checkpoints").exists()  # --resume copied nothing into the user's workdir


def _index_with(path: Path, edit) -> None:
    md = dcp_index.unpickle_index((path / ".metadata").read_bytes())
    edit(md)
    (path / ".metadata").write_bytes(pickle.dumps(md, protocol=4))
    reseal(path)


def _first_storage(md):
    return next(iter(md.storage_data.values()))


@pytest.mark.parametrize(
    "where, expect",
    [
        ("/etc/hostname", "which meta.json does not list"),
        ("../../../../etc/hostname", "which meta.json does not list"),
        ("/dev/zero", "which meta.json does not list"),
        ("rank_00000.pt", "which meta.json does not list"),  # listed, but not a data file
    ],
)
def test_index_entries_may_name_only_the_listed_data_files(ckpt, cfg, where, expect):
    _index_with(ckpt, lambda md: setattr(_first_storage(md), "relative_path", where))
    assert expect in store.verify(ckpt)
    with pytest.raises(layout.Unusable, match=expect):
        ckpt_weights.weights_of(ckpt, layout.read_meta(ckpt))


def test_index_byte_ranges_stay_inside_the_recorded_size(ckpt):
    _index_with(ckpt, lambda md: setattr(_first_storage(md), "length", 1 << 40))
    assert "past the end of __0_0.distcp" in store.verify(ckpt)


def test_index_shapes_cannot_allocate_more_than_the_files_hold(ckpt):
    def huge(md):
        entry = md.state_dict_metadata["model.cls_token"]
        entry.size = torch.Size([1 << 20, 1 << 20])

    _index_with(ckpt, huge)
    assert "larger than the checkpoint's data files" in store.verify(ckpt)
    with pytest.raises(layout.Unusable, match="larger than"):
        ckpt_weights.weights_of(ckpt, layout.read_meta(ckpt))  # allocates from the index when no model is given


@pytest.mark.parametrize(
    "name, expect",
    [
        ("../../../etc/hostname", "not a checkpoint file name"),
        ("/dev/zero", "not a checkpoint file name"),
        ("sub/__0_0.distcp", "not a checkpoint file name"),
    ],
)
def test_meta_json_may_list_only_plain_checkpoint_file_names(ckpt, name, expect):
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["files"][name] = {"bytes": 1, "crc32c": "00000000"}
    (ckpt / "meta.json").write_text(json.dumps(meta))
    assert expect in store.verify(ckpt)
    with pytest.raises(layout.Unusable, match=expect):
        layout.read_meta(ckpt)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["fifo", "symlink out", "device"])
def test_a_listed_file_that_is_not_a_regular_file_of_the_folder_is_refused_without_reading(tmp_path, ckpt, kind):
    target = ckpt / "rank_00000.pt"
    target.unlink()
    if kind == "fifo":
        os.mkfifo(target)  # opening it for reading would wait for a writer forever
    elif kind == "symlink out":
        secret = tmp_path / "secret"
        secret.write_bytes(b"x" * 10)
        target.symlink_to(secret)
    else:
        target.symlink_to("/dev/zero")
    problem = store.verify(ckpt)
    assert problem is not None and "rank_00000.pt" in problem
    assert "not a regular file" in problem or "symbolic link" in problem


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["sparse 8 GB", "/dev/zero", "fifo"])
def test_meta_json_is_read_bounded(ckpt, kind):
    meta_file = ckpt / "meta.json"
    meta_file.unlink()
    if kind == "sparse 8 GB":
        with open(meta_file, "wb") as f:
            f.truncate(8 << 30)
    elif kind == "/dev/zero":
        meta_file.symlink_to("/dev/zero")
    else:
        os.mkfifo(meta_file)
    problem = store.verify(ckpt)
    expect = {"sparse 8 GB": "larger than the 4,194,304-byte cap", "/dev/zero": "symbolic link", "fifo": "FIFO"}[kind]
    assert problem.startswith("meta.json ") and expect in problem


@pytest.mark.parametrize(
    "changes, expect",
    [
        ({"step": -5}, "step is -5, not a whole number"),
        ({"step": "abc"}, "step is abc"),
        ({"step": True}, "step is True"),
        ({"world_size": 10**11, "format_version": 1}, "world_size is 100000000000"),
        ({"world_size": 0}, "world_size is 0"),
        ({"files": []}, "files is not a map"),
        ({"files": {}}, "files is not a map"),
        ({"config": []}, "config is not a map"),
        ({"config": {"train": []}}, "config.train is not a map"),
        ({"config": {"train": {"micro_batch": "sixteen"}}}, "'train.micro_batch' must be a int"),
        ({"param_shapes": {"a": "b"}}, "param_shapes is not a map"),
        ({"model": 3}, "model is not a name"),
        ({"format_version": "3"}, "checkpoint format 3, this vitlarge reads"),
        ({"optimizer_state": "yes"}, "optimizer_state is not true or false"),
        ({"step": 7}, "step 7 is not the folder's (step_0000001)"),
        # Each of these changed the run, or cost time or memory out of proportion, with exit 0 (issue 56):
        ({"line": "x" * 5000}, "line is 5,000 characters long, not a path (at most 4,096)"),
        ({"config": {"data": {"std": [0, 0, 0]}}}, "'data.std' must be three numbers in [0.01, 10]"),
        ({"config": {"data": {"std": [1e-30] * 3}}}, "'data.std' must be three numbers in [0.01, 10]"),
        ({"config": {"data": {"image_size": 16384}}}, "'data.image_size' must be positive and at most 1,024"),
        ({"config": {"train": {"phases": [{"epoch": 0, "eval_size": 16384}]}}}, "eval_size=16384 must be positive"),
        ({"config": {"train": {"phases": [{}] * 1025}}}, "train.phases holds 1,025 entries, more than 1,024"),
        # an int past a float's range: math.isfinite raised OverflowError, a traceback on every requeue
        ({"schedule": {"continues": {"step": 0, "base_lr": 10**400}}}, "schedule.continues.base_lr is 1000"),
    ],
)
def test_meta_json_values_are_checked_before_use(ckpt, changes, expect):
    edit_meta(ckpt, **changes)
    problem = store.verify(ckpt)
    assert problem is not None and expect.replace("a int", "a") in problem.replace("an int", "a").replace(
        "a int", "a"
    ), problem


def test_a_meta_json_recording_a_phase_evaluated_past_twice_its_size_passes_its_check(ckpt):
    """A run evaluating its 8 px phase at 20 px (progressive training validates at the final size): its
    checkpoints pass their check, where a ratio bound on eval_size failed them all and the automatic resume moved
    every one aside and started over, exit 0."""
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["config"]["train"]["phases"] = [{"epoch": 0, "image_size": 8, "eval_size": 20}, {"epoch": 2, "image_size": 16}]
    (ckpt / "meta.json").write_text(json.dumps(meta))
    assert store.verify(ckpt) is None


def test_evaluate_says_its_own_fix_for_a_recorded_config_that_fails_its_check(ckpt):
    """vitlarge.evaluate's line for it named train.py's options (--resume an older folder, or omit --resume)."""
    from tests.helpers import call_main

    meta = json.loads((ckpt / "meta.json").read_text())
    meta["config"]["train"]["micro_batch"] = 0
    (ckpt / "meta.json").write_text(json.dumps(meta))
    recipe = str(ROOT / "recipes" / "demo_digits.py")
    r = call_main("vitlarge.evaluate", "--config", recipe, "--checkpoint", str(ckpt), "data.source=synthetic")
    assert r.returncode == 2 and r.stderr.splitlines() == [
        f"error: checkpoint {ckpt} fails its check (meta.json's config: 'train.micro_batch' must be positive, got 0); "
        "pass another checkpoints/step_* folder or an exported model folder as --checkpoint"
    ], r.stderr


def test_deep_nesting_is_one_line(ckpt):
    (ckpt / "meta.json").write_text("[" * 200_000 + "]" * 200_000)
    assert store.verify(ckpt) == "meta.json is nested too deeply to be a checkpoint's"


def test_a_negative_step_moves_no_good_checkpoint_aside(tmp_path, ckpt, cfg):
    """Before: a newer checkpoint whose meta.json said step -5 passed its check (meta.json is not
    checksummed), was chosen, and every checkpoint after step -5 (all of them) was moved aside."""
    crafted = ckpt.parent / "step_0000002"
    crafted.mkdir()
    for f in ckpt.iterdir():
        (crafted / f.name).write_bytes(f.read_bytes())
    meta = json.loads((crafted / "meta.json").read_text())
    (crafted / "meta.json").write_text(json.dumps({**meta, "step": -5}))
    chosen = resume.choose(ckpt.parent.parent, None, make(cfg)[0], cfg).path
    assert chosen == ckpt
    assert ckpt.is_dir() and store.verify(ckpt) is None


@pytest.mark.parametrize(
    "content, expect",
    [
        ({"scaler": {}, "data": None}, "rank_00000.pt lacks rng, scaler or data"),
        ({"rng": {"torch": torch.zeros(3, dtype=torch.uint8)}, "scaler": {}, "data": None}, "torch RNG state"),
        (argparse.Namespace(x=1), "rank_00000.pt holds objects other than tensors and numbers"),
        (b"not a torch file", "rank_00000.pt is not a torch file"),
    ],
)
def test_rank_files_are_checked_before_use(ckpt, cfg, content, expect):
    f = ckpt / "rank_00000.pt"
    if isinstance(content, bytes):
        f.write_bytes(content)
    else:
        torch.save(content, f)
    reseal(ckpt)
    with pytest.raises(layout.Unusable) as e:
        store.read(ckpt, make(cfg)[0], cfg)
    assert expect in str(e.value)
    assert "weights_only" not in str(e.value) and "\n" not in str(e.value)


def test_a_damaged_export_is_one_line(tmp_path, cfg):
    export = tmp_path / "model"
    export.mkdir()
    (export / "config.json").write_text("{}")
    (export / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + b"{}")  # a header length past the end
    with pytest.raises(UserError) as e:
        ckpt_weights.load_model_weights(export, make(cfg)[0], cfg)
    assert "model.safetensors is not a safetensors file" in str(e.value) and "\n" not in str(e.value)


def test_resume_copies_only_the_listed_files(tmp_path, ckpt, cfg):
    secret = tmp_path / "secret"
    secret.write_text("not yours")
    (ckpt / "planted").symlink_to(secret)
    chosen = resume.choose(tmp_path / "mine", ckpt, make(cfg)[0], cfg).path
    assert chosen.parent == tmp_path / "mine" / "checkpoints"
    assert "planted" not in {p.name for p in chosen.iterdir()}
    assert store.verify(chosen) is None


# Writes into a handed-over workdir: a planted link never takes a write outside it.


def _outside(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep")
    return outside


def _untouched(outside: Path) -> bool:
    return sorted(p.name for p in outside.iterdir()) == ["precious"] and (outside / "precious").read_text() == "keep"


def test_a_checkpoints_folder_that_is_a_link_is_refused_in_one_line(tmp_path):
    outside = _outside(tmp_path)
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "checkpoints").symlink_to(outside)
    with pytest.raises(UserError, match=r"checkpoints is a symbolic link .*remove the link") as e:
        ckpt_workdir.check_writable(workdir, 0)
    assert "\n" not in str(e.value) and _untouched(outside)


def test_a_planted_write_probe_link_is_removed_not_followed(tmp_path):
    outside = _outside(tmp_path)
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / ".write_test_0").symlink_to(outside / "created_through_the_link")
    ckpt_workdir.check_writable(workdir, 0)
    assert _untouched(outside) and not (workdir / ".write_test_0").exists()


def test_planted_temporary_folders_never_take_a_checkpoint_or_export_outside(tmp_path, cfg):
    from vitlarge.checkpoint.export import export

    outside = _outside(tmp_path)
    workdir = tmp_path / "run"
    (workdir / "checkpoints").mkdir(parents=True)
    (workdir / "checkpoints" / ".step_0000002.tmp").symlink_to(outside)
    (workdir / ".model.tmp").symlink_to(outside)
    model, opt, scaler = trained(cfg)
    try:
        store.save(workdir, RunState(model, opt, scaler, step=2, data="state"), cfg, keep=3)
    except UserError as e:
        assert "\n" not in str(e)
    try:
        export(workdir, model, cfg)
    except UserError as e:
        assert "\n" not in str(e)
    assert _untouched(outside)


# Found by the hostile review: routes through the allowed classes themselves.


def _index_bytes(ops: bytes, original: Path) -> bytes:
    return b"\x80\x04" + ops + b"0" + (original / ".metadata").read_bytes()[2:]


@pytest.mark.parametrize(
    "module, name",
    [("torch.distributed.checkpoint.metadata", "Metadata"), ("pathlib", "PosixPath"), ("torch", "Size")],
)
def test_a_refused_index_cannot_change_a_class_for_the_rest_of_the_process(ckpt, module, name):
    """BUILD on a class object runs setattr(cls, ...) during the load, before any check: before, a 60-byte index
    set PosixPath._str and every later write of the process went to a file of the forger's choosing."""
    import pathlib

    from torch.distributed.checkpoint import metadata

    before = (dict(vars(metadata.Metadata)), dict(vars(pathlib.PosixPath)))
    state = b"N}" + _str("_str") + _str("/tmp/hijacked") + b"s\x86"  # (None, {"_str": ...}): slot state
    (ckpt / ".metadata").write_bytes(_index_bytes(_global(module, name) + state + b"b", ckpt))
    reseal(ckpt)
    assert "which a DCP index never holds" in store.verify(ckpt)
    assert (dict(vars(metadata.Metadata)), dict(vars(pathlib.PosixPath))) == before
    assert str(Path("/a") / "b") == "/a/b"


def test_a_small_index_cannot_build_large_objects_from_references(ckpt):
    """A path argument named many times (two bytes each) built a new split path each time: ~4 MB per 2 bytes."""
    long = b"\x8d" + struct.pack("<Q", 200_000) + b"a/" * 100_000  # BINUNICODE8
    ops = long + b"\x94"  # MEMOIZE
    calls = b"".join(_call(_global("pathlib", "PosixPath"), b"h\x00") + b"0" for _ in range(50))
    (ckpt / ".metadata").write_bytes(_index_bytes(ops + b"0" + calls, ckpt))
    reseal(ckpt)
    assert "holds a path that is not text of at most 4096 characters" in store.verify(ckpt)


def test_a_compressed_rank_file_is_refused_before_torch_load_inflates_it(ckpt, cfg):
    """A 195 KB rank file with a DEFLATE entry held a 200 MB tensor; torch.save never compresses."""
    import zipfile

    f = ckpt / "rank_00000.pt"
    with zipfile.ZipFile(f) as z:
        entries = {i.filename: z.read(i) for i in z.infolist()}
    with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, data in entries.items():
            z.writestr(name, data)
    reseal(ckpt)
    with pytest.raises(layout.Unusable, match="rank_00000.pt holds compressed entries"):
        store.read(ckpt, make(cfg)[0], cfg)


def test_a_data_range_that_is_not_a_torch_archive_is_refused(ckpt):
    md = dcp_index.read_index(ckpt)
    info = next(iter(md.storage_data.values()))
    data = bytearray((ckpt / info.relative_path).read_bytes())
    data[info.offset : info.offset + info.length] = b"\0" * info.length
    (ckpt / info.relative_path).write_bytes(bytes(data))
    reseal(ckpt)
    assert f"__0_0.distcp at byte {info.offset:,} is not a torch file" in store.verify(ckpt)


def test_weights_stored_as_bytes_are_refused(ckpt):
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    _index_with(ckpt, lambda md: md.state_dict_metadata.__setitem__("model.cls_token", BytesStorageMetadata()))
    assert ".metadata: model.cls_token is stored as bytes, not as a tensor" in store.verify(ckpt)


def test_chunks_must_cover_a_tensor_exactly_once(ckpt):
    """A tensor without chunks (or with overlapping ones) left uninitialised memory in the weights read."""
    _index_with(ckpt, lambda md: setattr(md.state_dict_metadata["model.cls_token"], "chunks", []))
    assert "the chunks of model.cls_token do not cover its shape exactly once" in store.verify(ckpt)


def test_chunk_tiling_rule_at_fsdp_scale():
    """128 row shards of a 1000-row tensor (uneven, some empty) tile it; a gap or an overlap does not."""
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata as C

    rows = [1000 * r // 128 for r in range(129)]
    chunks = [C(torch.Size([a, 0]), torch.Size([b - a, 64])) for a, b in zip(rows, rows[1:])]
    assert dcp_index._chunks_tile(chunks, torch.Size([1000, 64]))
    overlap = chunks[:-1] + [C(torch.Size([rows[-2] - 1, 0]), torch.Size([rows[-1] - rows[-2], 64]))]
    assert not dcp_index._chunks_tile(overlap, torch.Size([1000, 64]))
    assert not dcp_index._chunks_tile(chunks[1:], torch.Size([1000, 64]))


# Found by the second hostile review: memory in proportion to a file's size, and files that pass their checks.

FLOOD = 128 << 10  # a flood of 128 KB: its budget (pickles.FLOOR + 64 bytes a byte) is reached in ~0.2 s


def _refused_within(fn, error: type[Exception]) -> tuple[str, int]:
    """The message of the ``error`` that ``fn`` raises, and the peak of Python's allocations (``tracemalloc``) in it."""
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(error) as e:
            fn()
        return str(e.value), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _budget(size: int) -> int:
    from vitlarge.checkpoint.trust import pickles

    return pickles.FLOOR + pickles.PER_BYTE * size


def test_an_index_that_floods_memory_is_refused_within_its_budget(ckpt):
    """``MARK`` then a set per byte: 230 bytes of objects a byte (a 20 MB index took 5.3 GiB, the 1 GiB cap
    allowed ~230 GiB) before the index was refused as no Metadata; now charged as it is built, refused at the budget."""
    (ckpt / ".metadata").write_bytes(b"\x80\x04(" + b"\x8f" * FLOOD + b"l.")
    reseal(ckpt)
    problem, peak = _refused_within(
        lambda: dcp_index.read_index(ckpt), dcp_index.IndexProblem
    )  # every entry point's read
    assert problem.startswith(".metadata makes more than ") and "of objects from its 131,077 bytes" in problem
    assert peak < _budget(FLOOD) + (1 << 20), peak


def test_no_pickle_is_budgeted_past_the_ceiling_whatever_its_size():
    """The budget grew with the file alone (64 B a byte): a crafted ``.metadata`` at its 1 GiB size cap bought
    64 GiB of objects. Now no pickle past `pickles.CEILING` (the largest real index's charge), and the refusal still
    names the file's own size."""
    from vitlarge.checkpoint.trust import pickles

    at_cap = pickles.Budget(dcp_index.INDEX_MAX_BYTES, ".metadata")
    assert at_cap.limit == pickles.CEILING < _budget(dcp_index.INDEX_MAX_BYTES)
    assert pickles.Budget(20 << 20, ".metadata").limit == _budget(20 << 20)  # below it: as before
    at_cap.left = 0
    with pytest.raises(pickle.UnpicklingError, match=f"objects from its {dcp_index.INDEX_MAX_BYTES:,} bytes"):
        at_cap.charge("EMPTY_DICT")


def test_a_rank_files_pickle_that_floods_memory_is_refused_before_torch_load(ckpt):
    """The same flood in a rank file's data.pkl (torch's weights_only unpickler takes sets): its opcodes are charged
    before torch.load runs, building nothing."""
    import zipfile

    f = ckpt / "rank_00000.pt"
    with zipfile.ZipFile(f) as z:
        entries = {i.filename: z.read(i) for i in z.infolist()}
    with zipfile.ZipFile(f, "w") as z:  # stored, as torch.save writes
        for name, data in entries.items():
            z.writestr(name, b"\x80\x02](" + b"\x8f" * FLOOD + b"e." if name.endswith("/data.pkl") else data)
    reseal(ckpt)
    problem, peak = _refused_within(lambda: torch_load(ckpt, "rank_00000.pt"), layout.Unusable)  # store.read's
    assert "rank_00000.pt has a data.pkl that makes more than " in problem and "\n" not in problem
    assert peak < _budget(FLOOD) + (1 << 20), peak


def test_init_from_refuses_a_compressed_torch_file_before_inflating_it(tmp_path, cfg):
    """2 MB of DEFLATE holding a 2 GiB zero tensor peaked at 3.0 GiB before its one line: the rank files' check
    (entries stored, as torch.save writes them) applies to init_from's .pth too (here 64 MiB in 64 KB)."""
    import zipfile

    plain = tmp_path / "plain.pth"
    torch.save({"state_dict": {"w": torch.zeros(16 << 20)}}, plain)
    packed = tmp_path / "packed.pth"
    with zipfile.ZipFile(plain) as src, zipfile.ZipFile(packed, "w", compression=zipfile.ZIP_DEFLATED) as dst:
        for i in src.infolist():
            dst.writestr(i.filename, src.read(i))
    assert packed.stat().st_size < 1 << 20
    with pytest.raises(UserError) as e:
        init_from.read_state_dict(packed)
    assert str(e.value) == (
        f"model.init_from={packed}: {packed} holds compressed entries (torch.save writes none); pass a "
        "model.safetensors or a torch checkpoint of a timm model"
    )


def test_an_exports_config_json_that_is_a_link_is_refused(tmp_path, cfg):
    """evaluate read the outside file through an export's config.json link (and printed its input_size 3x4242x4242)."""
    from vitlarge.checkpoint.export import export

    model, _, _ = trained(cfg)
    folder = export(tmp_path / "run", model, cfg)
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({"pretrained_cfg": {"input_size": [3, 4242, 4242]}}))
    (folder / "config.json").unlink()
    (folder / "config.json").symlink_to(outside)
    other = load_recipe(ROOT / "recipes" / "demo_digits.py")
    other.data.image_size = 32
    with pytest.raises(UserError) as e:
        ckpt_weights.load_model_weights(folder, make(other)[0], other)
    assert str(e.value) == (
        f"{folder}: config.json is a symbolic link (refused: every file must be inside the folder itself); "
        "pass an exported model folder or a checkpoints/step_* folder"
    )


def _newer_copy(ckpt: Path, **config) -> Path:
    """A copy of ``ckpt`` as the workdir's next step, its meta.json's recorded config edited (``train__epochs``)."""
    crafted = ckpt.parent / "step_0000002"
    crafted.mkdir()
    for f in ckpt.iterdir():
        (crafted / f.name).write_bytes(f.read_bytes())
    meta = json.loads((crafted / "meta.json").read_text())
    for key, value in config.items():
        section, name = key.split("__")
        meta["config"][section][name] = value
    (crafted / "meta.json").write_text(json.dumps({**meta, "step": 2}))
    return crafted


@pytest.mark.parametrize(
    "config, expect",
    [
        ({"train__micro_batch": 0}, "'train.micro_batch' must be positive, got 0"),
        ({"train__global_batch": 0}, "'train.global_batch' must be positive, got 0"),
        ({"train__epochs": 1e308}, "'train.epochs' must be positive and at most 1,000,000, got 1e+308"),
    ],
)
def test_a_recorded_config_no_recipe_may_give_is_passed_over_by_an_automatic_resume(ckpt, cfg, caplog, config, expect):
    """meta.json is not checksummed: a recorded micro_batch=0 (or global_batch=0, epochs=1e308) passed verify and the
    resume's phase check raised ZeroDivisionError (OverflowError) on every rerun; now the schema's rules apply."""
    crafted = _newer_copy(ckpt, **config)
    assert store.verify(crafted) == f"meta.json's config: {expect}"
    chosen = resume.choose(ckpt.parent.parent, None, make(cfg)[0], cfg, num_train_examples=1437).path
    assert chosen == ckpt
    assert caplog.records[0].getMessage() == (
        f"warning: checkpoint {crafted} fails its check (meta.json's config: {expect}); passed over"
    )


@pytest.mark.parametrize(
    "config, expect",
    [
        ({"data__image_size": 4000}, "'data.image_size' must be positive and at most 1,024, got 4000"),
        (
            {"data__image_size": 1000},
            "its meta.json records data.image_size=1000, but its weights are of a 16 px model (pos_embed [1, 17, 96]); "
            "the file was edited or damaged: use another checkpoint",
        ),
        ({"train__epochs": 1e308}, "'train.epochs' must be positive and at most 1,000,000, got 1e+308"),
    ],
)
def test_evaluate_checks_a_recorded_config_before_it_builds_a_model(ckpt, config, expect):
    """evaluate built the model at the recorded data.image_size (16000: 6.6 GiB) before refusing it, and planned the
    recorded epochs=1e308 into an OverflowError; one line now, before any model or process group."""
    from tests.helpers import call_main

    crafted = _newer_copy(ckpt, **config)
    recipe = str(ROOT / "recipes" / "demo_digits.py")
    r = call_main("vitlarge.evaluate", "--config", recipe, "--checkpoint", str(crafted), "data.source=synthetic")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and expect in r.stderr, r.stderr


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # dcp.save in this one process, as intended
def test_optimizer_settings_of_another_kind_are_refused_before_they_reach_the_optimizer(ckpt, cfg):
    """A checkpoint re-saved by dcp.save with param_groups[*].eps='oops' passes verify (every byte as recorded) and
    raised TypeError in the LAMB kernel at the first step; the settings are typed against the optimizer's own."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, opt, scaler = trained(cfg)
    model_state, optim_state = get_state_dict(model, opt)
    for group in optim_state["param_groups"]:
        group["eps"] = "oops"
    for f in [*ckpt.glob("*.distcp"), ckpt / ".metadata"]:
        f.unlink()
    writer = dcp.FileSystemWriter(str(ckpt), single_file_per_rank=True)
    dcp.save({"model": model_state, "optimizer": optim_state}, storage_writer=writer, no_dist=True)
    reseal(ckpt)
    assert store.verify(ckpt) is None
    m, o, s = make(cfg)
    with pytest.raises(UserError) as e:
        resume.restore(ckpt, RunState(m, o, s), cfg)
    assert str(e.value) == (
        f"checkpoint {ckpt} holds optimizer settings this run's optimizer does not write (param_groups[0].eps is "
        "'oops', a str; it writes 1e-06, a float); --resume another checkpoint, or start a new workdir with "
        "model.init_from=<the checkpoint>"
    )
    assert all(g["eps"] == 1e-6 for g in o.param_groups)


def _vit_shapes(depth: int, width: int = 384) -> dict[str, tuple[int, ...]]:
    """A ViT/16's state dict shapes (timm's names), without building it."""
    shapes = {"cls_token": (1, 1, width), "pos_embed": (1, 197, width), "patch_embed.proj.weight": (width, 3, 16, 16)}
    shapes["patch_embed.proj.bias"] = (width,)
    for b in range(depth):
        for name, shape in (
            ("norm1.weight", (width,)),
            ("norm1.bias", (width,)),
            ("attn.qkv.weight", (3 * width, width)),
            ("attn.qkv.bias", (3 * width,)),
            ("attn.proj.weight", (width, width)),
            ("attn.proj.bias", (width,)),
            ("norm2.weight", (width,)),
            ("norm2.bias", (width,)),
            ("mlp.fc1.weight", (4 * width, width)),
            ("mlp.fc1.bias", (4 * width,)),
            ("mlp.fc2.weight", (width, 4 * width)),
            ("mlp.fc2.bias", (width,)),
        ):
            shapes[f"blocks.{b}.{name}"] = shape
    return {
        **shapes,
        "norm.weight": (width,),
        "norm.bias": (width,),
        "head.weight": (1000, width),
        "head.bias": (1000,),
    }


def test_a_real_fsdp_index_is_charged_well_within_its_budget():
    """The index of 8 FSDP ranks of a ViT-S/16 cut to 2 blocks (a second to unpickle), with LAMB's two moments (a
    chunk per rank per tensor, as `fully_shard` writes it): charged the same both ways in (as it is built; by the
    scan that builds nothing) and under 0.8 of `pickles.PER_BYTE` a byte (ViT-B's, 12 blocks at 16 and 128 ranks:
    40)."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )

    from vitlarge.checkpoint.trust import pickles

    ranks, entries, storage = 8, {}, {}
    for prefix in ("model.", "optimizer.state.exp_avg.", "optimizer.state.exp_avg_sq."):
        for name, shape in _vit_shapes(depth=2).items():
            fqn, chunks, per = prefix + name, [], -(-shape[0] // ranks)
            for r in range(-(-shape[0] // per)):
                offsets = torch.Size([r * per] + [0] * (len(shape) - 1))
                chunks.append(ChunkStorageMetadata(offsets, torch.Size([min(per, shape[0] - r * per), *shape[1:]])))
                storage[MetadataIndex(fqn, offsets, 0)] = _StorageInfo(f"__{r}_0.distcp", 4096 * r, 512)
            entries[fqn] = TensorStorageMetadata(TensorProperties(dtype=torch.float32), torch.Size(shape), chunks)
    raw = pickle.dumps(Metadata(entries, {k: tuple(k.split(".")) for k in entries}, storage_data=storage), protocol=4)
    unpickler = dcp_index._MetadataUnpickler(io.BytesIO(raw), len(raw))
    assert type(unpickler.load()) is Metadata
    built = unpickler.budget.limit - unpickler.budget.left
    scanned = pickles.Budget(len(raw), "x")
    original = pickles.Budget
    pickles.Budget = lambda size, what: scanned
    try:
        pickles.scan(io.BytesIO(raw), len(raw), "x")
    finally:
        pickles.Budget = original
    assert abs(built - (scanned.limit - scanned.left)) <= pickles.SLOT  # STOP ends the load before its charge
    assert built < 0.8 * pickles.PER_BYTE * len(raw), built / len(raw)


# Every reader of a checkpoint's weights runs the resume's check; a checkpoint that passes it but cannot be restored,
# and a step folder that is a link, are passed over by an automatic resume as a damaged one is.


def _damage_weights_in_place(ckpt: Path, cfg) -> None:
    """Overwrites one weight tensor's bytes inside ``__0_0.distcp`` with zeros: size and meta.json kept, so only the
    CRC32C can tell (a disk or a copy that went wrong, or an edit)."""
    weight = trained(cfg)[0].state_dict()["blocks.0.mlp.fc1.weight"]
    data = (ckpt / "__0_0.distcp").read_bytes()
    raw = weight.contiguous().numpy().tobytes()
    at = data.find(raw)
    assert at > 0 and len(raw) > 4096
    (ckpt / "__0_0.distcp").write_bytes(data[:at] + bytes(len(raw)) + data[at + len(raw) :])


def test_a_checkpoint_damaged_in_place_is_refused_by_every_reader_of_its_weights(ckpt, cfg):
    """Evaluated at 30% top-1 instead of 58% (exit 0) and fine-tuned from without a word, though the resume refused
    it: evaluate's and init_from's reads now run the same check (sizes, CRC32C, index)."""
    _damage_weights_in_place(ckpt, cfg)
    problem = store.verify(ckpt)
    assert problem is not None and problem.startswith("__0_0.distcp has CRC32C ")
    with pytest.raises(UserError) as e:  # vitlarge.evaluate --checkpoint
        ckpt_weights.load_model_weights(ckpt, make(cfg)[0], cfg)
    assert str(e.value) == (
        f"checkpoint {ckpt} fails its check ({problem}); pass another checkpoints/step_* folder or an exported "
        "model folder as --checkpoint"
    )
    with pytest.raises(UserError) as e:  # model.init_from
        init_from.read_state_dict(ckpt)
    assert str(e.value) == f"model.init_from={ckpt}: {problem}; pass a complete checkpoint or an export folder"


def _craft_rank_data(ckpt: Path, _cfg) -> str:
    state = torch_load(ckpt, "rank_00000.pt")
    torch.save({**state, "data": 7}, ckpt / "rank_00000.pt")
    return "rank_00000.pt holds a data state that is not a string"


def _save_eps(ckpt: Path, cfg, eps) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(*trained(cfg)[:2])
    for group in optim_state["param_groups"]:
        group["eps"] = eps
    for f in [*ckpt.glob("*.distcp"), ckpt / ".metadata"]:
        f.unlink()
    dcp.save(
        {"model": model_state, "optimizer": optim_state}, storage_writer=dcp.FileSystemWriter(str(ckpt)), no_dist=True
    )


def _craft_eps(ckpt: Path, cfg) -> str:
    _save_eps(ckpt, cfg, "oops")
    return "optimizer settings this run's optimizer does not write: param_groups[0].eps is 'oops', a str; it writes 1e-06, a float"


def _craft_eps_past_floats(ckpt: Path, cfg) -> str:
    """An int no float holds: ``math.isfinite`` raised OverflowError inside the choice, a traceback per requeue."""
    _save_eps(ckpt, cfg, 10**400)
    return (
        "optimizer settings this run's optimizer does not write: "
        f"param_groups[0].eps is '{'1' + '0' * 39}', a int; it writes 1e-06, a float"
    )


def _craft_eps_object(ckpt: Path, cfg) -> str:
    """An object where a number belongs: torch's "Weights only load failed ... do those steps only if you trust the
    source", with ANSI escapes, was the passed-over line's reason."""
    _save_eps(ckpt, cfg, argparse.Namespace(x=1))
    return "its data holds objects other than tensors and numbers (refused)"


def _scaler_craft(**values):
    def craft(ckpt: Path, _cfg) -> str:
        state = torch_load(ckpt, "rank_00000.pt")
        torch.save({**state, "scaler": {**state["scaler"], **values}}, ckpt / "rank_00000.pt")
        key, value = next(iter(values.items()))
        want = "from 1 to 2,147,483,648" if key == "growth_interval" else "a finite number > 0"
        return f"rank_00000.pt holds a loss-scaler {key} of {str(value)[:40]}, not {want}"

    return craft


CANNOT_RESTORE = {
    "data state": _craft_rank_data,
    "eps": _craft_eps,
    "eps past floats": _craft_eps_past_floats,
    "eps an object": _craft_eps_object,
    "scale nan": _scaler_craft(scale=float("nan")),  # resumed and skipped every step, exit 0
}


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # dcp.save in this one process, as intended
@pytest.mark.parametrize("craft", list(CANNOT_RESTORE.values()), ids=list(CANNOT_RESTORE))
def test_a_checkpoint_that_passes_its_files_but_cannot_be_restored_is_passed_over(tmp_path, ckpt, cfg, caplog, craft):
    """Each requeue stopped at the restore (exit 2) and never used the valid checkpoint before it; now the restorable
    state is checked in rank 0's choice, before anything is loaded, and the checkpoint passed over in one line."""
    crafted = _newer_copy(ckpt)
    why = craft(crafted, cfg)
    reseal(crafted)
    assert store.verify(crafted) is None  # every byte as recorded
    model, opt, scaler = make(cfg)
    fresh = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(layout.Unusable) as e:  # --resume X: one line
        resume.choose(tmp_path / "mine", crafted, model, cfg, optimizer=opt)
    assert why in str(e.value) and "\n" not in str(e.value)
    assert all(torch.equal(v, fresh[k]) for k, v in model.state_dict().items())
    workdir = ckpt.parent.parent
    found = ckpt_checkpointer.Checkpointer(workdir, cfg).attach(model, opt, scaler).resume(None, None)
    assert found.path == ckpt and found.loaded is not None and found.loaded.step == 1
    assert [r.getMessage() for r in caplog.records if "passed over" in r.getMessage()] == [
        f"warning: checkpoint {crafted} fails its check ({why}); passed over"
    ]
    assert not crafted.exists() and len(list(workdir.glob("checkpoints/abandoned_*/step_0000002"))) == 1


@pytest.mark.parametrize(
    "values, expect",
    [
        ({"scale": 10**400}, f"scale of {'1' + '0' * 39}, not a finite number > 0"),  # a traceback at the restore
        ({"scale": 0.0, "growth_factor": 0.0}, "scale of 0.0, not a finite number > 0"),  # trained, unscaled
        ({"scale": -1.0}, "scale of -1.0, not a finite number > 0"),
        ({"growth_factor": 0.0}, "growth_factor of 0.0, not a finite number > 0"),
        ({"backoff_factor": float("inf")}, "backoff_factor of inf, not a finite number > 0"),
        ({"growth_interval": 0}, "growth_interval of 0, not from 1 to 2,147,483,648"),
        ({"growth_interval": 2**31 + 1}, "growth_interval of 2147483649, not from 1 to 2,147,483,648"),
        ({"growth_interval": 2.0}, "growth_interval of 2.0, not from 1"),
    ],
)
def test_a_loss_scaler_state_no_run_can_continue_fails_the_check(original, values, expect):
    """The rank file's check (`rank_state_problem`, in rank 0's choice as in the restore) of each scaler value; the
    whole path, passed over by an automatic resume, is the test above's "scale nan"."""
    state = torch_load(original, "rank_00000.pt")
    assert rank_state_problem(state) is None and state["scaler"]
    problem = rank_state_problem({**state, "scaler": {**state["scaler"], **values}})
    assert problem is not None and problem.startswith(f"holds a loss-scaler {expect}"), problem


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_an_unrestorable_checkpoint_alone_starts_the_run_fresh(ckpt, cfg):
    """As with a damaged one: nothing left to resume from, the run starts from scratch with its own weights."""
    _craft_rank_data(ckpt, cfg)
    reseal(ckpt)
    model, opt, scaler = make(cfg)
    fresh = {k: v.clone() for k, v in model.state_dict().items()}
    found = ckpt_checkpointer.Checkpointer(ckpt.parent.parent, cfg).attach(model, opt, scaler).resume(None, None)
    assert found.path is None and found.loaded is None
    assert all(torch.equal(v, fresh[k]) for k, v in model.state_dict().items()) and not opt.state


def test_a_step_folder_that_is_a_link_is_passed_over_and_never_read_nor_linked(tmp_path, ckpt, cfg, caplog):
    """A ``checkpoints/step_*`` link to a folder outside the workdir: the resume CRC-read it there, hard-linked its
    files into ``.step_*.tmp/`` and stopped on every rerun with "cannot copy ... free space there"."""
    outside = tmp_path / "outside" / "step_0000005"
    outside.mkdir(parents=True)
    for f in ckpt.iterdir():
        (outside / f.name).write_bytes(f.read_bytes())
    edit_meta(outside, step=5)
    assert store.verify(outside) is None  # a valid checkpoint, elsewhere
    workdir = ckpt.parent.parent
    link = workdir / "checkpoints" / "step_0000005"
    link.symlink_to(outside, target_is_directory=True)
    before = {f.name: (f.stat().st_nlink, f.stat().st_atime_ns) for f in outside.iterdir()}
    chosen = resume.choose(workdir, None, make(cfg)[0], cfg).path
    assert chosen == ckpt
    assert [r.getMessage() for r in caplog.records if "passed over" in r.getMessage()] == [
        f"warning: checkpoint {link} fails its check (step_0000005 is a symbolic link, never followed: a "
        "checkpoint is a folder of its own); passed over"
    ]
    assert {f.name: (f.stat().st_nlink, f.stat().st_atime_ns) for f in outside.iterdir()} == before
    assert not link.is_symlink() and not list(workdir.glob("checkpoints/.step_*"))
    assert [p.is_symlink() for p in workdir.glob("checkpoints/abandoned_*/step_0000005")] == [True]  # the link moved


def test_optimizer_settings_of_another_recipe_are_the_restores_error_never_passed_over(ckpt, cfg, caplog):
    """An optional setting this recipe sets and the checkpoint's left unset (``max_trust_ratio``: a number here,
    None there) is an edit, not damage: passing over every checkpoint of the run would start it from scratch, so the
    restore keeps its one line and nothing is moved aside."""
    model, opt, scaler = make(cfg)
    for group in opt.param_groups:
        group["max_trust_ratio"] = 10.0
    checkpoints = ckpt_checkpointer.Checkpointer(ckpt.parent.parent, cfg).attach(model, opt, scaler)
    with pytest.raises(UserError, match=r"param_groups\[0\].max_trust_ratio is 'None', a NoneType; it writes 10.0"):
        checkpoints.resume(None, None)
    assert not [r for r in caplog.records if "passed over" in r.getMessage()]
    assert ckpt.is_dir() and not list(ckpt.parent.glob("abandoned_*"))


def test_a_link_the_user_names_is_followed_once_to_the_folder_it_names(tmp_path, ckpt, cfg, caplog):
    """A user's own ``latest -> .../checkpoints/step_0000001``: ``--resume``, ``vitlarge.evaluate --checkpoint`` and
    ``model.init_from`` all refused it once the resume's step_* links were ("is a symbolic link, never followed"),
    though it worked before. Links are refused only where the workdir is listed; a path the user names is resolved
    once and the folder it names checked (sizes, CRC32C, index) and read."""
    latest = tmp_path / "latest"
    latest.symlink_to(ckpt, target_is_directory=True)
    model, opt, scaler = make(cfg)
    found = ckpt_checkpointer.Checkpointer(tmp_path / "mine", cfg).attach(model, opt, scaler).resume(latest, None)
    assert found.loaded is not None and found.loaded.step == 1
    assert found.path == tmp_path / "mine" / "checkpoints" / "step_0000001" and not found.path.is_symlink()
    ckpt_weights.load_model_weights(latest, make(cfg)[0], cfg)  # vitlarge.evaluate --checkpoint
    weights, _ = init_from.read_state_dict(latest)  # model.init_from
    assert set(weights) == set(make(cfg)[0].state_dict())
    _damage_weights_in_place(ckpt, cfg)  # what the link names is checked as a named folder is
    with pytest.raises(UserError, match=r"fails its check \(__0_0.distcp has CRC32C "):
        ckpt_weights.load_model_weights(latest, make(cfg)[0], cfg)


def test_step_links_count_as_no_checkpoint(tmp_path, ckpt, cfg):
    """A fresh fine-tuning workdir holding only a dangling (or file) ``step_*`` link counted as a resume: init_from was
    skipped and the first run stopped with "holds no usable checkpoint" after passing the link over. Links now count
    toward nothing: not a resume, not ``keep`` when pruning, never a folder a hint suggests."""
    from vitlarge.run.job import is_resume

    fresh = tmp_path / "finetune"
    (fresh / "checkpoints").mkdir(parents=True)
    (fresh / "checkpoints" / "step_0000005").symlink_to("nowhere")
    (fresh / "checkpoints" / "step_0000006").symlink_to(ckpt / "meta.json")
    assert not ckpt_checkpointer.Checkpointer(fresh, cfg).any()
    assert not is_resume(dataclasses.replace(cfg, workdir=str(fresh)), None)
    with pytest.raises(layout.Unusable) as e:
        layout.read_meta(fresh)
    assert (
        str(e.value)
        == f"{fresh} is not a complete vitlarge checkpoint (no meta.json); pass a checkpoints/step_* folder"
    )
    # prune: real step_1 and step_2, a link step_3; keeping 2 with step 4 written keeps step_2, not the link
    workdir, outside = ckpt.parent.parent, tmp_path / "outside"
    shutil.copytree(ckpt, ckpt.parent / "step_0000002")
    shutil.copytree(ckpt, outside)
    (ckpt.parent / "step_0000003").symlink_to(outside, target_is_directory=True)
    store.prune(workdir, keep=2, step=4)
    assert [p.name for p in layout.list_checkpoints(workdir)] == ["step_0000002", "step_0000003"]
    assert (ckpt.parent / "step_0000002" / "meta.json").is_file() and (outside / "meta.json").is_file()


def test_a_requeue_of_resume_names_the_checkpoint_of_its_line_it_passes_over(tmp_path, ckpt, cfg, caplog):
    """``--resume X`` again (a requeue) continues X's line from its newest checkpoint that passes; a newer one that
    fails was skipped without a word. Now it gets the automatic resume's one line, once."""
    requested = tmp_path / "X"
    edit_meta(ckpt, line=resume.lineage_of(requested))
    crafted = _newer_copy(ckpt)
    why = _craft_rank_data(crafted, cfg)
    reseal(crafted)
    chosen = resume.choose(ckpt.parent.parent, requested, make(cfg)[0], cfg, optimizer=make(cfg)[1])
    assert chosen.path == ckpt
    assert [r.getMessage() for r in caplog.records if "passed over" in r.getMessage()] == [
        f"warning: checkpoint {crafted} fails its check ({why}); passed over"
    ]


def test_the_choice_checks_only_the_rank_files_the_restore_reads(ckpt, cfg):
    """A 2-rank checkpoint resumed by 1 rank reads rank_00000.pt alone (another world size starts the loaders
    afresh), yet a damaged rank_00001.pt passed it over; and rank 0 read all of them, 20 ms each (~20 s a candidate
    at 1,024 ranks)."""
    state = torch_load(ckpt, "rank_00000.pt")
    torch.save({**state, "data": 7}, ckpt / "rank_00001.pt")
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["files"]["rank_00001.pt"] = {}
    (ckpt / "meta.json").write_text(json.dumps({**meta, "world_size": 2}))
    reseal(ckpt)
    assert store.verify(ckpt) is None
    assert store.restore_problem(ckpt, make(cfg)[1]) is None  # this process: world size 1
    torch.save({**state, "data": 7}, ckpt / "rank_00000.pt")
    reseal(ckpt)
    assert store.restore_problem(ckpt) == "rank_00000.pt holds a data state that is not a string"


@pytest.mark.parametrize(
    "edit, expect",
    [
        (
            lambda p: _index_with(
                p, lambda md: md.state_dict_metadata.pop("optimizer.state.patch_embed.proj.weight.exp_avg")
            ),
            ".metadata lacks optimizer.state.patch_embed.proj.weight.exp_avg, which the restore reads",
        ),
        (
            lambda p: _index_with(p, lambda md: md.state_dict_metadata.pop("model.pos_embed")),
            ".metadata lacks model.pos_embed, which the restore reads",
        ),
        (  # meta.json and the index disagree: damage, not another model (that is check_compatible's one line)
            lambda p: edit_meta(
                p, param_shapes={**json.loads((p / "meta.json").read_text())["param_shapes"], "pos_embed": [1, 17, 95]}
            ),
            ".metadata holds model.pos_embed of shape [1, 17, 96], meta.json's param_shapes say [1, 17, 95]",
        ),
    ],
    ids=["an exp_avg", "a weight", "a shape"],
)
def test_an_index_lacking_what_the_restore_reads_is_passed_over(ckpt, cfg, edit, expect, caplog):
    """A resealed index lacking one ``exp_avg`` passed every check and stopped every requeue with "cannot read
    checkpoint ... Missing key ...; check that every node sees it whole (shared file system)". The index's keys and
    shapes are now compared with what the restore asks for (metadata only, no tensor read)."""
    crafted = _newer_copy(ckpt)
    edit(crafted)
    assert store.verify(crafted) is None
    assert store.restore_problem(crafted, make(cfg)[1]) == expect
    assert resume.choose(ckpt.parent.parent, None, make(cfg)[0], cfg).path == ckpt
    assert [r.getMessage() for r in caplog.records if "passed over" in r.getMessage()] == [
        f"warning: checkpoint {crafted} fails its check ({expect}); passed over"
    ]


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_an_export_whose_weights_hold_nan_or_inf_is_one_line(tmp_path, cfg, bad):
    """Scored, such weights gave a top-1 of 10% and a loss of NaN (invalid JSON under --json) with exit 0."""
    from safetensors.torch import save_file

    export = tmp_path / "model"
    export.mkdir()
    (export / "config.json").write_text("{}")
    weights = {k: v.clone().contiguous() for k, v in make(cfg)[0].state_dict().items()}
    weights["head.bias"][3] = bad
    save_file(weights, str(export / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UserError) as e:
        ckpt_weights.load_model_weights(export, make(cfg)[0], cfg)
    line = str(e.value)
    assert "model.safetensors" in line and "head.bias holds NaN or inf" in line and "\n" not in line
    assert e.value.same_on_all_ranks  # every rank reads the same file: printed once


def test_a_checkpoint_whose_weights_hold_nan_is_one_line(tmp_path, cfg):
    """The checkpoint folder's read (DCP) gets the export's check: such weights are not scored."""
    model, opt, scaler = trained(cfg)
    with torch.no_grad():
        model.head.bias[2] = float("nan")
    path = store.save(tmp_path, RunState(model, opt, scaler, step=1, data="loader-state"), cfg, keep=3)
    with pytest.raises(UserError) as e:
        ckpt_weights.load_model_weights(path, make(cfg)[0], cfg)
    assert str(e.value) == (
        f"checkpoint {path} fails its check (its head.bias holds NaN or inf); pass another checkpoints/step_* folder "
        "or an exported model folder as --checkpoint"
    )
