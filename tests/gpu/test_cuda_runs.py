"""train.py itself on the GPU (``python -m vitlarge``, one process, data.source=synthetic: no DALI, no files).

* The demo recipe in vit_b16's combination (fp16 with GradScaler, compile, deterministic): two fresh runs and a
  run resumed from a checkpoint (model, optimizer, scaler, CPU and CUDA RNG state) give bitwise-equal losses.
* vit_b16's own recipe (its model, 224 px, micro-batch 256) at a 512-image batch: compiles with its graph breaks
  and recompiles counted, trains, exports, and its peak memory lies under the ``--dry-run`` estimate.
* vit_h14's combination (FSDP2 over a compiled model with activation checkpointing in bf16) on the demo model:
  trains on the GPU, saves a sharded (DCP) checkpoint, and that checkpoint resumes on 2 CPU ranks (gloo):
  a resharding load onto another device and world size.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

from hooks.jsonl import read_metrics
from tests.gpu.conftest import needs
from tests.helpers import ROOT

pytestmark = needs("colossalai", "train.py builds its Booster from Colossal-AI")

SYNTHETIC = ["data.source=synthetic", "data.path=/nonexistent"]
B16_COMBINATION = ["train.precision=fp16", "train.compile=on", "train.deterministic=true", "train.device=cuda"]
H14_COMBINATION = [
    "train.plugin=fsdp",
    "train.precision=bf16",
    "train.activation_checkpointing=full",
    "train.compile=on",
    "train.device=cuda",
]
COMPILE_LINE = re.compile(r"compile: (\d+) graphs, (\d+) graph breaks, (\d+) recompiles.*")


def start(workdir: Path, *args: str, recipe: str = "recipes/demo_digits.py", module=("-m", "vitlarge")):
    cmd = [sys.executable, *module, "--config", recipe, *SYNTHETIC, "--workdir", str(workdir), *args]
    with open(workdir.with_suffix(".log"), "w") as log:  # the run keeps its own copy of the descriptor
        return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))


def finish(proc: subprocess.Popen, workdir: Path, timeout: float = 420, check: bool = True) -> str:
    """The run's output once it ended; ``check``: it must have exited 0 (else read ``proc.returncode`` later)."""
    try:
        proc.wait(timeout=timeout)
    finally:
        proc.kill()
    out = workdir.with_suffix(".log").read_text()
    assert proc.returncode == 0 or not check, f"exit {proc.returncode}:\n{out[-4000:]}"
    return out


def losses(workdir: Path) -> dict[int, float]:
    return {m["step"]: m["train_loss"] for m in read_metrics(str(workdir / "metrics.jsonl")) if m["event"] == "train"}


def compile_counts(out: str) -> str:
    """The run's last ``compile: N graphs, M graph breaks, K recompiles`` line (it logs one after step 1, one at the end)."""
    found = [m.group(0) for m in map(COMPILE_LINE.search, out.splitlines()) if m]
    assert found, "no 'compile: ...' line in the run's output"
    return found[-1]


def test_fp16_compiled_deterministic_runs_and_a_resume_are_bitwise_equal(tmp_path, record_property):
    every = ["train.log_every_steps=1", "train.checkpoint_every_steps=4", *B16_COMBINATION]
    a, b = tmp_path / "a", tmp_path / "b"
    t0 = time.perf_counter()
    runs = [start(a, *every, "train.max_steps=8"), start(b, *every, "train.max_steps=4")]  # side by side
    out_a, _ = finish(runs[0], a), finish(runs[1], b)
    out_b = finish(start(b, *every, "train.max_steps=8"), b)
    assert "at step 4" in out_b and "resumed from" in out_b, out_b[-2000:]
    la, lb = losses(a), losses(b)
    assert sorted(la) == list(range(1, 9)) and sorted(lb) == list(range(1, 9)), (la, lb)
    assert la == lb, {s: (la[s], lb[s]) for s in la if la[s] != lb[s]}
    record_property(
        "shows",
        f"8 steps: fresh run == fresh 4 + resumed 4, bitwise (loss {la[8]:.6f}); "
        f"{compile_counts(out_a)}; {time.perf_counter() - t0:.0f} s",
    )


def gib(value: str, unit: str) -> float:
    return float(value) / (1024 if unit == "MiB" else 1)


def dry_run_estimate_gib(*args: str) -> tuple[float, float]:
    """``--dry-run``'s tensor total per device and its per-GPU figure (the tensors plus the stated constants)."""
    out = subprocess.run(
        [sys.executable, "-m", "vitlarge", *args, "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout + out.stderr
    tensors = re.search(r"memory per device.*total ([\d.]+) (GiB|MiB)", text)
    per_gpu = re.search(r"about ([\d.]+) (GiB|MiB) per GPU", text)
    assert tensors and per_gpu, text
    return gib(*tensors.groups()), gib(*per_gpu.groups())


def test_vit_b16_recipe_compiles_trains_exports_and_fits_its_memory_estimate(tmp_path, record_property):
    args = ["train.global_batch=512", "train.max_steps=2", "train.log_every_steps=1"]
    run = tmp_path / "b16"
    proc = start(run, *args, recipe="recipes/vit_b16.py")
    out = finish(proc, run, check=False)  # the counts below first: they hold even if the export fails
    estimate, per_gpu = dry_run_estimate_gib("--config", "recipes/vit_b16.py", *SYNTHETIC, *args)
    train = [m for m in read_metrics(str(run / "metrics.jsonl")) if m["event"] == "train"]
    peak = max(m["peak_mem_bytes"] for m in train) / 2**30
    reserved = max(m["peak_reserved_bytes"] for m in train) / 2**30
    start_line = next((line for line in out.splitlines() if "GPU memory" in line and "free of" in line), "")
    lb = losses(run)
    record_property(
        "shows",
        f"2 steps of 512 (256 x 2): losses {lb[1]:.4f}, {lb[2]:.4f}; {compile_counts(out)}; "
        f"peak allocated {peak:.2f} GiB vs dry-run tensors {estimate:.2f} GiB, reserved {reserved:.2f} GiB vs "
        f"{per_gpu:.2f} GiB per GPU; start line: {start_line.strip()!r}; exit {proc.returncode}",
    )
    assert "expandable_segments:True" in start_line, start_line
    # Both of PyTorch's peaks against the tensors the dry run counts (its per-GPU figure adds what lies outside
    # PyTorch's allocator, the CUDA context and NCCL: docs/GPU.md has those measured on their own).
    assert peak <= estimate, f"peak {peak:.2f} GiB over the dry-run estimate {estimate:.2f} GiB"
    assert reserved <= estimate, f"reserved {reserved:.2f} GiB over the dry-run estimate {estimate:.2f} GiB"
    assert proc.returncode == 0 and (run / "model").is_dir(), f"exit {proc.returncode}, no export:\n{out[-3000:]}"


def test_fsdp_compiled_checkpointed_bf16_on_gpu_resumes_resharded_on_two_cpu_ranks(tmp_path, record_property):
    """The GPU run's last checkpoint (step 4) loaded by 2 CPU ranks: at ``train.max_steps=4`` nothing trains and
    the export is written again from the loaded, resharded state: it equals the GPU run's export tensor for
    tensor, bitwise. Then the CPU ranks train on to step 6."""
    from safetensors.torch import load_file

    from tests.helpers.launcher import free_port

    run = tmp_path / "h14"
    every = ["train.log_every_steps=1", "train.checkpoint_every_steps=4"]
    out = finish(start(run, *every, *H14_COMBINATION, "train.max_steps=4"), run)
    assert (run / "checkpoints").is_dir()
    on_gpu = {k: v.clone() for k, v in load_file(str(run / "model" / "model.safetensors")).items()}
    cpu = ["train.device=cpu", "train.plugin=fsdp", "train.precision=bf16", "train.activation_checkpointing=full"]
    cpu += ["train.compile=off", *every]

    def on_two_cpu_ranks(steps: int) -> str:
        torchrun = ("-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()))
        return finish(start(run, *cpu, f"train.max_steps={steps}", module=(*torchrun, "train.py")), run)

    reloaded = on_two_cpu_ranks(4)
    assert "resumed from" in reloaded and "at step 4" in reloaded, reloaded[-3000:]
    again = load_file(str(run / "model" / "model.safetensors"))
    assert sorted(again) == sorted(on_gpu)
    differ = [k for k in on_gpu if not torch.equal(on_gpu[k], again[k])]
    assert not differ, f"{len(differ)} of {len(on_gpu)} tensors differ after the resharded load: {differ[:5]}"
    continued = on_two_cpu_ranks(6)
    assert "at step 4" in continued, continued[-3000:]
    after = losses(run)
    assert sorted(after)[-2:] == [5, 6] and all(math.isfinite(after[s]) for s in (5, 6)), after
    record_property(
        "shows",
        f"FSDP2 + compile + checkpointing + bf16 on the GPU, 4 steps ({compile_counts(out)}); its DCP checkpoint "
        f"loaded by 2 CPU ranks (gloo) re-exports all {len(on_gpu)} tensors bitwise equal, then trains to step 6 "
        f"(loss {after[6]:.4f})",
    )
