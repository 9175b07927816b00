"""The data path on a GPU, end to end: vit_b16's recipe through train.py on ImageNet-shaped JPEG TFRecords, from DALI
(the ``mixed`` decoder) and from ``data.source=synthetic``, with the decoder's settings varied.

    python -m benchmarks.gpu.data --jpeg /tmp/bench/jpeg --out $OUT        # on the GPU machine (~5 min)
    python -m benchmarks.gpu.data --device cpu --tiny                      # the same code on the CPU, toy sizes

The JPEG tree comes from ``data_tools.make_bench_dataset`` (500x375-like photos of ~110 KB at ``--quality 96
--noise 10,14``); it is converted here with ``data_tools.imagenet_to_tfrecord`` (all cores) unless its TFRecords
exist. Each row is one ``python -m vitlarge`` run of recipes/vit_b16.py as it trains (224 px, micro-batch 256,
fp16, compile auto, its dropouts and determinism) at a global batch of 1,024 (accumulation 4, the GPU kit's) for
``--steps`` optimizer steps after ``--skip`` steps of warm-up (compiling, DALI's first batches). From its
metrics.jsonl: images/s (median over the measured steps) and the ``data`` wait (the measured steps' data time
over their step time, what the console's ``data %`` shows); from /proc, the CPU cores the process used meanwhile.
Rows (`VARIANTS`):

- ``dali``: the recipe's pipeline (random-resized crop decoded from the crop's window, ``hw_decoder_load`` 0.65);
- ``synthetic``: ``data.source=synthetic`` (random batches made on the device): the compute side alone;
- ``dali_hw0``: ``data.hw_decoder_load=0`` (no hardware JPEG decoder: nvJPEG's CUDA/CPU paths); against
  ``dali`` it says what the hardware decoder takes;
- ``dali_hw1``: ``data.hw_decoder_load=1`` (all JPEGs offered to the hardware decoder; only with ``--only``);
- ``dali_full``: ``data.rrc_decode=full`` (the whole JPEG decoded, then the random-resized crop on the GPU).

Writes ``data_gpu.json`` and ``data_gpu.md`` into ``--out`` after every row (``"complete": false`` until the
end), so a run cut short keeps what finished; ``--only`` runs some rows. Exit 0 when every row ran, 1 when one
failed (its log's tail printed), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = {
    "dali": [],
    "synthetic": ["data.source=synthetic"],
    "dali_hw0": ["data.hw_decoder_load=0"],
    "dali_hw1": ["data.hw_decoder_load=1"],
    "dali_full": ["data.rrc_decode=full"],
}
DEFAULT_ROWS = ["dali", "synthetic", "dali_hw0", "dali_full"]  # dali_hw1 on request: the GPU session's time
RUN = [
    "train.global_batch=1024",
    "schedule.warmup_epochs=1",
    "train.eval_every_epochs=0",
    "train.checkpoint_every_steps=0",
    "train.log_every_steps=1",
]
TINY = ["model.kwargs={'depth': 1, 'embed_dim': 32, 'num_heads': 2}", "data.image_size=32", "train.micro_batch=8"]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` and its threads so far (/proc/PID/stat), 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def train_records(metrics: Path) -> list[dict]:
    if not metrics.exists():
        return []
    out = []
    for line in metrics.read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:  # a line being written
            continue
        if r.get("event") == "train":
            out.append(r)
    return out


def measure(records: list[dict], skip: int, samples: list[tuple[float, int, float]]) -> dict:
    """The row from the run's train records after ``skip`` and the (wall, steps logged, CPU s) samples taken while
    it ran: images/s (median), data wait (sum of data time over sum of step time), CPU cores over those steps."""
    timed = [r for r in records if r["step"] > skip]
    if not timed:
        return {"steps_measured": 0}
    window = [s for s in samples if skip <= s[1] <= timed[-1]["step"]]
    cores = None
    if len(window) >= 2 and window[-1][0] > window[0][0]:
        cores = round((window[-1][2] - window[0][2]) / (window[-1][0] - window[0][0]), 2)
    step_s = sum(r["step_time"] for r in timed)
    return {
        "steps_measured": len(timed),
        "images_per_s": round(statistics.median(r["images_per_s"] for r in timed), 1),
        "data_wait": round(sum(r["data_time"] for r in timed) / step_s, 4),
        "step_s_median": round(statistics.median(r["step_time"] for r in timed), 4),
        "cpu_cores": cores,
        "peak_mem_bytes": max((r.get("peak_mem_bytes") or 0) for r in timed) or None,
    }


def run_variant(name: str, tfrecords: Path, work: Path, device: str, steps: int, skip: int, tiny: bool) -> dict:
    """One train.py run; polls its metrics.jsonl and CPU time once a second."""
    overrides = [*RUN, f"train.device={device}", *VARIANTS[name]]
    if tiny:
        overrides += [*TINY, "train.global_batch=16", "train.precision=fp32"]
    from vitlarge.data.manifest import load_manifest

    manifest = load_manifest(str(tfrecords))
    per_epoch = manifest.num_examples("train")
    overrides.append(f"data.num_classes={manifest.num_classes}")
    global_batch = 16 if tiny else 1024
    epochs = -(-(skip + steps) * global_batch // per_epoch) + 1
    if name == "synthetic":  # its epoch is data.num_train_examples: the same steps per epoch as the files
        overrides.append(f"data.num_train_examples={per_epoch}")
    wd = work / name
    cmd = [sys.executable, "-m", "vitlarge", "--config", "recipes/vit_b16.py", "--data", str(tfrecords)]
    cmd += ["--workdir", str(wd), f"train.epochs={epochs}", *overrides]
    log = work / f"{name}.log"
    t0 = time.perf_counter()
    samples: list[tuple[float, int, float]] = []
    with open(log, "w") as f:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
        while proc.poll() is None:
            records = train_records(wd / "metrics.jsonl")
            samples.append((time.perf_counter(), records[-1]["step"] if records else 0, cpu_seconds(proc.pid)))
            if records and records[-1]["step"] >= skip + steps:
                proc.kill()  # enough steps: the final evaluation, checkpoint and export are not measured
            time.sleep(1.0)
    row = {
        "overrides": VARIANTS[name],
        "command": " ".join(cmd),
        "exit": proc.returncode,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    row |= measure(train_records(wd / "metrics.jsonl"), skip, samples)
    if not row.get("steps_measured"):
        row["error"] = log.read_text()[-2000:]
    return row


def tfrecords_for(jpeg: Path, out: Path) -> Path:
    """``out``, the JPEG tree converted (skipped when its dataset.json exists)."""
    if (out / "dataset.json").exists():
        return out
    from data_tools import imagenet_to_tfrecord

    imagenet_to_tfrecord.convert(str(jpeg), str(out), workers=os.cpu_count() or 1, progress=False)
    return out


def jpeg_stats(jpeg: Path) -> dict:
    files = [p for p in jpeg.rglob("*.JPEG")]
    sizes = [p.stat().st_size for p in files]
    return {"images": len(files), "mean_kb": round(statistics.mean(sizes) / 1024, 1) if sizes else None}


def table(result: dict) -> list[str]:
    rows = result["rows"]
    synth = rows.get("synthetic", {}).get("images_per_s")
    lines = [
        f"vit_b16 through train.py on {result['device']}: {result['jpeg']['images']} JPEGs of {result['jpeg']['mean_kb']} KB "
        f"on average, global batch {result['global_batch']}, {result['steps']} steps measured after {result['skip']}"
        + ("; --tiny: the numbers mean nothing" if result["tiny"] else "")
        + ("" if result["complete"] else "; **incomplete**"),
        "",
        "| row | overrides | images/s | vs synthetic | data wait | CPU cores used | step (s) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows.items():
        if not r.get("steps_measured"):
            lines.append(
                f"| `{name}` | {' '.join(r['overrides']) or '(recipe)'} | failed (exit {r.get('exit')}) | | | | |"
            )
            continue
        vs = f"{r['images_per_s'] / synth:.3f}" if synth else "n/a"
        cores = "n/a" if r["cpu_cores"] is None else f"{r['cpu_cores']:.1f}"
        lines.append(
            f"| `{name}` | {' '.join(r['overrides']) or '(recipe)'} | {r['images_per_s']:.1f} | {vs} | "
            f"{100 * r['data_wait']:.1f}% | {cores} | {r['step_s_median']:.3f} |"
        )
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu.data", description=__doc__.splitlines()[0])
    p.add_argument("--jpeg", type=Path, help="the JPEG tree (data_tools.make_bench_dataset); --tiny makes one")
    p.add_argument("--tfrecords", type=Path, help="where its TFRecords are or go (default: beside it, -tfrecord)")
    p.add_argument("--out", type=Path, help="folder for data_gpu.json and data_gpu.md (default: a temp dir)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tiny", action="store_true", help="a one-block model at 32 px, 16 images a step")
    p.add_argument("--steps", type=int, help="optimizer steps measured per row (default 30; --tiny 3)")
    p.add_argument("--skip", type=int, help="warm-up steps not measured (default 5; --tiny 1)")
    p.add_argument(
        "--only",
        nargs="+",
        choices=list(VARIANTS),
        default=DEFAULT_ROWS,
        help=f"rows (default: {' '.join(DEFAULT_ROWS)})",
    )
    a = p.parse_args(argv)
    steps, skip = a.steps or (3 if a.tiny else 30), a.skip if a.skip is not None else (1 if a.tiny else 5)
    out = a.out or Path(tempfile.mkdtemp(prefix="vitlarge-data-gpu-"))
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="vitlarge-data-runs-"))
    jpeg = a.jpeg
    if jpeg is None:
        if not a.tiny:
            p.error("--jpeg is needed (python -m data_tools.make_bench_dataset DIR --quality 96 --noise 10,14)")
        from data_tools.make_bench_dataset import make_bench_dataset

        jpeg = work / "jpeg"
        make_bench_dataset(str(jpeg), num_images=64, classes=4, quality=96, noise=(10.0, 14.0))
    if not jpeg.is_dir():
        p.error(f"--jpeg {jpeg}: not a folder")
    tfrecords = tfrecords_for(jpeg, a.tfrecords or jpeg.with_name(jpeg.name + "-tfrecord"))
    if a.device == "cuda":
        import torch

        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
    else:
        from benchmarks.harness.results import cpu_model

        device = f"CPU {cpu_model()}"
    result = {
        "benchmark": "vit_b16 through train.py: DALI (mixed decoder) vs synthetic, decoder settings",
        "device": device,
        "jpeg": jpeg_stats(jpeg),
        "global_batch": 16 if a.tiny else 1024,
        "steps": steps,
        "skip": skip,
        "tiny": a.tiny,
        "complete": False,
        "rows": {},
    }

    def save() -> None:
        (out / "data_gpu.json").write_text(json.dumps(result, indent=1) + "\n")
        (out / "data_gpu.md").write_text("\n".join(table(result)) + "\n")

    failed = []
    for name in a.only:
        row = run_variant(name, tfrecords, work, a.device, steps, skip, a.tiny)
        result["rows"][name] = row
        if not row.get("steps_measured"):
            failed.append(name)
            print(f"benchmarks.gpu.data: {name} measured nothing; its log ends:\n{row['error']}", file=sys.stderr)
        print(f"benchmarks.gpu.data: {name} done ({row['wall_s']:.0f} s)", flush=True)
        save()
    result["complete"] = not failed
    save()
    print("\n".join(table(result)))
    print(f"wrote {out / 'data_gpu.json'} and {out / 'data_gpu.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
