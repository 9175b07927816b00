"""DALI's read workers (``data.read_workers``, vitlarge/data/repeats.py): processes the loader starts.

Moved from tests/unit/data/test_repeats.py (issue 32: the unit tier starts no process): the same stream with and
without workers, the workers ending with the training process however it ends, a killed worker named, a
preemption's SIGUSR1 survived, a /dev/shm too small. The loader's in-process contract stays in that file.
"""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from tests.helpers.loaders import open_train

CPU = torch.device("cpu")


def test_read_workers_give_the_same_stream_and_resume_exactly(demo_data):
    """DALI's parallel external source (``read_workers`` spawned processes reading the records) yields bitwise the
    stream the training thread reads itself, across an epoch boundary (719 records per rank = 22.5 batches), and
    a state saved with workers resumes without them and the other way round."""
    kw = dict(rank=1, world_size=2, device=CPU, seed=4, repeats=3, num_threads=1)
    serial = open_train(demo_data, 32, 32, **kw)
    parallel = open_train(demo_data, 32, 32, read_workers=2, **kw)
    for _ in range(24):
        (a, la), (b, lb) = next(serial), next(parallel)
        assert torch.equal(la, lb) and torch.equal(a, b)
    saved_serial, saved_parallel = serial.state(), parallel.state()
    expected = [next(serial) for _ in range(3)]
    resumed = [
        open_train(demo_data, 32, 32, state=saved_parallel, read_workers=0, **kw),
        open_train(demo_data, 32, 32, state=saved_serial, read_workers=1, **kw),
    ]
    for loader in resumed:
        for (img_a, lab_a), (img_b, lab_b) in zip(expected, (next(loader) for _ in range(3))):
            assert torch.equal(lab_a, lab_b) and torch.equal(img_a, img_b)


READER_PROCESS = """
import os, sys, torch
from vitlarge.data import TrainLoader, TrainSpec
if __name__ == "__main__":
    loader = TrainLoader(TrainSpec(sys.argv[1], 16, 16, seed=0, repeats=3, read_workers=2, num_threads=1),
                         rank=0, world_size=1, device=torch.device("cpu"))
    next(loader)
    me = os.getpid()
    print(open(f"/proc/{me}/task/{me}/children").read(), flush=True)
    os.kill(me, 9) if sys.argv[2] == "kill" else os._exit(0)
"""


@pytest.mark.parametrize("end", ["kill", "exit"])
def test_read_workers_end_with_the_training_process(demo_data, tmp_path, end):
    """A training process killed with SIGKILL (preemption, OOM killer) or ended by os._exit (train.py's exit)
    takes its DALI read workers with it; before, both left two orphans per rank."""
    import subprocess
    import sys
    import time

    from tests.helpers import ROOT

    script = tmp_path / "reader_process.py"
    script.write_text(READER_PROCESS)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, str(script), demo_data, end], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env
    )
    assert done.returncode == (-9 if end == "kill" else 0), done.stderr[-2000:]
    workers = [int(p) for p in done.stdout.split()]
    assert len(workers) >= 2  # DALI's two read workers (and multiprocessing's resource tracker)
    deadline = time.monotonic() + 15
    while any(os.path.exists(f"/proc/{p}") for p in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    alive = [p for p in workers if os.path.exists(f"/proc/{p}")]
    for p in alive:  # leave nothing behind even when the test fails
        os.kill(p, 9)
    assert not alive


WORKER_KILLED_PROCESS = """
import os, signal, sys, time, torch
from vitlarge.data import TrainLoader, TrainSpec
if __name__ == "__main__":
    loader = TrainLoader(TrainSpec(sys.argv[1], 16, 16, seed=0, repeats=3, read_workers=2, num_threads=1),
                         rank=0, world_size=1, device=torch.device("cpu"))
    if sys.argv[2] == "after":
        next(loader)
    me = os.getpid()
    kids = [int(p) for p in open(f"/proc/{me}/task/{me}/children").read().split()]
    workers = [p for p in kids if b"resource_tracker" not in open(f"/proc/{p}/cmdline", "rb").read()]
    if sys.argv[3] == "usr1":  # a preemption: srun gives SIGUSR1 to every process of the step
        signal.signal(signal.SIGUSR1, lambda *_: print("preempted", flush=True))
        os.killpg(os.getpgid(0), signal.SIGUSR1)
    else:  # as the OOM killer would, the first or the last worker DALI started
        os.kill(workers[0 if sys.argv[3] == "first" else -1], signal.SIGKILL)
    time.sleep(1)
    try:
        for _ in range(20):
            next(loader)
    except RuntimeError as e:
        print(workers[0 if sys.argv[3] == "first" else -1], e, flush=True)
        os._exit(1)
    print("read 20 batches", flush=True)
    os._exit(0)
"""


def _run_reader(script, demo_data: str, *args: str):
    import subprocess
    import sys

    from tests.helpers import ROOT

    return subprocess.run(
        [sys.executable, str(script), demo_data, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        start_new_session=True,  # its own process group, for the SIGUSR1 to all of it
    )


@pytest.mark.parametrize("when, which", [("before", "first"), ("after", "first"), ("after", "last")])
def test_a_read_worker_killed_is_an_error_naming_it_not_a_hang_or_dev_shm(demo_data, tmp_path, when, which):
    """A read worker killed (the OOM killer: each holds ~400 MB) before the first batch made the next batch wait
    forever in DALI's pool; after one, the loader blamed /dev/shm (24 GB free) with exit 2. Now: the worker, its
    signal and the key, in one error that is not bad input; the worker killed, not one DALI then stopped."""
    script = tmp_path / "worker_killed.py"
    script.write_text(WORKER_KILLED_PROCESS)
    done = _run_reader(script, demo_data, when, which)
    assert done.returncode == 1, done.stdout[-1000:] + done.stderr[-2000:]
    pid, message = done.stdout.strip().split(" ", 1)
    assert f"read worker {pid} (data.read_workers) was killed by SIGKILL" in message
    assert "/dev/shm" not in message and "data.read_workers=0" in message


def test_read_workers_outlive_a_preemption_signal_to_the_whole_process_group(demo_data, tmp_path):
    """srun forwards the requeue's SIGUSR1 to every process of the step: the training process checkpoints at its
    next step boundary, reading batches until then, so its workers must not die of it (they did: no 75)."""
    script = tmp_path / "worker_killed.py"
    script.write_text(WORKER_KILLED_PROCESS)
    done = _run_reader(script, demo_data, "after", "usr1")
    assert done.returncode == 0, done.stdout[-1000:] + done.stderr[-2000:]
    assert done.stdout.split() == ["preempted", "read", "20", "batches"]


SHM_PROCESS = """
import sys, torch
from vitlarge.data import TrainLoader, TrainSpec
from vitlarge.errors import UserError
if __name__ == "__main__":
    loader = TrainLoader(TrainSpec(sys.argv[1], 128, 16, seed=0, repeats=3, read_workers=int(sys.argv[2]), num_threads=1),
                         rank=0, world_size=1, device=torch.device("cpu"))
    try:
        for _ in range(12):
            next(loader)
    except UserError as e:
        print(e, file=sys.stderr)
        sys.exit(2)
    print("read 12 batches")
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root for a private /dev/shm")
def test_a_dev_shm_too_small_for_the_read_workers_is_one_line_naming_the_key(demo_data, tmp_path):
    """Read workers pass batches through /dev/shm, which containers keep at 64 MiB unless told: in a mount namespace
    with a 64 KiB /dev/shm the loader says so in one line naming data.read_workers; 0 workers read there fine."""
    import subprocess
    import sys

    from tests.helpers import ROOT

    script = tmp_path / "shm_process.py"
    script.write_text(SHM_PROCESS)
    outs = {}
    for workers in (2, 0):
        command = f"mount -t tmpfs -o size=64k tmpfs /dev/shm && exec {sys.executable} {script} {demo_data} {workers}"
        outs[workers] = subprocess.run(
            ["unshare", "-m", "sh", "-c", command],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )
    failed, fine = outs[2], outs[0]
    assert failed.returncode == 2, failed.stderr[-2000:]
    line = failed.stderr.strip().splitlines()[-1]
    assert "data.read_workers" in line and "/dev/shm" in line and "--shm-size" in line
    assert fine.returncode == 0 and "read 12 batches" in fine.stdout, fine.stderr[-2000:]
