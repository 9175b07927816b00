"""Every combination the recipes turn on, compiled, in real train.py runs on 2 gloo processes of this CPU.

Question: Does each of compile (the whole model, or each block: ``train.compile_scope``) x {ddp, fsdp} x
{activation checkpointing off, full, selective} x {bf16, fp16 with GradScaler, fp32} x ``train.deterministic=true``
train, resume bit for bit after ``kill -9``, follow eager's losses, and with how many graphs, graph breaks and
recompiles?
Goal: every row trains and resumes bitwise; compiled losses within `TOLERANCE` of eager's; the counts
are reported, not judged (the GPU tier reads the same counts: tests/gpu). Per block, fsdp has no graph break.

Run: ``python -m benchmarks.bench_compile_matrix [--quick] [--only REGEX] [--ports FIRST-LAST]`` (not in the
suite: 4-5 min per row on 2 shared cores; ``python -m benchmarks.run --only compile_matrix`` runs every row).
``--only`` runs the rows whose name matches and keeps the other rows of the existing result (each row says when
it was measured); ``--ports`` is the ``--master_port`` range (default `PORTS`). Writes
``benchmarks/results/compile_matrix.json``; docs/PERFORMANCE.md's section 10 renders it.

Each combination is four ``torchrun --nproc_per_node 2 -m vitlarge`` runs of the demo recipe shrunk to a
1-block ViT (`TINY`) on ``data.source=synthetic`` (no data directory): eager; compiled, uninterrupted
(the reference); compiled with a checkpoint every ``steps // 2`` steps, killed with SIGKILL (its whole
process tree) once that checkpoint is recorded; the same command again, which must resume from it and
end with the reference's losses and exported weights bit for bit. Graph counts are the compiled
reference's own log lines (`vitlarge.train.compile_stats`: after step 1 and at the end, which includes
the final evaluation's graphs). Step times are medians over the steps after the first `WARM` ones.
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.harness import results

ROOT = Path(__file__).resolve().parent.parent
RECIPE = "recipes/demo_digits.py"
TINY = "model.kwargs={'patch_size': 4, 'embed_dim': 32, 'depth': 1, 'num_heads': 2}"
# 32 = 8 (micro) x 2 (accumulation) x 2 (processes): accumulation as the GPU recipes run it (DDP's no_sync,
# FSDP's reduce-scatter per micro-step under bf16/fp16), at a size where a step is overhead, not matmuls.
BATCH = ("train.global_batch=32", "train.micro_batch=8")
PLUGINS = ("ddp", "fsdp")
CHECKPOINTING = ("off", "full", "selective")
PRECISIONS = ("bf16", "fp16", "fp32")
SCOPES = ("model", "blocks")
STEPS = 200
"""Optimizer steps per run (``--quick``: half). 4 runs of 300 steps took 4 min for one combination (fsdp, checkpointing,
fp16) at load 3, mostly starting and compiling; at 200 the 12 took 52 min at load 6-8 (other jobs on the 2 cores),
about 40 on a quieter machine. fp16 is emulated on a CPU without AVX512-FP16, but at this model's size a step is
overhead-bound (eager fp16 within 1-2x of fp32 in the table), so fp16 affords the same count."""
TOLERANCE = {"fp32": 1e-4, "bf16": 5e-2, "fp16": 1e-2}
"""Largest |compiled - eager| train loss over a run. fp32: the compile tests' bound (tests/e2e/test_compile_runs.py).
bf16/fp16: Inductor keeps a fused chain of elementwise ops in fp32 where eager rounds each result to the
autocast dtype, so logits differ by about one unit in the last place: bf16's is 2**-8 relative (~0.01 at a
loss of 2.3), fp16's 2**-11 (~0.001); the bounds allow a few of those, accumulated over the run."""
WARM = 5
PORTS = range(30000, 30100)  # --master_port: this benchmark's default range on a machine shared with other runs
CHECKPOINT_NAMES = {"off": "no-ckpt", "full": "ckpt", "selective": "sel-ckpt"}
COMPILE_LINE = re.compile(r"compile: (\d+) graphs, (\d+) graph breaks, (\d+) recompiles(?: \((.*)\))?\s*$")
RESUMED = re.compile(r"resumed from \S+ at step (\d+)")


@dataclass(frozen=True)
class Combo:
    plugin: str
    checkpointing: str
    precision: str
    scope: str = "model"

    @property
    def name(self) -> str:
        """``ddp/ckpt/fp16`` for the whole model compiled (the rows measured first), ``.../blocks`` per block."""
        name = f"{self.plugin}/{CHECKPOINT_NAMES[self.checkpointing]}/{self.precision}"
        return name if self.scope == "model" else f"{name}/blocks"

    def overrides(self) -> list[str]:
        return [
            f"train.plugin={self.plugin}",
            f"train.activation_checkpointing={self.checkpointing}",
            f"train.precision={self.precision}",
            "train.deterministic=true",
            f"train.compile_scope={self.scope}",
        ]


def combos(tiny: bool = False) -> list[Combo]:
    """The whole model compiled with checkpointing off and full (the recipes' settings), then every block compiled
    on its own with off, full and selective."""
    if tiny:
        return [Combo("ddp", "off", "fp32")]
    whole = [Combo(p, c, x) for p in PLUGINS for c in ("off", "full") for x in PRECISIONS]
    return whole + [Combo(p, c, x, "blocks") for p in PLUGINS for c in CHECKPOINTING for x in PRECISIONS]


def parse_compile_lines(text: str) -> list[dict]:
    """Every ``compile: ...`` line of a run's output, in order: graphs, breaks, recompiles and the first reasons."""
    out = []
    for line in text.splitlines():
        m = COMPILE_LINE.search(line)
        if not m:
            continue
        notes = dict(
            part.split(": ", 1)
            for part in (m.group(4) or "").split("; ")
            if part.startswith(("first break", "first recompile"))
        )
        out.append(
            {
                "graphs": int(m.group(1)),
                "graph_breaks": int(m.group(2)),
                "recompiles": int(m.group(3)),
                "first_break": notes.get("first break"),
                "first_recompile": notes.get("first recompile"),
            }
        )
    return out


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().startswith("{")]


def train_records(workdir: Path) -> dict[int, dict]:
    """Step -> the run's last ``train`` record for it (a resumed run rewrites the steps after its checkpoint)."""
    return {r["step"]: r for r in read_jsonl(workdir / "metrics.jsonl") if r["event"] == "train"}


def loss_agreement(eager: dict[int, float], compiled: dict[int, float]) -> dict:
    """Largest and mean |compiled - eager| over the steps both ran."""
    steps = sorted(set(eager) & set(compiled))
    diffs = [abs(compiled[s] - eager[s]) for s in steps]
    return {"steps": len(steps), "max_abs": max(diffs), "mean_abs": statistics.fmean(diffs)}


def median_step_s(records: dict[int, dict]) -> float:
    return statistics.median(r["step_time"] for s, r in records.items() if s > WARM)


class Launcher:
    """torchrun on 2 processes, one port of ``ports`` per run (a killed run's port may linger in TIME_WAIT)."""

    def __init__(self, scratch: Path, ports: range = PORTS):
        self.scratch = scratch
        self.ports = iter(ports)
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}

    def command(self, args: list[str]) -> list[str]:
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            str(next(self.ports)),
            "-m",
            "vitlarge",
            *args,
        ]

    def start(self, args: list[str], log: Path) -> subprocess.Popen:
        with open(log, "w") as f:
            return subprocess.Popen(
                self.command(args), cwd=ROOT, env=self.env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
            )

    def run(self, args: list[str], log: Path, timeout: float = 1800) -> str:
        proc = self.start(args, log)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            raise
        text = log.read_text()
        if code != 0:
            raise RuntimeError(f"exit {code}: {log}\n{text[-3000:]}")
        return text


def kill_tree(pid: int) -> None:
    """SIGKILL to a launcher and every process under it at once (torchrun's workers: kill -9 of the job)."""
    import psutil

    try:
        parent = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    procs = parent.children(recursive=True) + [parent]
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=60)


def run_args(combo: Combo, workdir: Path, compile_on: bool, steps: int, checkpoint_every: int) -> list[str]:
    return [
        "--config",
        RECIPE,
        "data.source=synthetic",
        "data.path=/nonexistent",
        "--workdir",
        str(workdir),
        TINY,
        *BATCH,
        *combo.overrides(),
        f"train.compile={'on' if compile_on else 'off'}",
        f"train.max_steps={steps}",
        "train.log_every_steps=50",
        "train.eval_every_epochs=0",
        f"train.checkpoint_every_steps={checkpoint_every}",
    ]


def killed_and_resumed(launcher: Launcher, combo: Combo, work: Path, steps: int) -> tuple[int, int, str]:
    """The compiled run killed with SIGKILL after its checkpoint at ``steps // 2``, then rerun. Returns the step
    the kill came after (the last train record), the step the rerun resumed at, and the rerun's output."""
    half = steps // 2
    args = run_args(combo, work / "resumed", True, steps, half)
    proc = launcher.start(args, work / "killed.log")
    metrics = work / "resumed" / "metrics.jsonl"
    try:
        while not any(r["event"] == "checkpoint" and r["step"] == half for r in read_jsonl(metrics)):
            if proc.poll() is not None:
                raise RuntimeError(f"the run to kill ended first (exit {proc.returncode}): {work / 'killed.log'}")
            time.sleep(0.2)
    finally:
        kill_tree(proc.pid)
    killed_at = max((r["step"] for r in read_jsonl(metrics) if r["event"] == "train"), default=0)
    text = launcher.run(args, work / "resume.log")
    m = RESUMED.search(text)
    return killed_at, int(m.group(1)) if m else 0, text


def run_combo(launcher: Launcher, combo: Combo, steps: int) -> dict:
    from safetensors.torch import load_file

    work = Path(tempfile.mkdtemp(prefix=combo.name.replace("/", "-") + "-", dir=launcher.scratch))
    t0 = time.perf_counter()
    launcher.run(run_args(combo, work / "eager", False, steps, 0), work / "eager.log")
    ref_text = launcher.run(run_args(combo, work / "compiled", True, steps, 0), work / "compiled.log")
    killed_at, resumed_at, _ = killed_and_resumed(launcher, combo, work, steps)
    eager, compiled, resumed = (train_records(work / d) for d in ("eager", "compiled", "resumed"))
    after = [s for s in sorted(compiled) if s > resumed_at]
    weights = [load_file(str(work / d / "model" / "model.safetensors")) for d in ("compiled", "resumed")]
    stats = parse_compile_lines(ref_text)
    agreement = loss_agreement(
        {s: r["train_loss"] for s, r in eager.items()}, {s: r["train_loss"] for s, r in compiled.items()}
    )
    eager_s, compiled_s = median_step_s(eager), median_step_s(compiled)
    return {
        **asdict(combo),
        "name": combo.name,
        "steps": steps,
        "trains": sorted(compiled) == list(range(1, steps + 1))
        and all(r["train_loss"] is not None for r in compiled.values()),  # non-finite is written as null
        "skipped_steps": sum(bool(r.get("skipped")) for r in compiled.values()),
        "first_loss": compiled[1]["train_loss"],
        "last_loss": compiled[steps]["train_loss"],
        "killed_after_step": killed_at,
        "resumed_at": resumed_at,
        "resume_bitwise": bool(
            resumed_at > 0
            and after
            and all(resumed[s]["train_loss"] == compiled[s]["train_loss"] for s in after)
            and weights[0].keys() == weights[1].keys()
            and all(bool((weights[0][k] == weights[1][k]).all()) for k in weights[0])
        ),
        "steps_compared_after_resume": len(after),
        "loss_agreement": agreement,
        "tolerance": TOLERANCE[combo.precision],
        "loss_within_tolerance": agreement["max_abs"] <= TOLERANCE[combo.precision],
        "compile_after_step_1": stats[0] if stats else None,
        "compile_at_end": stats[-1] if stats else None,
        "eager_step_s": round(eager_s, 4),
        "compiled_step_s": round(compiled_s, 4),
        "compiled_vs_eager_time": round(compiled_s / eager_s, 3),
        "first_step_s": {"eager": round(eager[1]["step_time"], 2), "compiled": round(compiled[1]["step_time"], 2)},
        "wall_s": round(time.perf_counter() - t0, 1),
        "workdir": str(work),
    }


def run(quick: bool = True, tiny: bool = False, only: str | None = None, ports: range = PORTS) -> dict:
    """Every combination (or those whose name matches ``only``, the others kept from the existing result), the
    result written after each row (a cut run keeps what finished)."""
    tiny = results.is_tiny(tiny)
    scratch = Path(os.environ.get("VITLARGE_BENCH_SCRATCH", tempfile.gettempdir())) / "compile_matrix"
    scratch.mkdir(parents=True, exist_ok=True)
    launcher = Launcher(scratch, ports)
    done = previous_rows() if only else {}
    order = [c.name for c in combos(tiny)]
    result = {}
    for combo in combos(tiny):
        if only and not re.search(only, combo.name):
            continue
        steps = 6 if tiny else STEPS // (2 if quick else 1)
        print(f"== {combo.name}: {steps} steps", flush=True)
        try:
            row = run_combo(launcher, combo, steps)
        except Exception as e:  # one combination that fails is a row that says so, not a lost matrix
            row = {**asdict(combo), "name": combo.name, "steps": steps, "error": f"{type(e).__name__}: {e}"[-2000:]}
        row["measured_at"] = time.strftime("%Y-%m-%d")
        print(json.dumps({k: v for k, v in row.items() if k != "workdir"}), flush=True)
        done[combo.name] = row
        rows = [done[n] for n in order if n in done]
        result = {
            "benchmark": "compile_matrix: compiled combinations in train.py runs on 2 gloo processes, CPU",
            "recipe": RECIPE,
            "model_kwargs": TINY.split("=", 1)[1],
            "batch": " ".join(BATCH),
            "data": "synthetic (random images and labels: the loss stays near ln 10; it checks agreement, not learning)",
            "processes": 2,
            "quick": quick,
            "tiny": tiny,
            "warm_steps_excluded": WARM,
            "wall_s": round(sum(r.get("wall_s", 0) for r in rows), 1),
            "rows": rows,
        }
        results.write_result("compile_matrix", result)
    return result


def previous_rows() -> dict[str, dict]:
    """The existing result's rows by name, each with the date it was measured (the file's, for rows before the
    date was recorded per row)."""
    path = results.results_dir() / "compile_matrix.json"
    if not path.exists():
        return {}
    d = json.loads(path.read_text())
    day = d.get("finished_at", "?").split(" ")[0]
    return {r["name"]: {"measured_at": day, **r} for r in d.get("rows", [])}


def main() -> None:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="half the steps")
    p.add_argument("--tiny", action="store_true", help="one 6-step row; the numbers mean nothing")
    p.add_argument("--only", help="run the rows whose name matches this regular expression; keep the others")
    p.add_argument("--ports", default=f"{PORTS.start}-{PORTS.stop - 1}", help="--master_port range, FIRST-LAST")
    a = p.parse_args()
    first, last = (int(x) for x in a.ports.split("-"))
    show(run(a.quick, a.tiny, a.only, range(first, last + 1)))


def show(r: dict) -> None:
    from benchmarks.report.compile_matrix import table

    print("\n".join(table(r)))


if __name__ == "__main__":
    main()
