"""Repeated augmentation (``data.repeats``, vitlarge/data/repeats.py): every index counted at world sizes 1-9,
the order against timm's ``RepeatAugSampler``, and the real DALI loader reading it and resuming mid-epoch."""

from __future__ import annotations

import math
import os
import shutil
from collections import Counter

import numpy as np
import pytest
import torch
from timm.data.distributed_sampler import RepeatAugSampler

from data_tools.make_id_dataset import make_id_dataset
from vitlarge.config.schema import Config
from vitlarge.data import TrainLoader
from vitlarge.data.common import SettingsChanged
from vitlarge.data.repeats import epoch_order
from vitlarge.data.sources import train_loader

CPU = torch.device("cpu")
N = 2521  # 2520 + 1: divisible by none of the world sizes 2..9


def timm_order(n: int, rank: int, world: int, repeats: int, epoch_key: int) -> list[int]:
    sampler = RepeatAugSampler(range(n), num_replicas=world, rank=rank, num_repeats=repeats, selected_round=0)
    sampler.set_epoch(epoch_key)
    return list(sampler)


@pytest.mark.parametrize("repeats", [2, 3])
@pytest.mark.parametrize("world", range(1, 10))
def test_every_index_is_counted_at_any_world_size(world, repeats):
    """Per epoch each rank reads ceil(n / world) records; over the ranks the records are the first
    ``ceil(world * ceil(n / world) / repeats)`` of a permutation, each ``repeats`` times (only the last one
    may be cut short, where the epoch's length is not a multiple of ``repeats``, as in timm); the copies of an
    image sit on different ranks when ``world >= repeats``; the next epoch is another selection in another order."""
    per_rank = math.ceil(N / world)
    epochs = []
    for epoch in range(2):
        orders = [epoch_order(N, rank, world, repeats, 7, epoch) for rank in range(world)]
        assert all(len(o) == per_rank for o in orders)
        counts = Counter(i for o in orders for i in o)
        assert sum(counts.values()) == world * per_rank
        assert len(counts) == math.ceil(world * per_rank / repeats)
        short = [i for i, c in counts.items() if c != repeats]
        assert len(short) == (1 if world * per_rank % repeats else 0)
        assert all(counts[i] == world * per_rank % repeats for i in short)
        if world >= repeats:
            ranks_of = {}
            for rank, o in enumerate(orders):
                for i in o:
                    ranks_of.setdefault(i, []).append(rank)
            assert all(len(set(r)) == len(r) for r in ranks_of.values())
        epochs.append((orders, set(counts)))
    (first, chosen_first), (second, chosen_second) = epochs
    assert chosen_first != chosen_second and all(a != b for a, b in zip(first, second))


@pytest.mark.parametrize("world", [1, 4, 7])
def test_the_order_is_timms_repeat_aug_sampler(world):
    """With seed 0, epoch e is timm's ``RepeatAugSampler(selected_round=0).set_epoch(e)`` exactly; another seed
    is timm's at ``(seed * 0x9E3779B1 + e) mod 2**32`` (timm seeds with the epoch alone; torch keeps 32 bits)."""
    for rank in range(world):
        for epoch in range(3):
            assert epoch_order(N, rank, world, 3, 0, epoch) == timm_order(N, rank, world, 3, epoch)
            assert epoch_order(N, rank, world, 3, 5, epoch) == timm_order(
                N, rank, world, 3, (5 * 0x9E3779B1 + epoch) % 2**32
            )
    seeds = [epoch_order(N, 0, world, 3, seed, 0) for seed in (5, 6, 1005, 2**31 - 1)]
    assert all(a != b for i, a in enumerate(seeds) for b in seeds[:i])


@pytest.fixture(scope="module")
def ids_601(tmp_path_factory) -> str:
    """601 identifiable records (label = record index) in 7 shards."""
    return make_id_dataset(str(tmp_path_factory.mktemp("ids_601")), train=601, train_shards=7).data_dir


def labels(loader, batches: int) -> list[int]:
    return torch.cat([next(loader)[1] for _ in range(batches)]).tolist()


@pytest.mark.parametrize("world", [2, 4])
def test_the_dali_loader_reads_each_ranks_stream_across_epochs(ids_601, world):
    """The loader's labels (= record indices) are each rank's epochs one after another (batches straddle the
    boundary, as the reader's do), through the config path; and every record is read where it should be."""
    cfg = Config()
    cfg.data.path, cfg.data.image_size, cfg.data.repeats, cfg.train.micro_batch, cfg.train.seed = ids_601, 8, 3, 32, 9
    per_rank = math.ceil(601 / world)
    batches = 2 * per_rank // 32 + 1
    for rank in range(world):
        loader = train_loader(cfg, rank, world, CPU)
        assert loader.num_examples_this_rank == per_rank
        stream = [i for e in range(3) for i in epoch_order(601, rank, world, 3, 9, e)]
        assert labels(loader, batches) == stream[: batches * 32]


def test_the_copies_on_three_ranks_are_augmented_independently(demo_data):
    """world 3, repeats 3: the ranks read the same images in the same order (copy c of image j is rank c's j-th
    record), each through its own augmentation."""
    kw = dict(world_size=3, device=CPU, seed=2, repeats=3)
    ranks = [TrainLoader(demo_data, 16, 32, rank=r, **kw) for r in range(3)]
    for _ in range(3):
        (x0, y0), (x1, y1), (x2, y2) = (next(loader) for loader in ranks)
        assert torch.equal(y0, y1) and torch.equal(y1, y2)
        assert all(not torch.equal(a[i], b[i]) for a, b in ((x0, x1), (x1, x2), (x0, x2)) for i in range(16))


@pytest.mark.parametrize("stop_after", [5, 22])  # mid-epoch 1; the batch that straddles into epoch 2
def test_resume_mid_epoch_with_repeats_is_exact(demo_data, stop_after):
    """A DALI loader with repeats=3 stopped mid-epoch and rebuilt from its state yields bitwise the batches the
    uninterrupted loader yields (1437 records per rank and epoch at world 2 are 719: 22.5 batches of 32)."""
    kw = dict(rank=1, world_size=2, device=CPU, seed=4, repeats=3, randaugment="rand-m9-n2")
    loader = TrainLoader(demo_data, 32, 32, **kw)
    for _ in range(stop_after):
        next(loader)
    state = loader.state()
    expected = [next(loader) for _ in range(6)]
    restored = TrainLoader(demo_data, 32, 32, state=state, **kw)
    for (img_a, lab_a), (img_b, lab_b) in zip(expected, (next(restored) for _ in range(6))):
        assert torch.equal(lab_a, lab_b) and torch.equal(img_a, img_b)
    assert loader.num_examples_this_rank == 719


def test_a_state_of_another_repeats_is_refused_and_repeats_1_keeps_the_old_fingerprint(demo_data):
    kw = dict(rank=0, world_size=1, device=CPU, seed=0)
    plain = TrainLoader(demo_data, 16, 32, **kw)
    assert TrainLoader(demo_data, 16, 32, repeats=1, **kw)._fingerprint == plain._fingerprint
    state = TrainLoader(demo_data, 16, 32, repeats=3, **kw).state()
    with pytest.raises(SettingsChanged):
        TrainLoader(demo_data, 16, 32, state=state, **kw)


class SampleInfo:
    """What DALI passes a sample-mode source: the sample's position in the (never ending) epoch."""

    def __init__(self, idx_in_epoch: int):
        self.idx_in_epoch = idx_in_epoch


def test_read_workers_give_the_same_stream_and_resume_exactly(demo_data):
    """DALI's parallel external source (``read_workers`` spawned processes reading the records) yields bitwise the
    stream the training thread reads itself, across an epoch boundary (719 records per rank = 22.5 batches), and
    a state saved with workers resumes without them and the other way round."""
    kw = dict(rank=1, world_size=2, device=CPU, seed=4, repeats=3, num_threads=1)
    serial = TrainLoader(demo_data, 32, 32, **kw)
    parallel = TrainLoader(demo_data, 32, 32, read_workers=2, **kw)
    for _ in range(24):
        (a, la), (b, lb) = next(serial), next(parallel)
        assert torch.equal(la, lb) and torch.equal(a, b)
    saved_serial, saved_parallel = serial.state(), parallel.state()
    expected = [next(serial) for _ in range(3)]
    resumed = [
        TrainLoader(demo_data, 32, 32, state=saved_parallel, read_workers=0, **kw),
        TrainLoader(demo_data, 32, 32, state=saved_serial, read_workers=1, **kw),
    ]
    for loader in resumed:
        for (img_a, lab_a), (img_b, lab_b) in zip(expected, (next(loader) for _ in range(3))):
            assert torch.equal(lab_a, lab_b) and torch.equal(img_a, img_b)


READER_PROCESS = """
import os, sys, torch
from vitlarge.data import TrainLoader
if __name__ == "__main__":
    loader = TrainLoader(sys.argv[1], 16, 16, rank=0, world_size=1, device=torch.device("cpu"), seed=0, repeats=3,
                         read_workers=2, num_threads=1)
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
from vitlarge.data import TrainLoader
if __name__ == "__main__":
    loader = TrainLoader(sys.argv[1], 16, 16, rank=0, world_size=1, device=torch.device("cpu"), seed=0, repeats=3,
                         read_workers=2, num_threads=1)
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


def test_a_loader_with_read_workers_is_built_in_the_main_thread(demo_data):
    """Its workers die with the thread that started them (PR_SET_PDEATHSIG): a loader built in a helper thread
    would lose them when the thread ends, and then wait forever."""
    import threading

    import torch

    from vitlarge.data import TrainLoader

    errors = []

    def build():
        try:
            TrainLoader(demo_data, 16, 16, rank=0, world_size=1, device=torch.device("cpu"), seed=0, repeats=3,
                        read_workers=1, num_threads=1)  # fmt: skip
        except RuntimeError as e:
            errors.append(str(e))

    t = threading.Thread(target=build)
    t.start()
    t.join(60)
    assert errors == ["a TrainLoader with read_workers > 0 must be built in the main thread"]


SHM_PROCESS = """
import sys, torch
from vitlarge.data import TrainLoader
from vitlarge.errors import UserError
if __name__ == "__main__":
    loader = TrainLoader(sys.argv[1], 128, 16, rank=0, world_size=1, device=torch.device("cpu"), seed=0, repeats=3,
                         read_workers=int(sys.argv[2]), num_threads=1)
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


def test_the_reader_pickles_without_its_open_files(ids_601):
    """DALI's spawned workers get a pickled copy: it reads the same records, and the copy's files are its own."""
    import pickle

    from vitlarge.data import repeats
    from vitlarge.data.manifest import load_manifest

    shards = [
        (os.path.join(ids_601, s.file), os.path.join(ids_601, s.index)) for s in load_manifest(ids_601).shards("train")
    ]
    reader = repeats.RepeatedRecords(shards, rank=2, world_size=5, repeats=3, seed=1)
    first = [reader(SampleInfo(p)) for p in range(200, 260)]
    assert reader._files
    copy = pickle.loads(pickle.dumps(reader))
    assert copy._files == {} and copy._orders == {}
    again = [copy(SampleInfo(p)) for p in range(200, 260)]
    assert all(np.array_equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(first, again))
    assert [int(x[1][0]) for x in first] == [reader.record_at(p) for p in range(200, 260)]
    reader.close(), copy.close()


LIMITED_READER_PROCESS = """
import json, os, resource, sys
from nvidia.dali.types import SampleInfo
from vitlarge.data import repeats
from vitlarge.data.manifest import load_manifest
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[2]), int(sys.argv[3])))
d = sys.argv[1]
shards = [(os.path.join(d, s.file), os.path.join(d, s.index)) for s in load_manifest(d).shards("train")]
reader = repeats.RepeatedRecords(shards, rank=0, world_size=1, repeats=3, seed=0)
read, most_open = [], 0
for position in range(reader.per_rank):
    read.append(int(reader(SampleInfo(position, position, 0, 0))[1][0]))
    most_open = max(most_open, len(reader._files))
print(json.dumps(dict(read=read, most_open=most_open, max_open=reader.max_open,
                      soft=resource.getrlimit(resource.RLIMIT_NOFILE)[0])))
"""


def _can_raise_hard_limit_to(n: int) -> bool:
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return hard == resource.RLIM_INFINITY or hard >= n or os.geteuid() == 0


@pytest.mark.parametrize("soft, hard", [(256, 4096), (256, 256)])
def test_a_reader_keeps_every_shard_open_where_the_file_limit_allows_and_reads_them_all_right(tmp_path, soft, hard):
    """ImageNet has 1024 training shards, and the stream touches another shard for nearly every record: the reader
    raises the soft open-file limit to keep them all open (a limit of 256 and 300 shards: raised to 300 + 1024 + 2).
    Where the hard limit forbids it (256), it keeps FEWEST_OPEN, least recently used closed first. Either way
    every record reads right."""
    import json
    import subprocess
    import sys

    from tests.helpers import ROOT
    from vitlarge.data import repeats

    if not _can_raise_hard_limit_to(hard):
        pytest.skip(f"the hard open-file limit is below {hard}")
    n_shards = 300
    m = make_id_dataset(str(tmp_path / "ids"), train=3 * n_shards, train_shards=n_shards)
    done = subprocess.run(
        [sys.executable, "-c", LIMITED_READER_PROCESS, m.data_dir, str(soft), str(hard)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["read"] == epoch_order(3 * n_shards, 0, 1, 3, 0, 0)  # the labels are the record indices
    if hard > soft:
        touched = len({record // 3 for record in out["read"]})  # an epoch shows about a third of the images
        assert out["soft"] == n_shards + repeats.reserved_files(1)
        assert out["max_open"] == n_shards and out["most_open"] == touched  # each opened once, none closed
    else:
        assert out["soft"] == soft and out["max_open"] == out["most_open"] == repeats.FEWEST_OPEN


def test_the_open_budget_leaves_the_rest_of_the_process_its_files():
    """Two descriptors per rank besides OTHER_FILES: rank 0 of 256 gloo ranks holds a connection to each peer and
    the rendezvous store's."""
    from vitlarge.data.repeats import FEWEST_OPEN, OTHER_FILES, open_budget, reserved_files

    assert reserved_files(256) == OTHER_FILES + 512
    assert open_budget(1024, 1024, 8) == FEWEST_OPEN  # the usual soft limit, not raised: what the first version kept
    assert open_budget(1024, 1024 + reserved_files(8), 8) == 1024
    assert open_budget(1024, 1024 + reserved_files(8), 256) == 1024 - 496
    assert open_budget(1024, 1 << 20, 128) == 1024 and open_budget(4, 1, 1) == 4
