"""Every resume path through real runs: rewound, killed, damaged and diverging views.

Runs are 2 ranks (forked with torchrun's variables, tests/helpers/forked.py; two srun-style tasks where a rank
needs its own exit status; real ``python train.py`` processes where a rank needs its own view of the files), fp32, 12 optimizer steps of the demo recipe, a
checkpoint every 2, keep 10. One uninterrupted run is the reference; the others start from a copy
of its workdir, rewound or damaged, and must end on the reference's final weights bit for bit.

A rank's "own view" is a mount namespace (``unshare -m``) where one checkpoint folder is replaced by
another copy: what a node of a shared file system with attribute caching can see. Those tests need
root and are skipped without it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import launcher
from tests.helpers.runs import (
    RECIPE,
    assert_bitwise_equal,
    checkpoint_steps,
    demo_args,
    final_weights,
    kill_all,
    resumed_at,
    srun,
)
from vitlarge.checkpoint import store
from vitlarge.checkpoint.trust import layout as ckpt_layout

TIMEOUT = 300
MOVED = re.compile(r"^moved .*", re.M)
WARNED = re.compile(r"^warning: checkpoint .*", re.M)
ERRORS = re.compile(r"^error: .*", re.M)


def train_args(data: str, workdir: Path, *extra: str) -> list[str]:
    return demo_args(
        data,
        workdir,
        "train.precision=fp32",
        "train.max_steps=12",
        "train.checkpoint_every_steps=2",
        "train.keep_checkpoints=10",
        *extra,
    )


def run_srun(args, logs: list[Path], wrap=None) -> tuple[list[int], list[str]]:
    procs = srun(args, 2, logs, wrap)
    try:
        codes = [p.wait(timeout=TIMEOUT) for p in procs]
    finally:
        kill_all(procs)
    return codes, [log.read_text() for log in logs]


def own_view(src: Path, dst: Path) -> list[str]:
    """A command prefix: run in a private mount namespace where folder ``dst`` shows ``src``."""
    return [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        'mount --bind "$1" "$2" && shift 2 && exec "$@"',
        "sh",
        str(src),
        str(dst),
    ]


@pytest.fixture(scope="module")
def can_mount(tmp_path_factory):
    d = tmp_path_factory.mktemp("mount_probe")
    r = subprocess.run(own_view(d, d) + ["true"], capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"no private mount namespace here ({r.stderr.strip()}); needs root")


@pytest.fixture(scope="module")
def reference(demo_data, tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("resume_reference") / "run"
    codes, logs = run_srun(train_args(demo_data, workdir), [workdir.parent / f"rank{r}.log" for r in range(2)])
    assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    assert checkpoint_steps(workdir) == [2, 4, 6, 8, 10, 12]
    return workdir


def copy_run(ref: Path, dest: Path) -> Path:
    """The reference's workdir without its exported model: checkpoints 2..12, metrics, logs."""
    shutil.copytree(ref, dest, ignore=shutil.ignore_patterns("tb"))
    shutil.rmtree(dest / "model")
    return dest / "checkpoints"


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_resume_of_an_older_step_into_the_same_workdir_then_kill_9_and_requeue(reference, demo_data, tmp_path):
    """README step 5, then a Slurm requeue: the new line goes on, the abandoned one is kept whole."""
    workdir = tmp_path / "run"
    ckpts = copy_run(reference, workdir)
    args = train_args(demo_data, workdir)
    log = tmp_path / "resume_older.log"
    proc = launcher.start([*args, "--resume", str(ckpts / "step_0000004")], nproc=2, launcher="fork", log=log)
    try:
        new_line_at_8 = lambda: any(ckpts.glob("abandoned_*")) and (ckpts / "step_0000008" / "meta.json").exists()  # noqa: E731
        assert launcher.wait_for(new_line_at_8, TIMEOUT, proc, poll=0.005), log.read_text()[-3000:]
    finally:
        launcher.kill_tree(proc)  # kill -9 of both ranks
    proc.wait(timeout=60)
    text = log.read_text()
    [aside] = ckpts.glob("abandoned_*")
    assert MOVED.findall(text) == [
        f"moved 4 checkpoint(s) newer than step 4 (step_0000006, step_0000008, step_0000010, step_0000012) aside to "
        f"{aside}; this run continues from {ckpts / 'step_0000004'}"
    ]
    assert resumed_at(text) == [(str(ckpts / "step_0000004"), 4)]
    assert names(aside) == ["step_0000006", "step_0000008", "step_0000010", "step_0000012"]
    newest = store.latest(workdir)
    assert newest.parent == ckpts and ckpt_layout.step_of(newest) >= 8

    r = launcher.run(args, nproc=2, timeout=TIMEOUT)  # the requeue: same command, no --resume
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert resumed_at(out) == [(str(newest), ckpt_layout.step_of(newest))] and not MOVED.findall(out)
    assert_bitwise_equal(final_weights(reference), final_weights(workdir))
    assert checkpoint_steps(workdir) == [2, 4, 6, 8, 10, 12]
    assert [store.verify(p) for p in aside.iterdir()] == [None] * 4  # nothing lost


def test_rank_0_chooses_for_every_rank_and_passes_over_damaged_checkpoints(reference, demo_data, tmp_path, can_mount):
    """Rank 0 sees what a crash without fsync leaves in the three newest checkpoints; rank 1 still sees
    an intact step 12 (a stale view). Both resume from step 6, rank 0's choice, and finish bitwise."""
    workdir = tmp_path / "run"
    ckpts = copy_run(reference, workdir)
    stale = tmp_path / "stale_step_12"
    shutil.copytree(ckpts / "step_0000012", stale)
    (ckpts / "step_0000012" / "meta.json").unlink()
    (ckpts / "step_0000010" / "__0_0.distcp").write_bytes(b"")
    opt = ckpts / "step_0000008" / ".metadata"  # DCP's index
    full = opt.stat().st_size
    opt.write_bytes(opt.read_bytes()[:1000])
    weights = (ckpts / "step_0000002" / "__0_0.distcp").stat().st_size

    logs = [tmp_path / f"rank{r}.log" for r in range(2)]
    codes, (log0, log1) = run_srun(
        train_args(demo_data, workdir), logs, wrap={1: own_view(stale, ckpts / "step_0000012")}
    )
    assert codes == [0, 0], log0[-3000:] + log1[-3000:]
    assert WARNED.findall(log0) == [
        f"warning: checkpoint {ckpts / 'step_0000012'} fails its check (no meta.json); passed over",
        f"warning: checkpoint {ckpts / 'step_0000010'} fails its check (__0_0.distcp has 0 bytes, meta.json "
        f"records {weights:,}); passed over",
        f"warning: checkpoint {ckpts / 'step_0000008'} fails its check (.metadata has 1,000 bytes, meta.json "
        f"records {full:,}); passed over",
    ]
    assert resumed_at(log0) == [(str(ckpts / "step_0000006"), 6)]
    [aside] = ckpts.glob("abandoned_*")
    assert names(aside) == ["step_0000008", "step_0000010", "step_0000012"]  # moved, not deleted
    assert not WARNED.findall(log1) and not ERRORS.findall(log1)
    assert_bitwise_equal(final_weights(reference), final_weights(workdir))
    assert checkpoint_steps(workdir) == [2, 4, 6, 8, 10, 12]


def test_a_rank_that_cannot_read_the_chosen_checkpoint_fails_every_rank_in_one_line(
    reference, demo_data, tmp_path, can_mount
):
    workdir = tmp_path / "run"
    ckpts = copy_run(reference, workdir)
    view = tmp_path / "rank1_view"
    shutil.copytree(ckpts / "step_0000012", view)
    rank_file = view / "rank_00001.pt"
    full = rank_file.stat().st_size
    rank_file.write_bytes(rank_file.read_bytes()[:100])
    before = names(ckpts)

    logs = [tmp_path / f"rank{r}.log" for r in range(2)]
    codes, (log0, log1) = run_srun(
        train_args(demo_data, workdir), logs, wrap={1: own_view(view, ckpts / "step_0000012")}
    )
    assert codes == [2, 2], log0[-3000:] + log1[-3000:]  # both exit: nobody waits for the other
    assert ERRORS.findall(log0) == [
        f"error: rank 1 cannot read checkpoint {ckpts / 'step_0000012'} (rank_00001.pt has 100 bytes, meta.json "
        f"records {full:,}); check that every node sees it whole (shared file system), or --resume another checkpoint"
    ]
    assert not ERRORS.findall(log1) and "Traceback" not in log0 + log1
    assert names(ckpts) == before and not (workdir / "model").exists()


@pytest.mark.parametrize("how", ["srun", "colossalai"])
def test_an_error_before_the_process_group_exists_is_printed_once(demo_data, tmp_path, how):
    args = train_args(demo_data, tmp_path / "run", "train.checkpoint_every_steps=-1")
    if how == "srun":
        codes, logs = run_srun(args, [tmp_path / f"rank{r}.log" for r in range(2)])
        assert codes == [2, 2]
        assert [len(ERRORS.findall(text)) for text in logs] == [1, 0]
        text = logs[0]
    else:
        r = launcher.run(args, nproc=2, launcher="colossalai", timeout=TIMEOUT)  # its ranks' output merged
        assert r.returncode != 0
        text = r.stdout + r.stderr
    assert ERRORS.findall(text) == [
        "error: command line: 'train.checkpoint_every_steps' must be >= 0 (0: no periodic checkpoints), got -1; "
        "set it like train.checkpoint_every_steps=500"
    ]


def test_every_kind_of_damage_is_one_warning_and_nothing_is_lost_then_no_periodic_checkpoints(
    reference, demo_data, tmp_path
):
    """One process: four damaged newest checkpoints, then steps 5..7 with train.checkpoint_every_steps=0
    (which used to divide by zero after the first step): only the final checkpoint is written."""
    workdir = tmp_path / "run"
    ckpts = copy_run(reference, workdir)
    (ckpts / "step_0000012" / "meta.json").unlink()
    (ckpts / "step_0000010" / "meta.json").write_text('{"format_version": 2, "st')
    (ckpts / "step_0000008" / "__0_0.distcp").write_bytes(b"")
    w = ckpts / "step_0000006" / "__0_0.distcp"
    w.write_bytes(w.read_bytes()[:4096])
    r = launcher.run(
        train_args(demo_data, workdir, "train.max_steps=7", "train.checkpoint_every_steps=0"), launcher="single"
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    warned = WARNED.findall(out)
    why = {
        12: "no meta.json",
        10: "meta.json is not JSON: ",
        8: "__0_0.distcp has 0 bytes, meta.json records ",
        6: "__0_0.distcp has 4,096 bytes, meta.json records ",
    }
    assert len(warned) == len(why), out[-3000:]
    for line, (step, reason) in zip(warned, why.items()):
        assert line.startswith(f"warning: checkpoint {ckpts}/step_{step:07d} fails its check ({reason}"), line
        assert line.endswith("; passed over")
    assert resumed_at(out) == [(str(ckpts / "step_0000004"), 4)]
    [aside] = ckpts.glob("abandoned_*")
    assert names(aside) == ["step_0000006", "step_0000008", "step_0000010", "step_0000012"]
    assert checkpoint_steps(workdir) == [2, 4, 7]


def as_format_1(ckpt: Path) -> None:
    """Rewrites a one-process checkpoint in v0.1's layout: model.safetensors, optimizer.pt (by parameter
    index), rank_00000.pt, meta.json without file records."""
    import json
    import warnings

    import torch
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    from vitlarge.checkpoint.sharded import Reader, param_names
    from vitlarge.config.load import load_recipe
    from vitlarge.config.schema import OptimConfig
    from vitlarge.model.vit import build_model
    from vitlarge.optim.lamb import build_optimizer

    meta = json.loads((ckpt / "meta.json").read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "assuming the intent is to load in a single process"
        saved = _load_state_dict_from_keys(storage_reader=Reader(ckpt))
    cfg = load_recipe(RECIPE)
    model = build_model(cfg)
    names = param_names(model, build_optimizer(model, OptimConfig(name=cfg.optim.name, lr=1.0, weight_decay=0.1)))
    index = {n: i for i, n in enumerate(names)}
    optim = {
        "state": {index[n]: s for n, s in saved["optimizer"]["state"].items()},
        "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in saved["optimizer"]["param_groups"]],
    }
    for f in [*ckpt.glob("*.distcp"), ckpt / ".metadata"]:
        f.unlink()
    save_file({k: v.contiguous() for k, v in saved["model"].items()}, str(ckpt / "model.safetensors"))
    torch.save(optim, ckpt / "optimizer.pt")
    meta["format_version"] = 1
    del meta["files"], meta["optimizer_state"]
    (ckpt / "meta.json").write_text(json.dumps(meta))


def test_a_checkpoint_of_the_previous_release_resumes_with_a_fresh_data_stream(demo_data, tmp_path):
    """v0.1 wrote format-1 checkpoints (no file records) whose loader state (version 1) belongs to a
    pipeline this release changed. A user mid-run upgrades: the run resumes weights, optimizer and
    step, says in one line that the data stream restarts, and finishes; nothing is refused."""
    import json

    import torch

    workdir = tmp_path / "run"
    first = launcher.run(train_args(demo_data, workdir, "train.max_steps=2"), launcher="single", timeout=TIMEOUT)
    assert first.returncode == 0, first.stderr[-3000:]
    ckpt = workdir / "checkpoints" / "step_0000002"
    as_format_1(ckpt)
    state = torch.load(ckpt / "rank_00000.pt", weights_only=True)
    data = json.loads(state["data"])
    state["data"] = json.dumps({**data, "version": 1})
    torch.save(state, ckpt / "rank_00000.pt")
    shutil.rmtree(workdir / "model")

    r = launcher.run(train_args(demo_data, workdir, "train.max_steps=4"), launcher="single", timeout=TIMEOUT)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-3000:]
    assert resumed_at(log) == [(str(ckpt), 2)]
    warnings = [x for x in log.splitlines() if "older vitlarge" in x]
    assert (
        len(warnings) == 1
        and f"{ckpt} holds a data-loader position from an older vitlarge (state version 1)" in warnings[0]
    )
    assert checkpoint_steps(workdir) == [2, 4] and (workdir / "model" / "model.safetensors").is_file()
