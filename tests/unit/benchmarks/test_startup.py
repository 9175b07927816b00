"""benchmarks/bench_startup.py's phase arithmetic on a made-up probe log (the runs themselves: python -m
benchmarks.bench_startup, minutes of 2-process runs)."""

from __future__ import annotations

import pytest

from benchmarks.bench_startup import END_CLOSE, END_EXPORT, END_HOOKS, _role, import_spans, launcher_phases, phases


def ev(t: float, kind: str, c: float | None = None, **fields) -> dict:
    return {"t": t, "c": t / 2 if c is None else c, "e": kind, **fields}


LOG = [
    ev(10.0, "process", at=10.0),
    ev(10.5, "probe"),
    ev(11.0, "import_start", name="torch"),
    ev(14.0, "import_end", name="torch"),
    ev(14.0, "import_start", name="colossalai.booster"),
    ev(14.5, "import_start", name="peft"),
    ev(20.5, "import_end", name="peft"),
    ev(21.0, "import_end", name="colossalai.booster"),
    ev(21.0, "group_start"),
    ev(22.0, "group_end"),
    ev(25.0, "train_start", first=True),
    ev(25.2, "import_start", name="torch.utils.tensorboard"),
    ev(25.7, "import_end", name="torch.utils.tensorboard"),
    ev(26.0, "train_start", first=False),
    ev(28.0, "step", step=1),
    ev(38.0, "step", step=11),
    ev(39.0, "train_end", first=True),
    ev(39.5, "import_start", name="matplotlib"),
    ev(40.0, "import_end", name="matplotlib"),
    ev(41.0, "train_end", first=False),
    ev(42.0, "export"),
    ev(42.5, "close"),
]


def test_nested_imports_count_once_in_their_own_group():
    spans = {name: own for name, _, own in import_spans(LOG)}
    assert spans["peft"] == 6.0 and spans["colossalai.booster"] == pytest.approx(1.0)  # 7 s less peft's 6


def test_the_phases_add_up_to_the_start_up_and_the_end():
    p = phases(LOG, launched=8.0, exited=45.0, first_step=28.0, last_step=38.0)
    assert p["launcher"] == 2.0 and p["interpreter"] == 0.5 and p["rendezvous"] == 1.0
    assert p["import torch"] == 3.0 and p["import Colossal-AI"] == 1.0 and p["import peft, transformers, bitsandbytes"]
    assert p["hooks' start (trackers, TensorBoard)"] == 0.5 and p["import TensorBoard"] == 0.5
    assert p["first step"] == 2.0
    start = [k for k in p if not k.startswith("end") and k not in ("loop (first step's end to the last one's)",)]
    parts = [k for k in start if k not in ("start-up (launch to the first step's end)", "outside the loop", "wall")]
    assert sum(p[k] for k in parts) == pytest.approx(p["start-up (launch to the first step's end)"]) == 20.0
    assert p["end: final evaluation and checkpoint"] == 1.0 and p["end: import matplotlib"] == 0.5
    # vitlarge's own end-of-run work, each its phase: the picture and TensorBoard's close, the export, the close
    assert p[END_HOOKS] == 1.5 and p[END_EXPORT] == 1.0 and p[END_CLOSE] == 0.5
    assert p["end: exit"] == 2.5 and p["end (the last step's end to the exit)"] == 7
    assert p["outside the loop"] == 27.0 and p["wall"] == 37.0


def test_cpu_phases_read_the_process_clock_between_events():
    p = phases(LOG, launched=8.0, exited=45.0, first_step=28.0, last_step=38.0, cpu=True)
    assert "launcher" not in p  # another process's
    assert p["import torch"] == 1.5 and p["first step"] == 1.0  # c = t / 2 in the log
    assert p["end: exit"] == 0.0  # no clock after the last event: the process is gone
    timm = [e for e in LOG if e["e"] not in ("train_start", "train_end", "export", "close")] + [ev(44.0, "tick")]
    p = phases(timm, 8.0, 45.0, first_step=28.0, last_step=38.0, loop_start=26.0, result_at=42.5, cpu=True)
    assert p["setup (config, model, optimizer, Booster, resume, loaders)"] == pytest.approx(2.0)
    assert p["end: final evaluation and checkpoint"] == pytest.approx(2.0)  # 38 -> 42.5, matplotlib's 0.25 out


def test_the_launch_is_split_by_process_role():
    """`colossalai run` starts torchrun, which starts the ranks: each role's start and CPU seconds."""
    assert _role(["/v/bin/python", "/v/bin/colossalai", "run", "--nproc_per_node", "2"]) == "colossalai run"
    assert _role(["/bin/sh", "-c", "cd /x && torchrun --nproc_per_node=2 probe"]) == "shell"
    assert _role(["/v/bin/python", "/v/bin/torchrun", "--nproc_per_node", "2", "/b/startup_probe.py"]) == "torchrun"
    assert _role(["/v/bin/python", "-u", "/b/startup_probe.py", "train.py"]) == "ranks"
    seen = {
        "1": dict(role="colossalai run", start=10.0, last=29.0, cpu=4.0),
        "2": dict(role="torchrun", start=13.0, last=28.0, cpu=3.0),
        "3": dict(role="ranks", start=14.0, last=27.0, cpu=9.0),
        "4": dict(role="ranks", start=14.1, last=26.0, cpu=8.0),
    }
    wall, cpu = launcher_phases(seen, launched=9.5, exited=29.5)
    assert wall["launch: until torchrun starts"] == 3.5 and wall["launch: until ranks starts"] == 4.5
    assert (
        wall["launch: torchrun exit to the command's exit"] == 1.5
        and wall["launch: ranks exit to the command's exit"] == 2.5
    )
    assert cpu["CPU of ranks (all its processes)"] == 17.0 and cpu["CPU of colossalai run (all its processes)"] == 4.0
