"""The bad-input matrix: every case through the command a user runs, one row per case.

Each row names the command (``train.py``, ``python -m data_tools.imagenet_to_tfrecord``,
``python -m data_tools.make_index``, ``python -m vitlarge.evaluate``), prepares the damage and
states what the user must see: the exit status, the words of the last stderr line (``error: ...``
naming the file or key and the fix) and, for failures, that nothing partial sits under a final
name. Awkward-but-valid images (PNG, CMYK, grayscale) must instead convert and decode through DALI.
Several rows are also unit-tested elsewhere (tests/unit/data/test_bad_input.py, tests/unit/checkpoint/test_store.py,
test_config.py); here they are proven through the command line, in a process forked from the session's
pre-imported server (tests/helpers/forked.py; the same ``main`` as ``python train.py``, without 11 s of
imports per row). Runs are single-process and stop after at most one optimizer step.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from PIL import Image

from tests.helpers import launcher
from tests.helpers.data_fixtures import SYNSETS, copy_imagefolder, corrupt_jpeg_bytes
from tests.helpers.runs import RECIPE

CPU = torch.device("cpu")


@dataclass
class Run:
    """One command and what its user must see."""

    cmd: list[str]
    rc: int
    says: list[str]  # substrings of the last stderr line
    after: Callable[[], None] = lambda: None  # further checks (nothing partial, decodes through DALI)
    cleanup: list[Callable[[], None]] = field(default_factory=list)


def train(*args: str) -> list[str]:
    return [sys.executable, "train.py", "--config", RECIPE, *args]


def module(name: str, *args: str) -> list[str]:
    return [sys.executable, "-m", name, *args]


def convert(src, out, *extra) -> list[str]:
    return module(
        "data_tools.imagenet_to_tfrecord",
        "--src",
        str(src),
        "--out",
        str(out),
        "--train-shards",
        "2",
        "--val-shards",
        "1",
        "--workers",
        "0",
        "--no-progress",
        *extra,
    )


@dataclass
class Ctx:
    tmp: Path
    demo_data: str
    tiny: str

    def data_copy(self) -> Path:
        dst = self.tmp / "data"
        shutil.copytree(self.demo_data, dst, ignore=shutil.ignore_patterns("src"))
        return dst

    def train_on(self, data, *extra: str) -> list[str]:
        return train("--data", str(data), "--workdir", str(self.workdir), "train.max_steps=1", *extra)

    @property
    def workdir(self) -> Path:
        return self.tmp / "work"

    def plain_src(self) -> Path:
        """The tiny ImageNet-style tree with only ordinary RGB JPEGs (its three awkward files removed)."""
        src = Path(copy_imagefolder(self.tiny, str(self.tmp / "src")))
        for synset in SYNSETS:
            (src / "train" / synset / f"{synset}_train_0.JPEG").unlink()
        return src


# --- after-checks -------------------------------------------------------------------------------


def no_training_output(workdir: Path) -> Callable[[], None]:
    def check():
        ckpts = workdir / "checkpoints"
        assert not (ckpts.exists() and list(ckpts.iterdir())), f"partial checkpoint: {list(ckpts.iterdir())}"
        assert not (workdir / "model").exists()

    return check


def no_dataset(out: Path) -> Callable[[], None]:
    def check():
        assert not (out / "dataset.json").exists()
        if out.exists():
            assert not list(out.glob("*.tmp")), list(out.glob("*.tmp"))

    return check


def decodes_through_dali(out: Path, images: int) -> Callable[[], None]:
    def check():
        from tests.helpers.loaders import open_val
        from vitlarge.data import load_manifest

        assert load_manifest(str(out)).num_examples("validation") == images
        seen = 0
        for x, y in open_val(str(out), 4, 32, rank=0, world_size=1, device=CPU):
            assert x.shape[1:] == (3, 32, 32) and torch.isfinite(x).all()
            seen += y.numel()
        assert seen == images

    return check


# --- the cases ----------------------------------------------------------------------------------


def awkward_image(mode: str):
    """A valid image in ``mode`` added to the validation split: converts (re-encoded) and decodes."""

    def setup(c: Ctx) -> Run:
        src = c.plain_src()
        val = src / "val" / SYNSETS[0]
        im = Image.open(next(val.iterdir())).convert("RGB")
        target = val / "zz_awkward.JPEG"  # the ImageNet extension whatever the content
        if mode == "PNG":
            im.save(target, "PNG")
        else:
            im.convert(mode).save(target, "JPEG", quality=90)
        out = c.tmp / "out"
        n_val = len(SYNSETS) * 2 + 1
        return Run(convert(src, out), 0, ["1 image re-encoded as RGB JPEG"], decodes_through_dali(out, n_val))

    return setup


def corrupt_jpeg(c: Ctx) -> Run:
    src = c.plain_src()
    bad = src / "train" / SYNSETS[1] / "zz_corrupt.JPEG"
    bad.write_bytes(corrupt_jpeg_bytes())
    out = c.tmp / "out"
    return Run(convert(src, out), 2, [f"error: {bad}: unreadable image", "--skip-bad"], no_dataset(out))


def empty_class_dir(c: Ctx) -> Run:
    src = c.plain_src()
    (src / "train" / "n09999999").mkdir()
    out = c.tmp / "out"
    return Run(
        convert(src, out),
        2,
        [f"{src / 'train' / 'n09999999'}: empty class directory", "add images or remove it"],
        no_dataset(out),
    )


def truncated_tfrecord_index(c: Ctx) -> Run:
    data = c.data_copy()
    shard = data / "train-00001-of-00004"
    os.truncate(shard, shard.stat().st_size - 100)
    (data / "dataset.json").unlink()
    return Run(module("data_tools.make_index", str(data)), 2, [f"error: {shard}: truncated TFRecord"], no_dataset(data))


def truncated_tfrecord_train(c: Ctx) -> Run:
    data = c.data_copy()
    shard = data / "train-00002-of-00004"
    os.truncate(shard, shard.stat().st_size - 100)
    return Run(c.train_on(data), 2, [f"error: {shard}: truncated TFRecord"], no_training_output(c.workdir))


def two_shard_sets_index(c: Ctx) -> Run:
    data = c.data_copy()
    shutil.copy(data / "train-00000-of-00004", data / "train-00000-of-00001")  # a leftover of another conversion
    (data / "dataset.json").unlink()
    return Run(
        module("data_tools.make_index", str(data)),
        2,
        [
            f"error: {data}: 2 train shard sets, train-*-of-00001 (1 file) and train-*-of-00004 (4 files)",
            "delete the set you do not want",
        ],
        no_dataset(data),
    )


def missing_shard_index(c: Ctx) -> Run:
    data = c.data_copy()
    (data / "train-00002-of-00004").unlink()
    (data / "dataset.json").unlink()
    return Run(
        module("data_tools.make_index", str(data)),
        2,
        [f"error: {data}: the train-*-of-00004 set lacks train-00002-of-00004", "restore"],
        no_dataset(data),
    )


def evaluate_on(c: Ctx, data) -> list[str]:
    """``python -m vitlarge.evaluate`` of a freshly exported demo model on ``data`` (reads the validation split)."""
    from vitlarge.checkpoint.export import export
    from vitlarge.config.load import load_config
    from vitlarge.model.vit import build_model

    cfg = load_config(RECIPE, [])
    path = export(c.tmp, build_model(cfg, CPU), cfg)
    return module("vitlarge.evaluate", "--config", RECIPE, "--data", str(data), "--checkpoint", str(path))


def missing_index(c: Ctx) -> Run:
    data = c.data_copy()
    index = data / "validation-00000-of-00002.idx"
    index.unlink()
    return Run(evaluate_on(c, data), 2, [f"{index}: missing DALI index", f"python -m data_tools.make_index {data}"])


def stale_index(c: Ctx) -> Run:
    data = c.data_copy()
    index = data / "validation-00001-of-00002.idx"
    shutil.copy(data / "validation-00000-of-00002.idx", index)
    return Run(evaluate_on(c, data), 2, [f"{index}: stale DALI index", f"python -m data_tools.make_index {data}"])


def manifest_for_another_set(c: Ctx) -> Run:
    data = c.data_copy()
    shutil.copy(data / "validation-00000-of-00002", data / "validation-00000-of-00001")
    return Run(
        evaluate_on(c, data),
        2,
        [f"error: {data}: holds 2 validation shard sets", f"python -m data_tools.make_index {data}"],
    )


def bad_randaugment(c: Ctx) -> Run:
    return Run(
        c.train_on(c.demo_data, "data.randaugment=rand-m9-w0"),
        2,
        ["error: randaugment='rand-m9-w0': part 'w0'", "rand-m9-n2"],
        no_training_output(c.workdir),
    )


def missing_manifest(c: Ctx) -> Run:
    data = c.data_copy()
    (data / "dataset.json").unlink()
    return Run(evaluate_on(c, data), 2, [f"{data / 'dataset.json'}: missing", "make_index"])


def label_out_of_range(c: Ctx) -> Run:
    data = c.data_copy()
    doc = json.loads((data / "dataset.json").read_text())
    doc["num_classes"] = 5  # the shards hold digits 0..9
    (data / "dataset.json").write_text(json.dumps(doc))
    # the model's 10 classes against the data set's 5, with no class names on the model's side to map them by: refused
    # before any image is read (the loader's own check of a stored label: data/test_bad_input.py)
    return Run(evaluate_on(c, data), 2, ["error: the model has 10 classes", "records no class names to map them by"])


def missing_data_dir(c: Ctx) -> Run:
    missing = c.tmp / "no_such_data"
    return Run(c.train_on(missing), 2, [f"error: {missing}"], no_training_output(c.workdir))


def unknown_key(c: Ctx) -> Run:
    return Run(
        c.train_on(c.demo_data, "train.micro_bach=8"),
        2,
        ["unknown config key 'train.micro_bach'", "did you mean 'train.micro_batch'"],
        no_training_output(c.workdir),
    )


def wrong_type(c: Ctx) -> Run:
    return Run(
        c.train_on(c.demo_data, "train.micro_batch=sixteen"),
        2,
        ["'train.micro_batch=sixteen' is not an int"],
        no_training_output(c.workdir),
    )


def batch_does_not_divide(c: Ctx) -> Run:
    return Run(
        c.train_on(c.demo_data, "train.global_batch=120"),
        2,
        ["train.global_batch=120 is not a multiple of train.micro_batch=16", "change one of them"],
        no_training_output(c.workdir),
    )


def missing_recipe(c: Ctx) -> Run:
    recipe = c.tmp / "recipes" / "vit_b61.py"
    return Run([sys.executable, "train.py", "--config", str(recipe), "--data", c.demo_data], 2, [str(recipe)])


def unwritable_workdir(c: Ctx) -> Run:
    blocker = c.tmp / "a_file"
    blocker.write_text("x")
    workdir = blocker / "run"
    return Run(
        train("--data", c.demo_data, "--workdir", str(workdir), "train.max_steps=1"),
        2,
        [f"workdir {workdir} is not writable (Not a directory)", "pass a writable --workdir"],
        lambda: None if not workdir.exists() else pytest.fail("workdir created"),
    )


def incompatible_checkpoint(c: Ctx) -> Run:
    """A workdir holding a checkpoint of another model (the recipe changed): the rerun must not resume it."""
    from vitlarge.checkpoint import store
    from vitlarge.checkpoint.state import RunState
    from vitlarge.config.load import load_config
    from vitlarge.config.schema import OptimConfig
    from vitlarge.model.vit import build_model
    from vitlarge.optim.lamb import build_optimizer

    other = load_config(RECIPE, ["model.kwargs={'patch_size': 4, 'embed_dim': 48, 'depth': 2, 'num_heads': 3}"])
    model = build_model(other, CPU)
    opt = build_optimizer(model, OptimConfig(lr=1e-2, weight_decay=0.1))
    path = store.save(c.workdir, RunState(model, opt, torch.amp.GradScaler("cpu"), step=7), other, keep=3)
    before = sorted(p.name for p in (c.workdir / "checkpoints").iterdir())

    def after():
        assert sorted(p.name for p in (c.workdir / "checkpoints").iterdir()) == before  # untouched
        assert not (c.workdir / "model").exists()

    return Run(
        c.train_on(c.demo_data),
        2,
        [f"checkpoint {path} holds model", "does not match the recipe", "use another --workdir"],
        after,
    )


def demo_checkpoint(c: Ctx, step: int = 3) -> Path:
    """A real checkpoint of the demo recipe in the workdir, written in-process (no training run)."""
    from vitlarge.checkpoint import store
    from vitlarge.checkpoint.state import RunState
    from vitlarge.config.load import load_config
    from vitlarge.config.schema import OptimConfig
    from vitlarge.model.vit import build_model
    from vitlarge.optim.lamb import build_optimizer

    cfg = load_config(RECIPE, [])
    model = build_model(cfg, CPU)
    opt = build_optimizer(model, OptimConfig(lr=1e-2, weight_decay=0.1))
    return store.save(c.workdir, RunState(model, opt, torch.amp.GradScaler("cpu"), step=step), cfg, keep=3)


def untouched(c: Ctx, path: Path) -> Callable[[], None]:
    """Nothing lost: the checkpoint and its files are where they were, nothing was moved aside or exported."""
    files = {f.name: f.stat().st_size for f in path.iterdir()}

    def check():
        assert {f.name: f.stat().st_size for f in path.iterdir()} == files
        assert not list((c.workdir / "checkpoints").glob("abandoned_*"))
        assert not (c.workdir / "model").exists()

    return check


def resume_truncated_weights(c: Ctx) -> Run:
    path = demo_checkpoint(c)
    weights = path / "__0_0.distcp"  # this rank's shard of weights and optimizer state (DCP)
    full = weights.stat().st_size
    os.truncate(weights, 4096)
    return Run(
        c.train_on(c.demo_data, "--resume", str(path)),
        2,
        [
            f"error: checkpoint {path} fails its check (__0_0.distcp has 4,096 bytes, meta.json records {full:,})",
            "--resume an older checkpoints/step_* folder",
        ],
        untouched(c, path),
    )


def resume_meta_not_json(c: Ctx) -> Run:
    path = demo_checkpoint(c)
    (path / "meta.json").write_text('{"format_version": 2, "st')
    return Run(
        c.train_on(c.demo_data, "--resume", str(path)),
        2,
        [f"error: checkpoint {path} fails its check (meta.json is not JSON:"],
        untouched(c, path),
    )


def resume_not_a_checkpoint(c: Ctx) -> Run:
    """--resume of the workdir itself: the error names a folder that would do."""
    path = demo_checkpoint(c)
    return Run(
        c.train_on(c.demo_data, "--resume", str(c.workdir)),
        2,
        [
            f"error: {c.workdir} is not a complete vitlarge checkpoint (no meta.json)",
            f"pass a checkpoints/step_* folder, e.g. {path}",
        ],
        untouched(c, path),
    )


def read_only_checkpoints(c: Ctx) -> Run:
    """checkpoints/ on a read-only mount: refused before any work, not at the first save."""
    path = demo_checkpoint(c)
    ckpts = c.workdir / "checkpoints"
    r = subprocess.run(
        f"mount --bind {ckpts} {ckpts} && mount -o remount,bind,ro {ckpts}", shell=True, capture_output=True, text=True
    )
    if r.returncode:
        subprocess.run(["umount", str(ckpts)], capture_output=True)
        pytest.skip(f"cannot mount read-only here: {r.stderr.strip()}")
    run = Run(
        c.train_on(c.demo_data),
        2,
        [
            f"error: checkpoint folder {ckpts} is not writable (Read-only file system)",
            "make it writable or pass another --workdir",
        ],
        untouched(c, path),
    )
    run.cleanup.append(lambda: subprocess.run(["umount", str(ckpts)], check=True))
    return run


def half_written_checkpoint(c: Ctx) -> Run:
    """--resume pointed at the .tmp folder a run killed mid-checkpoint leaves behind."""
    tmp_ckpt = c.workdir / "checkpoints" / ".step_0000004.tmp"
    tmp_ckpt.mkdir(parents=True)
    (tmp_ckpt / "model.safetensors").write_bytes(b"partial")
    return Run(
        c.train_on(c.demo_data, "--resume", str(tmp_ckpt)),
        2,
        [f"{tmp_ckpt} is not a complete vitlarge checkpoint (no meta.json)", "pass a checkpoints/step_* folder"],
        lambda: None if not (c.workdir / "model").exists() else pytest.fail("exported"),
    )


def evaluate_missing_checkpoint(c: Ctx) -> Run:
    missing = c.tmp / "runs" / "checkpoints" / "step_0000100"
    return Run(
        module("vitlarge.evaluate", "--config", RECIPE, "--data", c.demo_data, "--checkpoint", str(missing)),
        2,
        [f"checkpoint {missing} does not exist"],
    )


def disk_full_checkpoint(c: Ctx) -> Run:
    """The workdir on a 3 MiB tmpfs: logs fit, the ~5.6 MB checkpoint does not."""
    c.workdir.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(c.workdir)], capture_output=True, text=True
    )
    if r.returncode:
        pytest.skip(
            f"cannot mount a tmpfs here: {r.stderr.strip()} (tests/unit/checkpoint/test_store.py injects the failure)"
        )

    def unmount():
        if subprocess.run(["umount", str(c.workdir)]).returncode:
            subprocess.run(["umount", "-l", str(c.workdir)], check=True)

    final = c.workdir / "checkpoints" / "step_0000001"
    run = Run(
        c.train_on(c.demo_data, "train.micro_batch=64"),
        2,
        [
            f"writing checkpoint {final} failed (No space left on device)",
            "free space",
            "earlier checkpoints are intact",
        ],
        no_training_output(c.workdir),
    )
    run.cleanup.append(unmount)
    return run


def evaluate_other_model(c: Ctx) -> Run:
    cmd = evaluate_on(c, c.demo_data)
    return Run(
        cmd + ["model.kwargs={'patch_size': 4, 'embed_dim': 48, 'depth': 2, 'num_heads': 3}"],
        2,
        [f"{cmd[-1]}/config.json records another model than --config", "pass model.kwargs.embed_dim=96"],
    )


CASES = {
    # conversion: python -m data_tools.imagenet_to_tfrecord / make_index
    "convert: corrupt JPEG": corrupt_jpeg,
    "convert: CMYK JPEG is re-encoded": awkward_image("CMYK"),
    "convert: PNG named .JPEG is re-encoded": awkward_image("PNG"),
    "convert: grayscale JPEG is re-encoded": awkward_image("L"),
    "convert: empty class directory": empty_class_dir,
    "make_index: truncated TFRecord": truncated_tfrecord_index,
    "make_index: two shard sets": two_shard_sets_index,
    "make_index: a shard missing from its set": missing_shard_index,
    # loading: train.py
    "train: truncated TFRecord": truncated_tfrecord_train,
    "train: missing data directory": missing_data_dir,
    # loading: python -m vitlarge.evaluate (the same loader checks, without the trainer's start-up cost)
    "evaluate: missing index": missing_index,
    "evaluate: stale index": stale_index,
    "evaluate: missing dataset.json": missing_manifest,
    "evaluate: dataset.json built for another shard set": manifest_for_another_set,
    "evaluate: label out of range": label_out_of_range,
    # config: train.py
    "config: unknown key": unknown_key,
    "config: wrong type": wrong_type,
    "config: global batch does not divide": batch_does_not_divide,
    "config: missing recipe file": missing_recipe,
    "config: RandAugment string with an unknown part": bad_randaugment,
    # workdir and checkpoints: train.py / vitlarge.evaluate
    "workdir: not writable": unwritable_workdir,
    "checkpoint: of another model in the workdir": incompatible_checkpoint,
    "checkpoint: --resume of a half-written folder": half_written_checkpoint,
    "checkpoint: --resume of one with truncated weights": resume_truncated_weights,
    "checkpoint: --resume of one whose meta.json is not JSON": resume_meta_not_json,
    "checkpoint: --resume of a folder that is not a checkpoint": resume_not_a_checkpoint,
    "checkpoint: read-only checkpoint folder": read_only_checkpoints,
    "checkpoint: disk full while writing": disk_full_checkpoint,
    "evaluate: checkpoint does not exist": evaluate_missing_checkpoint,
    "evaluate: checkpoint of another model": evaluate_other_model,
}


FRESH = {"config: unknown key", "evaluate: label out of range", "make_index: truncated TFRecord"}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_bad_input(case, demo_data, tiny_imagefolder, tmp_path):
    run = CASES[case](Ctx(tmp_path, demo_data, tiny_imagefolder))
    try:
        # The command's own code from its first line (argument parsing on), forked from the session's pre-imported
        # server (tests/helpers/forked.py): the launcher is not the subject here (tests/e2e/test_launchers.py).
        # A row per command in a new interpreter too: what an import prints would not reach a forked command's stderr.
        if case in FRESH:
            r = subprocess.run(
                run.cmd, cwd=launcher.ROOT, env=launcher.env(), capture_output=True, text=True, timeout=300
            )
        else:
            r = launcher.python(run.cmd[1:], timeout=300)
        last = (r.stderr.strip().splitlines() or [""])[-1]
        assert r.returncode == run.rc, f"exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
        for words in run.says:
            assert words in last, f"{words!r} not in the last stderr line:\n{last}"
        if run.rc != 0:
            assert last.startswith("error: ") and "Traceback" not in r.stderr, r.stderr[-3000:]
        run.after()
    finally:
        for undo in run.cleanup:
            undo()
