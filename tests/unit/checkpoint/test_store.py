"""The checkpoint store (vitlarge/checkpoint/store.py) in one process: layout, exact resume, pruning, atomicity.

Uses the demo recipe's 0.46M-parameter ViT, the project's LAMB and a CPU GradScaler.
"""

import gc
import json
import random
import re
from pathlib import Path

import crc32c
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.helpers import ROOT, mounts
from tests.helpers.tiny_model import make, train_step, trained
from vitlarge.checkpoint import files as ckpt_files
from vitlarge.checkpoint import sharded, store
from vitlarge.checkpoint import weights as ckpt_weights
from vitlarge.checkpoint import workdir as ckpt_workdir
from vitlarge.checkpoint.state import RngState, RunState
from vitlarge.checkpoint.trust import index as dcp_index
from vitlarge.checkpoint.trust import layout as ckpt_layout
from vitlarge.checkpoint.trust import meta as meta_json
from vitlarge.checkpoint.weights import param_shapes
from vitlarge.config.load import load_recipe
from vitlarge.config.schema import Config
from vitlarge.errors import UserError
from vitlarge.model.vit import build_model

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def cfg():
    return load_recipe(ROOT / "recipes" / "demo_digits.py")


def draw():
    return torch.rand(3).tolist(), np.random.rand(3).tolist(), random.random(), random.gauss(0, 1)


def save(workdir, step, model, opt, scaler, cfg, keep=3, data="loader-state"):
    return store.save(workdir, RunState(model, opt, scaler, step=step, data=data), cfg, keep=keep)


def weights(path: Path) -> dict:
    """A checkpoint's full weights, read on this process (as evaluate and init_from do)."""
    return ckpt_weights.weights_of(path, ckpt_layout.read_meta(path))


def optimizer_state(path: Path) -> dict:
    """A one-process checkpoint's optimizer state, keyed by parameter name (DCP's layout)."""
    import warnings

    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "assuming the intent is to load in a single process"
        return _load_state_dict_from_keys(storage_reader=sharded.Reader(path))["optimizer"]


LAYOUT = [".metadata", "__0_0.distcp", "meta.json", "rank_00000.pt"]


def test_layout(tmp_path, cfg):
    model, opt, scaler = trained(cfg)
    path = save(tmp_path, 100, model, opt, scaler, cfg)
    assert path == tmp_path / "checkpoints" / "step_0000100"
    assert sorted(p.name for p in path.iterdir()) == LAYOUT
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_0000100"]  # no .tmp left
    meta = json.loads((path / "meta.json").read_text())
    assert meta["format_version"] == meta_json.FORMAT_VERSION
    assert (meta["step"], meta["world_size"], meta["model"]) == (100, 1, "vit_tiny_patch16_224")
    assert meta["param_shapes"]["pos_embed"] == [1, 17, 96]
    assert meta["config"] == json.loads(json.dumps(cfg.to_dict()))
    assert ckpt_layout.read_meta(path)["step"] == 100
    assert meta["optimizer_state"] is True
    assert set(weights(path)) == set(model.state_dict())
    # Every file's size and CRC32C (DCP's included), computed here independently of vitlarge.fileio.
    assert sorted(meta["files"]) == [n for n in LAYOUT if n != "meta.json"]
    for name, record in meta["files"].items():
        data = (path / name).read_bytes()
        assert record == {"bytes": len(data), "crc32c": f"{crc32c.crc32c(data):08x}"}
    assert store.verify(path) is None


def test_files_hold_no_pickled_objects(tmp_path, cfg):
    model, opt, scaler = trained(cfg)
    path = save(tmp_path, 1, model, opt, scaler, cfg)
    opt_state = optimizer_state(path)  # DCP's index through the restricted unpickler, its values weights_only
    rank = torch.load(path / "rank_00000.pt", weights_only=True)
    assert set(opt_state["state"]) == {n for n, p in model.named_parameters()}
    assert set(rank) == {"rng", "scaler", "data"} and rank["data"] == "loader-state"
    assert rank["scaler"]["scale"] == 2.0**12  # grew on each of the two steps


def test_load_restores_weights_optimizer_scaler_and_rng(tmp_path, cfg):
    model, opt, scaler = trained(cfg)
    torch.manual_seed(123), np.random.seed(123), random.seed(123)
    random.gauss(0, 1)  # leaves the second Gaussian cached in the Python RNG
    path = save(tmp_path, 2, model, opt, scaler, cfg)
    after_save = draw()
    train_step(model, opt, scaler, seed=99)  # the run goes on; this is the reference continuation
    reference = {k: v.clone() for k, v in model.state_dict().items()}

    model2, opt2, scaler2 = make(cfg, seed=1)  # other weights, empty optimizer, initial scale
    assert not torch.equal(model2.pos_embed, model.pos_embed)
    torch.manual_seed(7), np.random.seed(7), random.seed(7)
    state = store.load(path, RunState(model2, opt2, scaler2), cfg)
    assert (state.step, state.data_state, state.world_size) == (2, "loader-state", 1)
    assert draw() == after_save

    saved = weights(path)
    assert all(torch.equal(v, saved[k]) for k, v in model2.state_dict().items())
    assert scaler2.get_scale() == 2.0**12
    s1 = optimizer_state(path)["state"]
    names = sharded.param_names(model2, opt2)
    s2 = {names[i]: s for i, s in opt2.state_dict()["state"].items()}
    assert s1.keys() == s2.keys()
    for k in s1:
        assert s1[k].keys() == s2[k].keys()
        assert all(torch.equal(torch.as_tensor(s1[k][n]), torch.as_tensor(s2[k][n])) for n in s1[k])

    # The same continuation from the restored state lands on bitwise the same weights.
    store.load(path, RunState(model2, opt2, scaler2), cfg)
    train_step(model2, opt2, scaler2, seed=99)
    assert all(torch.equal(v, reference[k]) for k, v in model2.state_dict().items())


def test_scaler_state_follows_the_precision_of_each_run(tmp_path, cfg, caplog):
    """precision=auto resolves per machine: a checkpoint saved without fp16 (no scaler state) resumes
    into an fp16 run at the initial scale with one warning, and an fp16 one into a bf16/fp32 run."""
    model, opt, _ = trained(cfg)
    path = save(tmp_path, 1, model, opt, torch.amp.GradScaler("cpu", enabled=False), cfg)
    fp16 = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    store.load(path, RunState(*make(cfg)[:2], fp16), cfg)
    assert fp16.get_scale() == 2.0**12 and "the loss scale starts at its initial value" in caplog.text
    m2, o2, scaler = make(cfg)
    path = save(tmp_path, 2, model, opt, scaler, cfg)
    store.load(path, RunState(m2, o2, torch.amp.GradScaler("cpu", enabled=False)), cfg)  # no error


def test_keep_newest_n(tmp_path, cfg):
    model, opt, scaler = make(cfg)
    for step in (100, 200, 300, 400, 500):
        save(tmp_path, step, model, opt, scaler, cfg, keep=2)
    names = [p.name for p in ckpt_layout.list_checkpoints(tmp_path)]
    assert names == ["step_0000400", "step_0000500"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == names


def test_pruning_never_removes_the_checkpoint_just_written(tmp_path, cfg):
    """A newer folder (another line, not moved aside) must not push the new checkpoint out of keep=1."""
    model, opt, scaler = make(cfg)
    for step in (1, 2, 10):
        save(tmp_path, step, model, opt, scaler, cfg, keep=5)
    new = save(tmp_path, 3, model, opt, scaler, cfg, keep=1)
    assert [p.name for p in ckpt_layout.list_checkpoints(tmp_path)] == ["step_0000003", "step_0000010"]
    assert store.verify(new) is None


def test_steps_sort_numerically_past_seven_digits(tmp_path, cfg):
    model, opt, scaler = make(cfg)
    for step in (9_999_999, 10_000_000):
        save(tmp_path, step, model, opt, scaler, cfg, keep=5)
    assert store.latest(tmp_path).name == "step_10000000"


def test_latest_ignores_incomplete_folders_and_save_removes_stale_tmp(tmp_path, cfg):
    assert store.latest(tmp_path) is None
    model, opt, scaler = make(cfg)
    save(tmp_path, 5, model, opt, scaler, cfg)
    root = tmp_path / "checkpoints"
    (root / ".step_0000009.tmp").mkdir()  # a run killed mid-write
    (root / ".step_0000009.tmp" / "__0_0.distcp").write_bytes(b"partial")
    (root / "step_0000008").mkdir()  # a folder without meta.json is not a usable checkpoint
    assert store.latest(tmp_path) == root / "step_0000005"
    assert store.newest_verified(tmp_path).passed_over == [(root / "step_0000008", "no meta.json")]
    with pytest.raises(UserError, match="no meta.json"):
        ckpt_layout.read_meta(root / "step_0000008")

    save(tmp_path, 10, model, opt, scaler, cfg)
    assert not (root / ".step_0000009.tmp").exists()
    assert store.latest(tmp_path) == root / "step_0000010"


def truncate(f: Path):
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def flip_last_byte(f: Path):
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF
    f.write_bytes(bytes(data))


def drop_files_record(f: Path):
    meta = json.loads(f.read_text())
    del meta["files"]
    f.write_text(json.dumps(meta))


DAMAGE = {  # what is done to the newest checkpoint, and the words of verify()'s answer
    "shards truncated": ("__0_0.distcp", truncate, "bytes, meta.json records"),
    "shards zero-length": ("__0_0.distcp", lambda f: f.write_bytes(b""), "__0_0.distcp has 0 bytes"),
    "shards bit flip": ("__0_0.distcp", flip_last_byte, "__0_0.distcp has CRC32C"),
    "DCP index bit flip": (".metadata", flip_last_byte, ".metadata has CRC32C"),
    "rank file missing": ("rank_00000.pt", Path.unlink, "rank_00000.pt is missing"),
    "meta.json missing": ("meta.json", Path.unlink, "no meta.json"),
    "meta.json not JSON": ("meta.json", truncate, "meta.json is not JSON"),
    "meta.json without records": ("meta.json", drop_files_record, "meta.json lacks 'files'"),
}


@pytest.mark.parametrize("damage", list(DAMAGE), ids=list(DAMAGE))
def test_verify_names_the_damage_and_latest_passes_over_it(tmp_path, cfg, damage):
    name, hurt, says = DAMAGE[damage]
    model, opt, scaler = make(cfg)
    older = save(tmp_path, 1, model, opt, scaler, cfg)
    newest = save(tmp_path, 2, model, opt, scaler, cfg)
    hurt(newest / name)
    assert says in store.verify(newest)
    assert store.latest(tmp_path) == older


@pytest.mark.parametrize("name", ["__0_0.distcp", "rank_00000.pt"])
def test_load_checks_the_sizes_of_the_files_it_reads(tmp_path, cfg, name):
    """Each rank's cheap check (a stat per file) before it reads: a one-line error, not a traceback.
    Evaluation (weights only) checks every file as a resume does, rank files included."""
    model, opt, scaler = make(cfg)
    path = save(tmp_path, 1, model, opt, scaler, cfg)
    truncate(path / name)
    with pytest.raises(ckpt_layout.Unusable, match=f"checkpoint {path} fails its check .{name} has ") as e:
        store.load(path, RunState(model, opt, scaler), cfg)
    assert "meta.json records" in e.value.problem
    with pytest.raises(UserError, match=f"checkpoint {path} fails its check .{name} has "):
        ckpt_weights.load_model_weights(path, model, cfg)


def test_read_meta_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        ckpt_layout.read_meta(tmp_path / "checkpoints" / "step_0000001")
    bad = tmp_path / "step_0000002"
    bad.mkdir()
    (bad / "meta.json").write_text("{not json")
    with pytest.raises(UserError, match="fails its check .meta.json is not JSON"):
        ckpt_layout.read_meta(bad)
    (bad / "meta.json").write_text(json.dumps({"format_version": 99}))
    with pytest.raises(UserError, match="format 99"):
        ckpt_layout.read_meta(bad)


def test_load_into_another_model_shape(tmp_path, cfg):
    model, opt, scaler = make(cfg)
    path = save(tmp_path, 1, model, opt, scaler, cfg)
    for kwargs in (dict(cfg.model.kwargs, depth=2), dict(cfg.model.kwargs, embed_dim=48)):
        other = load_recipe(ROOT / "recipes" / "demo_digits.py")
        other.model.kwargs = kwargs
        m2, o2, s2 = make(other)
        with pytest.raises(UserError, match="does not match"):
            store.load(path, RunState(m2, o2, s2), other)
        with pytest.raises(UserError, match="does not match"):
            ckpt_weights.load_model_weights(path, m2, other)


def test_a_checkpoint_of_another_image_size_names_both_sizes_and_the_fix(tmp_path, cfg):
    """A rerun without the run's data.image_size: the size differs, not the model (same name, same blocks)."""
    model, opt, scaler = make(cfg)
    path = save(tmp_path, 1, model, opt, scaler, cfg)
    other = load_recipe(ROOT / "recipes" / "demo_digits.py")
    other.data.image_size = 32
    m2, o2, s2 = make(other)
    want = (
        f"checkpoint {path} was trained at data.image_size=16, this run has data.image_size=32 "
        "(pos_embed [1, 17, 96] there, [1, 65, 96] here); pass data.image_size=16"
    )
    with pytest.raises(UserError) as e:
        store.load(path, RunState(m2, o2, s2), other)
    assert str(e.value) == want
    with pytest.raises(UserError) as e:
        ckpt_weights.load_model_weights(path, m2, other)
    assert str(e.value) == want


def test_a_zero_checkpoint_is_refused_for_resume_but_its_weights_still_load(tmp_path, cfg):
    """train.plugin=zero (removed) saved rank 0's optimizer shard only: resuming it would silently
    restart the other ranks' LAMB states, so it is refused; its weights are whole."""
    model, opt, scaler = trained(cfg)
    path = save(tmp_path, 1, model, opt, scaler, cfg)
    meta = json.loads((path / "meta.json").read_text())
    meta["config"]["train"]["plugin"] = "zero"  # what a 0.1 ZeRO run recorded
    (path / "meta.json").write_text(json.dumps(meta))
    m2, o2, s2 = make(cfg, seed=1)
    with pytest.raises(UserError) as e:
        store.load(path, RunState(m2, o2, s2), cfg)
    assert str(e.value) == (
        f"checkpoint {path} was written by train.plugin=zero (removed), whose optimizer file holds "
        f"rank 0's shard only and cannot be resumed; start a new --workdir with model.init_from={path}"
    )
    ckpt_weights.load_model_weights(path, m2, cfg)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), m2.state_dict().values()))


def _try_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True)
    try:
        mounts.mount_tmpfs(path, f"size={size}")
    except OSError:
        return False
    return True


@pytest.mark.parametrize("how", ["tmpfs", "monkeypatch"])
def test_disk_full_keeps_the_previous_checkpoint(tmp_path, cfg, monkeypatch, how):
    model, opt, scaler = trained(cfg)
    root = tmp_path / "checkpoints"
    mounted = False
    try:
        if how == "tmpfs":
            # Room for one checkpoint (~5.6 MB: weights plus two LAMB moments), not for two.
            mounted = _try_tmpfs(root, "8m")
            if not mounted:
                pytest.skip("cannot mount a tmpfs here (not root); the monkeypatch case covers it")
        first = save(tmp_path, 1, model, opt, scaler, cfg)
        if how == "monkeypatch":

            def full(*args, **kwargs):
                raise OSError(28, "No space left on device")

            import torch.distributed.checkpoint.filesystem as dcp_fs

            monkeypatch.setattr(dcp_fs, "_write_item", full)  # DCP's writer of each tensor

        with pytest.raises(UserError) as e:
            save(tmp_path, 2, model, opt, scaler, cfg)
        assert "No space left" in str(e.value) and "step_0000002" in str(e.value)
        assert "\n" not in str(e.value)
        assert sorted(p.name for p in root.iterdir()) == ["step_0000001"]  # no step_0000002, no .tmp
        assert store.latest(tmp_path) == first
        m2, o2, s2 = make(cfg, seed=1)
        assert store.load(first, RunState(m2, o2, s2), cfg).step == 1
        assert all(torch.equal(v, model.state_dict()[k]) for k, v in m2.state_dict().items())
    finally:
        if mounted:
            gc.collect()  # drop file handles a failed assertion's traceback may still hold
            try:
                mounts.unmount(root)
            except OSError:
                mounts.unmount(root, lazy=True)


def write_format2(path: Path, model, opt, scaler, cfg, step: int, version: int = 2) -> None:
    """A checkpoint as vitlarge wrote them before DCP (format 2, one process): full weights in
    model.safetensors, the optimizer state dict in optimizer.pt, records in meta.json (``version=1``: none)."""
    from safetensors.torch import save_file

    from vitlarge import fileio

    path.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path / "model.safetensors"))
    torch.save(opt.state_dict(), path / "optimizer.pt")
    torch.save(
        {"rng": RngState().state_dict(), "scaler": scaler.state_dict(), "data": "loader-state"}, path / "rank_00000.pt"
    )
    files = {n: fileio.sync_and_record(path / n) for n in ("model.safetensors", "optimizer.pt", "rank_00000.pt")}
    meta = {
        "format_version": version,
        "step": step,
        "world_size": 1,
        "model": cfg.model.name,
        "param_shapes": param_shapes(model),
        "config": cfg.to_dict(),
        **({"files": files} if version >= 2 else {}),  # format 1 recorded no sizes and checksums
    }
    (path / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("version", [1, 2])
def test_a_format_2_checkpoint_still_resumes_exactly_and_its_weights_load(tmp_path, cfg, version):
    """Formats 1 and 2 (before DCP) through the one adapter, vitlarge/checkpoint/legacy.py."""
    model, opt, scaler = trained(cfg)
    path = tmp_path / "checkpoints" / "step_0000002"
    write_format2(path, model, opt, scaler, cfg, 2, version)
    assert store.verify(path) is None and store.latest(tmp_path) == path
    train_step(model, opt, scaler, seed=99)
    reference = {k: v.clone() for k, v in model.state_dict().items()}

    model2, opt2, scaler2 = make(cfg, seed=1)
    state = store.load(path, RunState(model2, opt2, scaler2), cfg)
    assert (state.step, state.data_state, ckpt_layout.read_meta(path)["format_version"]) == (2, "loader-state", version)
    train_step(model2, opt2, scaler2, seed=99)
    assert all(torch.equal(v, reference[k]) for k, v in model2.state_dict().items())

    fresh = build_model(cfg)  # evaluate --checkpoint of an old checkpoint
    ckpt_weights.load_model_weights(path, fresh, cfg)
    assert all(torch.equal(v, load_file(str(path / "model.safetensors"))[k]) for k, v in fresh.state_dict().items())
    # ... and the next save is format 3, in the same line
    new = save(tmp_path, 3, model2, opt2, scaler2, cfg)
    assert ckpt_layout.read_meta(new)["format_version"] == 3 and store.latest(tmp_path) == new


@pytest.mark.parametrize(
    "damage, problem",
    [
        (lambda sd: [1, 2], "optimizer.pt is not an optimizer state"),
        (lambda sd: {"state": sd["state"]}, "optimizer.pt holds no 'param_groups'"),
        (lambda sd: {**sd, "state": {"0": {}}}, "optimizer.pt names parameters by something other than"),
        (
            lambda sd: {**sd, "param_groups": [{**sd["param_groups"][0], "params": [10**6]}]},
            "its optimizer state names parameters by something other than",
        ),
    ],
    ids=["a list", "no param_groups", "string keys", "an index past the model"],
)
def test_a_format_2_optimizer_file_of_another_form_is_one_line(tmp_path, cfg, damage, problem):
    """A well-formed torch file whose data is not an optimizer state (handed over, or damaged and re-recorded) is
    refused with the checkpoint's one line, not a traceback from deep inside the load."""
    from vitlarge import fileio

    model, opt, scaler = trained(cfg)
    path = tmp_path / "checkpoints" / "step_0000002"
    write_format2(path, model, opt, scaler, cfg, 2)
    torch.save(damage(opt.state_dict()), path / "optimizer.pt")
    meta = json.loads((path / "meta.json").read_text())
    meta["files"]["optimizer.pt"] = fileio.sync_and_record(path / "optimizer.pt")  # its records agree
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ckpt_layout.Unusable, match=re.escape(problem)):
        store.load(path, RunState(*make(cfg, seed=1)), cfg)


def test_dcp_index_is_read_without_unpickling_foreign_objects(tmp_path, cfg):
    """DCP's .metadata is a pickle: our reader admits its metadata classes only."""
    import argparse
    import pickle

    model, opt, scaler = trained(cfg)
    path = save(tmp_path, 1, model, opt, scaler, cfg)
    assert sharded.Reader(path).read_metadata().state_dict_metadata  # the real index reads
    (path / ".metadata").write_bytes(pickle.dumps(argparse.Namespace(x=1)))
    with pytest.raises(dcp_index.IndexProblem, match="argparse.Namespace, which a DCP index never holds"):
        sharded.Reader(path).read_metadata()


def test_exists_needs_the_published_folder_and_its_meta_json(tmp_path, cfg):
    """What the trainer asks before its final save: a name alone (a half-copied folder) is not a checkpoint."""
    assert not ckpt_layout.exists(tmp_path, 2)
    (tmp_path / "checkpoints" / ckpt_layout.step_name(2)).mkdir(parents=True)
    assert not ckpt_layout.exists(tmp_path, 2)
    model, opt, scaler = trained(cfg)
    save(tmp_path, 3, model, opt, scaler, cfg)
    assert ckpt_layout.exists(tmp_path, 3) and not ckpt_layout.exists(tmp_path, 30)
    assert ckpt_layout.step_name(3) == "step_0000003" and ckpt_layout.step_of(Path("step_0000003")) == 3


def test_check_writable_creates_the_workdir_and_names_a_read_only_one(tmp_path):
    work = tmp_path / "new" / "run"
    ckpt_workdir.check_writable(work, rank=1)
    assert work.is_dir() and list(work.iterdir()) == []  # the probe file is gone
    ro = tmp_path / "ro"
    (ro / "checkpoints").mkdir(parents=True)
    try:
        mounts.bind_read_only(ro)
    except OSError:
        pytest.skip("cannot bind-mount read-only here")
    try:
        with pytest.raises(
            UserError, match=rf"^workdir {ro} is not writable \(Read-only file system\); pass a writable"
        ):
            ckpt_workdir.check_writable(ro, rank=0)
    finally:
        mounts.unmount(ro)


def test_reason_of_finds_the_os_error_behind_a_wrapped_failure(tmp_path):
    try:
        try:
            raise OSError(28, "No space left on device")
        except OSError as e:
            raise RuntimeError("unexpected pos 512 vs 448") from e
    except RuntimeError as wrapped:
        assert ckpt_files.reason_of(wrapped) == "No space left on device"
    assert ckpt_files.reason_of(ValueError("first line\nsecond")) == "first line"
    assert ckpt_files.reason_of(ValueError("")) == "ValueError"
    assert ckpt_files.reason_of(RuntimeError("unexpected pos 512"), written_in=tmp_path) == "unexpected pos 512"


def test_the_model_ema_is_saved_with_the_weights_and_restored_bitwise(tmp_path, cfg, caplog):
    """train.ema_decay: the average goes into the same checkpoint (meta.json ``ema: true``, DCP's ``ema.*``); a
    checkpoint without one (an older run, or ema off) restores the weights and starts the average from them,
    with one warning line."""
    from vitlarge.model.ema import ModelEma

    model, opt, scaler = trained(cfg)
    ema = ModelEma(model, decay=0.9)
    for step in (2, 3):
        train_step(model, opt, scaler, seed=step)
        ema.update(step)
    assert not torch.equal(ema.state_dict()["pos_embed"], model.pos_embed)
    path = store.save(tmp_path, RunState(model, opt, scaler, ema, step=3), cfg, keep=3)
    assert ckpt_layout.read_meta(path)["ema"] is True
    assert all(torch.equal(v, ema.state_dict()[k]) for k, v in sharded.read_full_model(path, key="ema").items())

    model2, opt2, scaler2 = make(cfg, seed=1)
    ema2 = ModelEma(model2, decay=0.9)
    store.load(path, RunState(model2, opt2, scaler2, ema2), cfg)
    assert all(torch.equal(v, ema.state_dict()[k]) for k, v in ema2.state_dict().items())
    assert "holds no model EMA" not in caplog.text

    old = save(tmp_path, 4, model, opt, scaler, cfg)  # written without an EMA
    assert ckpt_layout.read_meta(old)["ema"] is False
    store.load(old, RunState(model2, opt2, scaler2, ema2), cfg)
    assert all(torch.equal(v, model2.state_dict()[k]) for k, v in ema2.state_dict().items())
    warned = [r.getMessage() for r in caplog.records if "holds no model EMA" in r.getMessage()]
    assert len(warned) == 1 and str(old) in warned[0] and "starts from its weights" in warned[0]
    store.load(path, RunState(*make(cfg)[:2], scaler2), cfg)  # a run without an EMA ignores the checkpoint's


def test_a_checkpoint_that_does_not_exist_names_those_beside_it(tmp_path):
    """A pruned (or mistyped) step: the line lists the checkpoints its folder holds (the newest five)."""
    root = tmp_path / "checkpoints"
    for step in (100, 200, 300, 400, 500, 600):
        (root / ckpt_layout.step_name(step)).mkdir(parents=True)
    missing = root / "step_0000050"
    with pytest.raises(UserError) as e:  # --resume
        ckpt_layout.read_meta(missing)
    assert str(e.value) == (
        f"checkpoint {missing} does not exist; {root} holds ..., step_0000200, step_0000300, step_0000400, "
        "step_0000500, step_0000600; check --resume, or omit it to resume from the workdir"
    )
    with pytest.raises(UserError) as e:  # vitlarge.evaluate --checkpoint, model.init_from
        ckpt_weights.load_model_weights(missing, torch.nn.Linear(1, 1), Config())
    assert str(e.value).startswith(f"checkpoint {missing} does not exist; {root} holds ..., step_0000200, ")
    lone = tmp_path / "elsewhere" / "step_0000050"
    with pytest.raises(UserError) as e:  # nothing beside it: the line as it was
        ckpt_layout.read_meta(lone)
    assert str(e.value) == f"checkpoint {lone} does not exist; check --resume, or omit it to resume from the workdir"


@pytest.mark.parametrize(
    "classes, expect",
    [
        ("abc", "classes is not a list of"),
        (["a", "a"], "classes is not a list of"),
        (["a", 3], "classes is not a list of"),
        (["x" * 1025], "classes is not a list of"),
        (["a", "b"], "classes lists 2 names, its head.weight has 10 outputs"),
    ],
)
def test_the_class_names_a_checkpoint_records_are_checked_before_use(tmp_path, classes, expect):
    """meta.json's ``classes`` (the data set's class names, what ``vitlarge.evaluate`` maps by): one distinct name of
    at most `MAX_SYNSET` characters per output, at most `MAX_CLASSES`; a checkpoint without them still reads."""
    cfg = load_recipe(ROOT / "recipes" / "demo_digits.py")
    model, opt, scaler = make(cfg)
    names = [str(i) for i in range(10)]
    path = store.save(tmp_path, RunState(model, opt, scaler, step=1, data="s", classes=names), cfg, keep=1)
    assert ckpt_layout.read_meta(path)["classes"] == names
    meta = json.loads((path / "meta.json").read_text())
    problem = meta_json.problem_of({**meta, "classes": classes}, path)
    assert problem is not None and expect in problem, problem
    del meta["classes"]
    assert meta_json.problem_of(meta, path) is None
