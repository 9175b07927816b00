"""Start-up: the time a run spends outside its training loop, by phase, against timm's train.py on the same demo.

Question: Does vitlarge's train.py spend no more time outside its training loop than timm's train.py?
Goal: vitlarge's median time outside the loop at most timm's (both on 2 CPU processes, the same machine, interleaved).

Run: ``python -m benchmarks.bench_startup [--rounds 3] [--baseline DIR] [--timm-src DIR]`` (2 CPU processes per run,
OMP_NUM_THREADS=1; about 1 min per run on 2 cores of an AMD EPYC, so 3 rounds of 2-3 contenders take 6-10 min).
Writes ``benchmarks/results/startup.json`` and prints a table of the phases' medians.

Contenders, each 2 gloo processes on the digits demo (`benchmarks.bench_timm_parity`'s data, recipe and timm
checkout), for one epoch (11 optimizer steps), with a final evaluation and a checkpoint:

- ``vitlarge``: ``colossalai run --nproc_per_node 2 train.py --config recipes/demo_digits.py`` from this checkout,
  as ``make demo`` starts it (``--launchers colossalai torchrun``: also under torchrun, as timm's is), with `bench_timm_parity`'s overrides (no
  intermediate evaluation or checkpoint) and ``train.max_steps=11``;
- ``baseline`` (with ``--baseline DIR``): the same from another checkout (the commit before a change, side by side);
- ``timm``: ``torchrun --nproc_per_node 2 train.py`` in timm's checkout with the flags `bench_timm_parity.timm_flags`
  derives from the same config, ``--epochs 1`` (11 updates) and ``--log-interval 1``.

Each rank runs under `benchmarks.harness.startup_probe`, which logs the first import of the heavy modules, the
rendezvous and (vitlarge) the run's events; the benchmark timestamps each line of the launcher's output as it
arrives (``PYTHONUNBUFFERED=1``: timm's first and last ``Train:`` lines are its first and last updates). From rank 0:

- outside the loop = the wall time of the command minus its loop, the time from the first optimizer step's end to
  the last one's (the first step, with its warm-up, is outside);
- start-up, from the launch to the first step's end: ``launcher`` (the launcher's own start, until the rank's
  process exists), ``interpreter`` (until the script's first line), each group of `IMPORTS` (its modules' first
  imports, a nested tracked import counted in its own group), ``rendezvous`` (``init_process_group``), the
  trackers' and TensorBoard's start in the hooks (vitlarge: between the first and the last hook's
  ``on_train_start``, imports excepted), ``setup`` (the rest before the loop starts: config, model, optimizer, Booster,
  resume, data loaders; timm's ``Scheduled epochs`` line marks its loop's start) and ``first step``;
- the end, from the last step's end to the command's exit: imports (matplotlib for the picture), ``final evaluation
  and checkpoint`` (vitlarge: until ``on_train_end``), then vitlarge's own end-of-run work, which timm's train.py
  does not do: the hooks' ``on_train_end`` (the picture of the run, TensorBoard's close), the ``timm export``
  (``<workdir>/model``) and the hooks' close; and ``exit`` (the processes' and the launcher's exit; timm: from its
  ``--result`` line).

Each phase is given twice: in wall seconds, and in rank 0's CPU seconds (all its threads; the probe's ``tick`` events
interpolated), which load from other processes on a shared machine changes much less; the CPU seconds of all the
command's processes (launchers and ranks) are given too.

timm's train.py sometimes never exits after its results (`bench_timm_parity.launch`): such a run is ended
`EXIT_GRACE_S` after its ``--result`` line and its exit counted from that line (``hung_at_exit``).
Not in ``benchmarks.run``'s suite: minutes of 2-process runs and timm's checkout.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from benchmarks import bench_timm_parity as parity
from benchmarks.harness import results

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "benchmarks" / "harness" / "startup_probe.py"
STEPS = 11  # one epoch of the demo at 2 processes (timm: --epochs 1)
EXIT_GRACE_S = 30

IMPORTS = {
    "torch": ("torch", "torch.distributed.checkpoint", "torchvision", "torch._dynamo"),
    "timm": ("timm",),
    "Colossal-AI": ("colossalai", "colossalai.booster", "vitlarge.distributed.booster"),
    "peft, transformers, bitsandbytes": ("peft", "transformers", "bitsandbytes", "galore_torch"),
    "DALI": ("nvidia.dali",),
    "TensorBoard": ("torch.utils.tensorboard",),
    "matplotlib": ("matplotlib",),
    "trackers (MLflow, W&B)": ("mlflow", "wandb"),
}
"""Import phases: a group's seconds are its modules' import spans, less the tracked imports nested in them."""


def import_spans(events: list[dict], key: str = "t") -> list[tuple[str, float, float]]:
    """``(module, start, own seconds)`` for each tracked import in ``events`` (the probe's ``import_start``/
    ``import_end``), on the clock ``key`` (``t`` wall, ``c`` CPU; ``start`` is wall); own seconds exclude the tracked
    imports nested inside it."""
    spans, stack = [], []
    for e in events:
        if e["e"] == "import_start":
            stack.append([e["name"], e["t"], e[key], 0.0])
        elif e["e"] == "import_end" and stack:
            name, start, begun, nested = stack.pop()
            spans.append((name, start, e[key] - begun - nested))
            if stack:
                stack[-1][3] += e[key] - begun
    return spans


def _group(module: str) -> str | None:
    return next((g for g, mods in IMPORTS.items() if module in mods), None)


def _imports_in(spans, start: float, end: float) -> dict[str, float]:
    """Seconds of each import group whose spans begin in ``[start, end)`` (wall times)."""
    out: dict[str, float] = {}
    for name, s, own in spans:
        group = _group(name)
        if group and start <= s < end:
            out[group] = out.get(group, 0.0) + own
    return out


def cpu_clock(events: list[dict]):
    """The process's CPU seconds at a wall time, interpolated between the probe's events (0 before the first)."""
    points = sorted((e["t"], e["c"]) for e in events if "c" in e)

    def at(wall: float) -> float:
        i = bisect.bisect_right(points, (wall, math.inf))
        if i == 0:
            return 0.0
        if i == len(points):
            return points[-1][1]
        (t0, c0), (t1, c1) = points[i - 1], points[i]
        return c0 + (c1 - c0) * (wall - t0) / (t1 - t0) if t1 > t0 else c1

    return at


END_HOOKS = "end: the hooks' on_train_end (the picture, TensorBoard's close)"
END_EXPORT = "end: timm export"
END_CLOSE = "end: the hooks' close"


def phases(
    events: list[dict],
    launched: float,
    exited: float,
    first_step: float,
    last_step: float,
    loop_start: float | None = None,
    result_at: float | None = None,
    cpu: bool = False,
) -> dict[str, float]:
    """A run's phases in seconds (the module docstring's list), from rank 0's probe ``events``, the command's launch
    and exit times, and its first and last optimizer steps' ends (wall times). ``loop_start``: where setup ends when
    the events have no ``train_start`` (timm: its ``Scheduled epochs`` line); ``result_at``: timm's ``--result`` line.
    ``cpu``: the rank's CPU seconds in each phase instead of wall seconds (no ``launcher`` phase: another process)."""
    clock = cpu_clock(events) if cpu else (lambda wall: wall)

    def span(a: float, b: float) -> float:
        return clock(b) - clock(a)

    at = {}
    for e in events:
        at.setdefault((e["e"], e.get("first")), e)
    spans = import_spans(events, "c" if cpu else "t")
    process = at[("process", None)]["at"]
    probe = at[("probe", None)]["t"]
    out = {} if cpu else {"launcher": process - launched}
    out["interpreter"] = at[("probe", None)]["c"] if cpu else probe - process
    out |= {f"import {g}": s for g, s in _imports_in(spans, probe, first_step).items()}
    group = (at[("group_start", None)]["t"], at[("group_end", None)]["t"]) if ("group_end", None) in at else None
    out["rendezvous"] = span(*group) if group else 0.0
    hooks_from = at.get(("train_start", True), {}).get("t")
    hooks_to = at.get(("train_start", False), {}).get("t")
    setup_end = hooks_from if hooks_from is not None else loop_start if loop_start is not None else first_step
    loop_from = setup_end
    if hooks_from is not None and hooks_to is not None:
        out["hooks' start (trackers, TensorBoard)"] = span(hooks_from, hooks_to) - sum(
            _imports_in(spans, hooks_from, hooks_to).values()
        )
        loop_from = hooks_to
    out["setup (config, model, optimizer, Booster, resume, loaders)"] = (
        span(probe, setup_end) - sum(_imports_in(spans, probe, setup_end).values()) - out["rendezvous"]
    )
    out["first step"] = span(loop_from, first_step) - sum(_imports_in(spans, loop_from, first_step).values())
    out["start-up (launch to the first step's end)"] = span(launched, first_step)
    end_imports = _imports_in(spans, last_step, exited)
    out |= {f"end: import {g}": s for g, s in end_imports.items()}
    train_end = at.get(("train_end", True), {}).get("t")
    hooks_end, export = at.get(("train_end", False), {}).get("t"), at.get(("export", None), {}).get("t")
    close = at.get(("close", None), {}).get("t")
    if train_end is not None and close is not None:
        ends = [("end: final evaluation and checkpoint", last_step)]
        if hooks_end is not None and export is not None:
            ends += [(END_HOOKS, train_end), (END_EXPORT, hooks_end), (END_CLOSE, export)]
        else:
            ends += [("end: export and close", train_end)]
        for (name, a), b in zip(ends, [b for _, b in ends[1:]] + [close]):
            out[name] = span(a, b) - sum(_imports_in(spans, a, b).values())
        out["end: exit"] = span(close, exited)
    else:
        until = result_at if result_at is not None else exited
        out["end: final evaluation and checkpoint"] = span(last_step, until) - sum(end_imports.values())
        out["end: exit"] = span(until, exited)
    out["end (the last step's end to the exit)"] = span(last_step, exited)
    out["loop (first step's end to the last one's)"] = span(first_step, last_step)
    out["outside the loop"] = span(launched, exited) - span(first_step, last_step)
    out["wall" if not cpu else "total"] = span(launched, exited)
    return {k: round(v, 3) for k, v in out.items()}


def _env(log_dir: Path) -> dict:
    env = parity._env()
    return env | {"PYTHONUNBUFFERED": "1", "VITLARGE_STARTUP_LOG": str(log_dir)}


def _role(argv: list[str]) -> str:
    """Which part of a launch a process is, from its command line."""
    if any(a.endswith("startup_probe.py") for a in argv[:3]) and not any(a.endswith("torchrun") for a in argv[:2]):
        return "ranks"
    for name in ("torchrun", "colossalai"):
        if any(a.endswith(name) for a in argv[:2]):
            return f"{name} run" if name == "colossalai" else name
    return "shell" if argv and argv[0].rsplit("/", 1)[-1] in ("sh", "bash") else "other"


def watch(session: int, seen: dict, stop: threading.Event) -> None:
    """Samples the processes of ``session`` every 50 ms until ``stop``: ``seen[pid]`` = role, start (time.time()),
    last seen, CPU seconds when last seen (a process's last 50 ms of CPU may be missed)."""
    boot = next(int(x.split()[1]) for x in Path("/proc/stat").read_text().splitlines() if x.startswith("btime "))
    hz = os.sysconf("SC_CLK_TCK")
    while not stop.is_set():
        now = time.time()
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                stat = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
                if int(stat[3]) != session:
                    continue
                cpu = (int(stat[11]) + int(stat[12])) / hz
                if d not in seen:
                    argv = Path(f"/proc/{d}/cmdline").read_bytes().decode(errors="replace").split("\0")
                    seen[d] = dict(role=_role(argv), start=boot + int(stat[19]) / hz)
                seen[d] |= dict(last=now, cpu=cpu)
            except (OSError, IndexError, ValueError):
                continue
        stop.wait(0.05)


def launcher_phases(seen: dict, launched: float, exited: float) -> tuple[dict, dict]:
    """The launch's processes by role: wall ``(launcher: X)`` from the launch to the first process of each role, and
    the CPU seconds of each role's processes."""
    roles = list(dict.fromkeys(p["role"] for p in sorted(seen.values(), key=lambda p: p["start"])))
    wall, cpu = {}, {}
    for role in roles:
        mine = [p for p in seen.values() if p["role"] == role]
        wall[f"launch: until {role} starts"] = round(min(p["start"] for p in mine) - launched, 3)
        wall[f"launch: {role} exit to the command's exit"] = round(exited - max(p["last"] for p in mine), 3)
        cpu[f"CPU of {role} (all its processes)"] = round(sum(p.get("cpu", 0.0) for p in mine), 3)
    return wall, cpu


def launch(cmd: list[str], cwd: Path, log_dir: Path, finished: str | None = None) -> dict:
    """Runs ``cmd`` (its own process group), timestamping each output line as it arrives; returns the launch and
    exit times, the lines, the CPU seconds of all its processes, and whether it hung after ``finished``'s line."""
    shutil.rmtree(log_dir, ignore_errors=True)
    log_dir.mkdir(parents=True)
    lines: list[tuple[float, str]] = []
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    launched = time.time()
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=_env(log_dir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )

    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            lines.append((time.time(), raw.decode(errors="replace").rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    procs: dict = {}
    stop = threading.Event()
    watcher = threading.Thread(target=watch, args=(proc.pid, procs, stop), daemon=True)
    watcher.start()
    hung, pattern = False, re.compile(finished) if finished else None
    while proc.poll() is None:
        time.sleep(0.05)
        seen = next((t for t, line in list(lines) if pattern and pattern.search(line)), None)
        if seen is not None and time.time() - seen > EXIT_GRACE_S:
            os.killpg(proc.pid, signal.SIGKILL)
            hung = True
            break
    proc.wait()
    exited = time.time()
    stop.set()
    watcher.join(timeout=5)
    reader.join(timeout=5)
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    (log_dir / "output.txt").write_text("\n".join(f"{t - launched:8.3f} {line}" for t, line in lines) + "\n")
    if proc.returncode and not hung:
        tail = "\n".join(line for _, line in lines[-40:])
        raise SystemExit(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{tail}")
    cpu = cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime
    wall, cpus = launcher_phases(procs, launched, exited)
    return dict(
        launched=launched, exited=exited, lines=lines, cpu_s=round(cpu, 2), hung_at_exit=hung, procs=(wall, cpus)
    )


def _events(log_dir: Path, rank: int = 0) -> list[dict]:
    return [json.loads(x) for x in (log_dir / f"rank{rank}.jsonl").read_text().splitlines() if x.strip()]


def run_vitlarge(root: Path, data: Path, workdir: Path, launcher: str, port: int, log_dir: Path) -> dict:
    """vitlarge's train.py in checkout ``root``, started by ``launcher`` under the probe: its phases."""
    bin_ = parity.VENV_BIN
    head = (
        [str(bin_ / "colossalai"), "run", "--nproc_per_node", "2", "--master_port", str(port)]
        if launcher == "colossalai"
        else [str(bin_ / "torchrun"), "--nproc_per_node", "2", "--master_port", str(port)]
    )
    overrides = parity.vitlarge_overrides((), 42, 0.0, [f"train.max_steps={STEPS}"])
    shutil.rmtree(workdir, ignore_errors=True)
    cmd = [*head, str(PROBE), str(root / "train.py"), "--config", parity.RECIPE, "--data", str(data)]
    cmd += ["--workdir", str(workdir), *overrides]
    r = launch(cmd, root, log_dir)
    events = _events(log_dir)
    steps = [e["t"] for e in events if e["e"] == "step"]
    if len(steps) != STEPS:
        raise SystemExit(f"vitlarge in {root}: {len(steps)} steps logged, not {STEPS} (see {log_dir})")
    args = (events, r["launched"], r["exited"], steps[0], steps[-1])
    return _result(r, phases(*args), phases(*args, cpu=True))


TRAIN_LINE = re.compile(r"^Train: \d+ \[\s*\d+/")


def run_timm(src: Path, folder: Path, workdir: Path, port: int, log_dir: Path) -> dict:
    """timm's train.py under the probe, 11 updates: its phases, from its output's lines."""
    cfg = parity.vitlarge_config(parity.vitlarge_overrides((), 42, 0.0, []))
    flags = parity.timm_flags(cfg, parity.WORLD) + ["--epochs", "1"]
    flags = [
        "--data-dir", str(folder), "--train-split", "train", "--val-split", "validation", "--device", "cpu",
        *flags,
        "--workers", "1", "--checkpoint-hist", "1", "--log-interval", "1",
        "--output", str(workdir), "--experiment", "run",
    ]  # fmt: skip
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    cmd = [str(parity.VENV_BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", str(port), str(PROBE)]
    cmd += ["train.py", *flags]
    r = launch(cmd, src, log_dir, finished=r"^--result")
    lines = r["lines"]
    steps = [t for t, line in lines if TRAIN_LINE.search(line)]
    loop_start = next((t for t, line in lines if "Scheduled epochs" in line), None)
    result_at = next((t for t, line in lines if line.startswith("--result")), None)
    if len(steps) < 2:
        raise SystemExit(f"timm: {len(steps)} update lines (see {log_dir}/output.txt)")
    events = _events(log_dir)
    args = (events, r["launched"], r["exited"], steps[0], steps[-1], loop_start, result_at)
    return _result(r, phases(*args), phases(*args, cpu=True))


def _result(r: dict, wall: dict, cpu: dict) -> dict:
    """A run's record: its phases, with the launch's processes (`launcher_phases`) after the wall ones."""
    procs_wall, procs_cpu = r["procs"]
    return dict(phases=wall | procs_wall | procs_cpu, cpu_phases=cpu, cpu_s=r["cpu_s"], hung_at_exit=r["hung_at_exit"])


def summarize(runs: list[dict], key: str = "phases") -> dict:
    """Per contender: each phase's median over its rounds (``key``: ``phases`` wall, ``cpu_phases`` rank 0's CPU), and
    the CPU seconds of all the command's processes."""
    out = {}
    for name in dict.fromkeys(r["contender"] for r in runs):
        mine = [r for r in runs if r["contender"] == name]
        keys = list(dict.fromkeys(k for r in mine for k in r[key]))
        out[name] = {k: round(statistics.median(r[key].get(k, 0.0) for r in mine), 2) for k in keys}
        if key == "phases":
            out[name]["CPU seconds of all its processes"] = round(statistics.median(r["cpu_s"] for r in mine), 1)
        out[name]["rounds"] = len(mine)
    return out


def show(summary: dict, title: str) -> None:
    names = list(summary)
    keys = list(dict.fromkeys(k for s in summary.values() for k in s if k != "rounds"))
    print(f"| {title} | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for k in keys:
        print(f"| {k} | " + " | ".join(f"{summary[n][k]:.2f}" if k in summary[n] else "-" for n in names) + " |")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--baseline", help="another vitlarge checkout (the commit before a change), run side by side")
    p.add_argument(
        "--launchers",
        nargs="+",
        choices=("colossalai", "torchrun"),
        default=["colossalai"],
        help="vitlarge's launchers: each vitlarge contender runs under each (named 'vitlarge (torchrun)' ...)",
    )
    p.add_argument("--contenders", nargs="+", choices=("vitlarge", "baseline", "timm"))
    p.add_argument("--timm-src", default=os.environ.get("VITLARGE_TIMM_SRC"))
    p.add_argument("--master-port", type=int, default=0, help="0: a free port")
    p.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "vitlarge-bench-startup"))
    p.add_argument("--name", default="startup", help="results file: benchmarks/results/<name>.json")
    a = p.parse_args(argv)
    contenders = a.contenders or ["vitlarge", *(["baseline"] if a.baseline else []), "timm"]
    if "baseline" in contenders and not a.baseline:
        p.error("the baseline contender needs --baseline DIR")
    data = parity.demo_data()
    folder = parity.export_image_folder(data) if "timm" in contenders else None
    src = parity.timm_checkout(a.timm_src) if "timm" in contenders else None
    if not a.master_port:
        from vitlarge.distributed.launcher import free_port

        a.master_port = free_port()
    root, runs = Path(a.workdir).resolve(), []
    runners = [(c, None) if c == "timm" else (c, launcher) for c in contenders for launcher in a.launchers]
    runners = list(dict.fromkeys(runners))
    for i in range(a.rounds):
        order = runners[i % len(runners) :] + runners[: i % len(runners)]  # load drifts hit all alike
        for name, launcher in order:
            label = name if launcher in (None, a.launchers[0]) else f"{name} ({launcher})"
            tag = label.replace(" ", "_").replace("(", "").replace(")", "")
            wd, logs = root / f"{tag}_run", root / f"{tag}_{i}_log"
            if name == "timm":
                assert src is not None and folder is not None
                r = run_timm(src, folder, wd, a.master_port, logs)
            else:
                checkout = Path(a.baseline).resolve() if name == "baseline" else ROOT
                r = run_vitlarge(checkout, data, wd, launcher or "colossalai", a.master_port, logs)
            runs.append(dict(contender=label, round=i, load_avg=os.getloadavg()[0], **r))
            brief = {k: v for k, v in runs[-1].items() if k not in ("phases", "cpu_phases")}
            print(json.dumps(brief | {"outside the loop": r["phases"]["outside the loop"]}), flush=True)
    summary, cpu = summarize(runs), summarize(runs, "cpu_phases")
    result = dict(
        contenders=contenders,
        launchers=a.launchers,
        baseline=a.baseline,
        baseline_rev=_rev(Path(a.baseline)) if a.baseline else None,
        steps=STEPS,
        timm=f"{parity.TIMM_REPO}@{parity.TIMM_COMMIT}",
        summary=summary,
        cpu_summary=cpu,
        runs=runs,
    )
    out = results.write_result(a.name, result)
    show(summary, "wall seconds (median)")
    print()
    show(cpu, "rank 0's CPU seconds (median)")
    print(f"wrote {out}")


def _rev(checkout: Path) -> str | None:
    """The commit a ``--baseline`` checkout holds (short), for the report to name; None where it is no git checkout."""
    done = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


if __name__ == "__main__":
    main()
