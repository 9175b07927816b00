"""What holds for a process of its own from its start: tests/unit runs in the pytest process, so these start one.

Moved from tests/unit (issue 32; the test names kept): thread pools sized before torch loads
(distributed/test_launch.py), gloo's "connected" line on fd 1 (distributed/test_quiet.py), deprecations as errors
in a started process (test_deprecations.py), and a reader under a hard open-file limit that this process could not
raise again (data/test_repeats.py). Each is one short ``python -c``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from data_tools.make_id_dataset import make_id_dataset
from tests.helpers import ROOT
from vitlarge.data.repeats import epoch_order


def test_size_thread_pools_in_a_fresh_process_sets_torch_and_omp():
    """In a real process as srun starts it (2 tasks on this node, no OMP_NUM_THREADS), sized before torch
    loads as train.py does: PyTorch's pool and OMP_NUM_THREADS follow the affinity mask / tasks."""
    code = textwrap.dedent("""
        import logging, os, sys
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        from vitlarge.distributed import launcher
        from vitlarge.distributed import threads
        env = launcher.detect()
        assert "torch" not in sys.modules  # as in train.py: torch loads after, and takes the size
        n, why = threads.size_thread_pools()
        import torch
        print("RESULT", n, torch.get_num_threads(), os.environ["OMP_NUM_THREADS"], why, flush=True)
    """)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMP_", "RANK", "WORLD_SIZE"))}
    cpus = len(os.sched_getaffinity(0))
    for rank in (0, 1):
        env = {
            **base,
            "SLURM_PROCID": str(rank),
            "SLURM_NTASKS": "2",
            "SLURM_STEP_ID": "0",
            "SLURM_STEP_TASKS_PER_NODE": "2",
            "SLURM_JOB_NODELIST": "localhost",
        }
        r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        want = max(1, cpus // 2)
        assert f"RESULT {want} {want} {want}" in r.stdout, r.stdout
        assert f"{cpus} usable CPUs / 2 tasks on this node (SLURM_STEP_TASKS_PER_NODE)" in r.stdout, r.stdout


GROUP_OF_ONE = """
import os, sys
from vitlarge.distributed.process import init_distributed
from vitlarge.distributed.launcher import DistEnv, free_port
from vitlarge.distributed.quiet import gloo_connected_lines_dropped
import contextlib
quiet = contextlib.nullcontext() if sys.argv[1] == "loud" else gloo_connected_lines_dropped()
print("before", flush=True)
with quiet:
    print("inside, from python", flush=True)
    init_distributed(DistEnv(0, 1, 0, "127.0.0.1", free_port(), "single"), "gloo")
    os.write(1, b"inside, from fd 1\\n")
print("after", flush=True)
"""


def test_gloos_connected_line_goes_and_the_rest_of_stdout_stays_in_order():
    def stdout(mode: str) -> list[str]:
        r = subprocess.run(
            [sys.executable, "-c", GROUP_OF_ONE, mode], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, r.stderr[-3000:]
        return r.stdout.splitlines()

    loud = stdout("loud")
    assert "[Gloo] Rank 0 is connected to 0 peer ranks. Expected number of connected peer ranks is : 0" in loud
    assert stdout("quiet") == ["before", "inside, from python", "inside, from fd 1", "after"]


@pytest.mark.parametrize("category", ["DeprecationWarning", "FutureWarning"])
def test_a_deprecation_in_a_started_process_fails_it(category):
    p = subprocess.run(
        [sys.executable, "-c", f"import warnings; warnings.warn('an old API', {category}); print('went on')"],
        capture_output=True,
        text=True,
    )
    assert p.returncode != 0 and "went on" not in p.stdout and category in p.stderr


def test_only_the_named_dependency_module_is_excused():
    code = (
        "import torch.jit._script as s, warnings\n"
        "warnings.warn_explicit('old', DeprecationWarning, 'x.py', 1, module='torch.jit._script')\n"
        "warnings.warn_explicit('old', DeprecationWarning, 'x.py', 1, module='vitlarge.model.vit')\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode != 0 and "DeprecationWarning: old" in p.stderr and p.stderr.count("DeprecationWarning") == 1


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


@pytest.mark.parametrize("soft, hard", [(256, 256)])  # (256, 4096): in tests/unit, in process
def test_a_reader_keeps_every_shard_open_where_the_file_limit_allows_and_reads_them_all_right(tmp_path, soft, hard):
    """ImageNet has 1024 training shards, and the stream touches another shard for nearly every record: the reader
    raises the soft open-file limit to keep them all open (a limit of 256 and 300 shards: raised to 300 + 1024 + 2).
    Where the hard limit forbids it (256), it keeps FEWEST_OPEN, least recently used closed first. Either way
    every record reads right."""
    import json

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


BOOSTER = """
import os, sys, tempfile
import torch
from vitlarge.distributed import process
from vitlarge.distributed.process import init_distributed
from vitlarge.distributed.launcher import DistEnv, free_port
from vitlarge.distributed.quiet import gloo_connected_lines_dropped

process.quiet_imports()  # as train.py starts
import timm  # noqa: F401 (imports W&B where installed)
import vitlarge.distributed.booster as b

b.load()  # as a rank does before its rendezvous
LORA_OR_TRACKERS = ("peft", "transformers", "bitsandbytes", "galore_torch", "sklearn", "colossalai.shardformer")
print("loaded", sorted(m for m in LORA_OR_TRACKERS if m in sys.modules))
print("wandb ran", "wandb.sdk" in sys.modules)
import colossalai.quantization.bnb as q  # its version check read bitsandbytes' metadata
print("bnb", q.IS_4BIT_BNB_AVAILABLE, q.IS_8BIT_BNB_AVAILABLE, "bitsandbytes" in sys.modules)
with gloo_connected_lines_dropped():
    init_distributed(DistEnv(0, 1, 0, "127.0.0.1", free_port(), "single"), "gloo")
from colossalai.accelerator import set_accelerator
set_accelerator("cpu")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
before = model[1].bias.detach().clone()
booster = b.Booster(plugin=b.TorchDDPPlugin())
m, opt, *_ = booster.boost(model, torch.optim.SGD(model.parameters(), lr=0.1))
booster.backward(m(torch.ones(3, 4)).sum(), opt)
opt.step()
print("trained", m.unwrap() is model, not torch.equal(before, model[1].bias.detach()))

import peft  # LoRA through the same Booster: peft itself from here on
lora = b.Booster(plugin=b.TorchDDPPlugin()).enable_lora(
    torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)), lora_config=peft.LoraConfig(target_modules=["0"], r=2)
)
from colossalai.interface import model as interface
print("lora", type(lora).__name__, isinstance(lora, interface.PeftModel), isinstance(model, interface.PeftModel))
booster = b.Booster(plugin=b.TorchDDPPlugin())
wrapped, *_ = booster.boost(lora, torch.optim.SGD(lora.parameters(), lr=0.1))
out = tempfile.mkdtemp()
booster.save_lora_as_pretrained(wrapped, out)
print("saved", sorted(os.listdir(out)))
import wandb
print("wandb", wandb.Settings.__name__, "wandb.sdk" in sys.modules)
"""


def test_the_booster_imports_without_lora_or_quantization_and_lora_still_works_when_asked_for():
    """vitlarge.distributed.booster on Colossal-AI as pinned: the Booster trains with none of peft, transformers,
    bitsandbytes loaded, nor W&B run by timm's import (seconds of every rank's start); LoRA through the Booster still
    works afterwards, peft's PeftModel recognised. (The stand-ins' and the packages' rules, a name they do not hold
    among them: tests/unit/distributed/test_booster.py.)"""
    r = subprocess.run([sys.executable, "-c", BOOSTER], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert "loaded []" in lines and "wandb ran False" in lines and "bnb True True False" in lines, r.stdout
    assert "trained True True" in lines, r.stdout
    assert "lora PeftModel True False" in lines, r.stdout
    assert any(x.startswith("saved") and "adapter_config.json" in x for x in lines), r.stdout
    assert "wandb Settings True" in lines, r.stdout


HEAVY = ("torch", "nvidia.dali", "colossalai", "timm", "tensorboard", "mlflow", "wandb", "matplotlib")
"""The packages that take seconds to import: none is loaded on a path that does not use it (`test_light_paths`)."""

LOADED_BY = r"""
import json, runpy, sys
heavy, argv = json.loads(sys.argv[1]), sys.argv[2:]
def loaded():  # W&B as `quiet_imports` leaves it (a module not run yet) does not count
    return sorted(m for m in heavy if m in sys.modules and type(sys.modules[m]).__name__ != "_LazyModule")
seen = {}
if argv[0] == "train.py" and "--dry-run" in argv:  # what is loaded when the thread pools are sized, as the run does
    from vitlarge.distributed import threads
    size = threads.size_thread_pools
    def sized(*a, **k):
        seen["sizing the thread pools"] = loaded()
        return size(*a, **k)
    threads.size_thread_pools = sized
sys.argv, code = argv, 0
try:
    if argv[0] == "-m":
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.path[0] = "."
        runpy.run_path(argv[0], run_name="__main__")
except SystemExit as e:
    code = e.code
seen["the end"] = loaded()
print("LOADED", json.dumps([code, seen]), flush=True)
"""

# (the path, its command line, its exit status, the heavy packages it may load)
LIGHT_PATHS = [
    ("train.py --help", ["train.py", "--help"], 0, ()),
    ("train.py, a bad argument", ["train.py", "--config", "recipes/demo_digits.py", "--world-size", "2"], 2, ()),
    (
        "the dry run",
        ["train.py", "--config", "recipes/demo_digits.py", "data.source=synthetic", "--dry-run", "--workdir", "{tmp}"],
        0,
        ("torch", "timm"),
    ),
    ("vitlarge-evaluate, a bad argument", ["-m", "vitlarge.evaluate", "--config", "recipes/demo_digits.py"], 2, ()),
    ("vitlarge-plot, no metrics", ["-m", "vitlarge.report.plot", "{tmp}"], 2, ("matplotlib",)),
    ("vitlarge-convert --help", ["-m", "data_tools.imagenet_to_tfrecord", "--help"], 0, ()),
    ("vitlarge-index --help", ["-m", "data_tools.make_index", "--help"], 0, ()),
    ("the supervisor's parent", ["-m", "vitlarge.run", "--help"], 0, ("torch",)),
]


@pytest.mark.parametrize("path, argv, status, allowed", LIGHT_PATHS, ids=[p[0] for p in LIGHT_PATHS])
def test_light_paths(tmp_path, path, argv, status, allowed):
    """Each start-up path that needs none of `HEAVY` (or only the ones ``allowed``) loads none of the rest, in a
    fresh interpreter as the user starts it: ``--help``, a bad argument (vitlarge-evaluate's too), the data tools and the
    plot without PyTorch; the dry run until the thread pools are sized without PyTorch (their size is read as torch
    loads), then without DALI, Colossal-AI, TensorBoard, the trackers or matplotlib; the supervisor's parent (torchrun's
    agent) without any but torch. (Where a function-level import keeps one off such a path, it says so: ``# lazy:``, tests/unit/test_layout.py.)"""
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    r = subprocess.run(
        [sys.executable, "-c", LOADED_BY, json.dumps(HEAVY), *argv],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = next((x for x in r.stdout.splitlines() if x.startswith("LOADED ")), None)
    assert r.returncode == 0 and line, r.stderr[-3000:]
    code, seen = json.loads(line[len("LOADED ") :])
    assert code == status, (r.stdout[-2000:], r.stderr[-2000:])
    assert seen.pop("sizing the thread pools", []) == [], f"{path}: loaded before the thread pools are sized"
    assert sorted(set(seen["the end"]) - set(allowed)) == [], f"{path}: loaded"
