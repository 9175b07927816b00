"""vitlarge against timm's own train.py on the digits demo, with DeiT III's training pieces (issue 35).

Question: With the same settings, does vitlarge train as well as timm's train.py, with DeiT III's pieces on?
Goal: with all six pieces, vitlarge's median top-1 over the seeds within 1 point of timm's train.py, for the raw
weights and for the EMA.

Run: ``python -m benchmarks.bench_timm_parity [--seeds 42 1 2] [--variants all none -bce +ema ...]``
(2 CPU processes per run, OMP_NUM_THREADS=1; one run at a time; 3-5 min per run on 2 cores of an AMD EPYC
shared with other work). Writes ``benchmarks/results/timm_parity.json`` and prints one line per run and a table.

Both sides are launched as their users launch them, 2 gloo processes each: ``colossalai run --nproc_per_node 2
train.py --config recipes/demo_digits.py <overrides>`` and ``torchrun --nproc_per_node 2 train.py <flags>`` in a
checkout of huggingface/pytorch-image-models at `TIMM_COMMIT` (its own ``timm`` package, not the installed one,
is what its train.py imports there). timm's train.py is not in timm's wheel: it is fetched into the benchmark's
cache (``$VITLARGE_BENCH_DIR/timm-<commit>``, a tarball from GitHub, or ``--timm-src DIR`` / ``$VITLARGE_TIMM_SRC``
naming a checkout or an unpacked archive of that commit where the machine is offline), its train.py checked
against `TRAIN_PY_SHA256`, then patched once (`patch_train_py`): DDP gets ``device_ids=None`` on CPU (the pinned
train.py passes ``[device]``, which DDP refuses for a CPU module). Nothing else is changed.

Data: the digits demo (`data_tools.make_demo_dataset`); timm reads the same JPEG bytes, exported from the
TFRecords into an ImageFolder tree (``<data>/timm/{train,validation}/<label>/``, `export_image_folder`).
Recipe (recipes/demo_digits.py, fp32): vit_tiny_patch16_224 with patch 4, width 96, depth 4, 3 heads at 16 px,
LAMB 2e-2, clipping at 1.0, wd 0.1, batch 128 = 16 x 4 x 2, Mixup 0.2, random-resized crop (0.6-1.0,
0.8-1.25), no flip, cosine per update after 5 warmup epochs, validation at 16 px without a crop margin.
timm's flags are derived from the vitlarge config (`timm_flags`), and every flag whose train.py default could
differ from a recipe is passed (`TIMM_DEFAULTS`, checked against the fetched train.py): smoothing above all,
0.1 in timm's train.py, 0 in vitlarge, and under Mixup it reaches BCE's targets (issue 35's gap). ``--smoothing``
(default 0.1, timm's) sets it on both sides. Each piece is one override on the vitlarge side (`PIECES`); with
``data.repeats``, timm's sampler keeps ``1437 // 256 * 256 = 1280`` images per epoch (its ``selected_round=256``),
10 updates where vitlarge takes 11, so its epochs are scaled to the same 660 optimizer updates. What still
differs: timm's warmup is 50 updates (5 of its shorter epochs) against vitlarge's 55, its cosine spans the
warmup, its Mixup mixes uint8 images in its collate (vitlarge mixes the normalised floats); both erase after
mixing (timm's default prefetcher; vitlarge since issue 35, which measured erasing first, timm's ``--no-prefetcher``
order, below timm: docs/DATA.md), and DALI's crop,
3-Augment and jitter are PIL's to a few levels (docs/DATA.md).

Variants: ``all`` (the six pieces), ``none``, ``-piece`` (all but one), ``+piece`` (that one alone), or pieces
joined by ``+`` (``bce+ema``). ``--vitlarge-set KEY=VALUE`` and ``--timm-arg=--flag`` add settings to every run of
their side (recorded in the result), for ablations the pieces do not name. Each run's workdir is named after
its side, variant, smoothing, extra settings and seed; a rerun of the same command reuses finished runs.
Not in ``benchmarks.run``'s suite: it trains whole schedules, 2 sides x 3 seeds (about 30 min per variant).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks.harness import results

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
TIMM_REPO = "huggingface/pytorch-image-models"
TIMM_COMMIT = "aa4b5850c1543fa488abf260f18390eda46cf85d"
TRAIN_PY_SHA256 = "f0bb70b9e1c8c576eb1f7beba9cb46953d01ec1308d68c59ec055a6266f76388"
DDP_LINE = "task.prepare_distributed(device_ids=[device], broadcast_buffers=not args.no_ddp_bb)"
DDP_PATCH = (
    "task.prepare_distributed(device_ids=[device] if device.type == 'cuda' else None, "
    "broadcast_buffers=not args.no_ddp_bb)"
)
RECIPE = "recipes/demo_digits.py"
SEEDS = (42, 1, 2)
WORLD = 2  # processes on each side

# piece -> its vitlarge overrides (timm's flags follow from the config: `timm_flags`)
PIECES = {
    "bce": ["augment.loss=bce"],  # --bce-loss
    "repeats": ["data.repeats=3"],  # --aug-repeats 3
    "three_augment": ["data.three_augment=true"],  # --aa 3a
    "color_jitter": ["data.color_jitter=0.3"],  # --color-jitter 0.3
    "random_erase": ["augment.random_erase_prob=0.25"],  # --reprob 0.25 --remode pixel
    "ema": ["train.ema_decay=0.99"],  # --model-ema --model-ema-decay 0.99
}


def variant_pieces(name: str) -> tuple[str, ...]:
    """``all``, ``none``, ``-piece``, ``+piece`` or ``a+b+c`` as the pieces it turns on, in `PIECES`' order."""
    if name == "all":
        on = set(PIECES)
    elif name == "none":
        on = set()
    elif name.startswith("-"):
        on = set(PIECES) - {name[1:]}
    else:
        on = {p for p in name.split("+") if p}
    unknown = on - set(PIECES) | ({name[1:]} - set(PIECES) if name.startswith("-") else set())
    if unknown:
        raise SystemExit(f"variant {name!r}: unknown piece(s) {sorted(unknown)}; pieces: {', '.join(PIECES)}")
    return tuple(p for p in PIECES if p in on)


def bench_dir() -> Path:
    """Generated data and timm's checkout are cached here between runs (VITLARGE_BENCH_DIR overrides)."""
    return Path(os.environ.get("VITLARGE_BENCH_DIR", os.path.join(tempfile.gettempdir(), "vitlarge-bench")))


def patch_train_py(text: str) -> str:
    """The one change to timm's train.py: DDP without ``device_ids`` on CPU. Refuses any other train.py."""
    if hashlib.sha256(text.encode()).hexdigest() != TRAIN_PY_SHA256 or text.count(DDP_LINE) != 1:
        raise SystemExit(f"timm's train.py is not the one of {TIMM_REPO}@{TIMM_COMMIT} (sha256 differs)")
    return text.replace(DDP_LINE, DDP_PATCH)


def check_timm_defaults(src: Path) -> None:
    """`TIMM_DEFAULTS` against the parser of ``src``'s train.py (imported there: its own timm)."""
    keys = json.dumps(list(TIMM_DEFAULTS))
    code = f"import json, train; print(json.dumps({{k: train.parser.get_default(k) for k in {keys}}}))"
    r = subprocess.run([sys.executable, "-c", code], cwd=src, env=_env(), capture_output=True, text=True)
    found = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 and r.stdout.strip() else None
    if found != TIMM_DEFAULTS:
        raise SystemExit(f"{src}/train.py's defaults are not TIMM_DEFAULTS: {found or r.stderr[-2000:]}")


def timm_checkout(source: str | None) -> Path:
    """timm at `TIMM_COMMIT` with the patched train.py, in the cache; from ``source`` (a checkout or unpacked
    archive) or downloaded from GitHub once."""
    dest = bench_dir() / f"timm-{TIMM_COMMIT[:8]}"
    if (dest / ".complete").exists():
        return dest
    tmp = Path(tempfile.mkdtemp(prefix="timm-", dir=dest.parent if dest.parent.exists() else None))
    try:
        if source:
            src = Path(source)
        else:
            url = f"https://github.com/{TIMM_REPO}/archive/{TIMM_COMMIT}.tar.gz"
            archive = tmp / "timm.tar.gz"
            try:
                urllib.request.urlretrieve(url, archive)
            except OSError as e:
                raise SystemExit(
                    f"cannot download {url} ({e}); offline, pass --timm-src DIR (a checkout of {TIMM_REPO} at "
                    f"{TIMM_COMMIT[:8]}) or set VITLARGE_TIMM_SRC"
                ) from None
            with tarfile.open(archive) as t:
                t.extractall(tmp / "x", filter="data")
            src = next((tmp / "x").iterdir())
        if not (src / "train.py").is_file() or not (src / "timm" / "__init__.py").is_file():
            raise SystemExit(f"{src}: not a checkout of {TIMM_REPO} (no train.py and timm/)")
        patched = patch_train_py((src / "train.py").read_text())
        work = tmp / "timm"
        shutil.copytree(src / "timm", work / "timm", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(src / "LICENSE", work / "LICENSE")
        (work / "train.py").write_text(patched)
        (work / ".complete").write_text(f"{TIMM_REPO}@{TIMM_COMMIT}, train.py patched: {DDP_PATCH}\n")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(work, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def export_image_folder(data: Path) -> Path:
    """The TFRecords' JPEG bytes as ``<data>/timm/<split>/<label>/<n>.jpg`` (labels from 0), written once."""
    from data_tools.tfrecord_io import example_pb2, scan_records
    from vitlarge.data.manifest import load_manifest

    out = data / "timm"
    if (out / ".complete").exists():
        return out
    manifest = json.loads((data / "dataset.json").read_text())
    offset = load_manifest(str(data)).label_offset
    shutil.rmtree(out, ignore_errors=True)
    for split in ("train", "validation"):
        n = 0
        for shard in manifest["splits"][split]["shards"]:
            for _, _, payload in scan_records(str(data / shard["file"])):
                f = example_pb2().Example.FromString(payload).features.feature
                label = f["image/class/label"].int64_list.value[0] - offset
                folder = out / split / str(label)
                folder.mkdir(parents=True, exist_ok=True)
                (folder / f"{n:05d}.jpg").write_bytes(f["image/encoded"].bytes_list.value[0])
                n += 1
    (out / ".complete").write_text("ok\n")
    return out


def demo_data() -> Path:
    from data_tools.make_demo_dataset import make_demo_dataset

    data = bench_dir() / "digits"
    make_demo_dataset(str(data))
    return data


def _env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")


EXIT_GRACE_S = 60  # after the last line a run prints, how long its processes may take to exit


def launch(cmd: list[str], cwd: Path, log: Path, finished: str | None = None) -> tuple[float, bool]:
    """Runs ``cmd`` (its own process group) with its output in ``log``; returns ``(wall seconds, hung)``.

    ``finished``: a regular expression of the last thing the run prints. timm's train.py sometimes never exits
    after it (measured: 1 run of 3): rank 0's interpreter, tearing down DDP's gloo group at shutdown, joins a gloo
    thread that waits for the GIL the joining thread holds. Its results are printed by then, so the run is ended
    `EXIT_GRACE_S` after that line and reported ``hung_at_exit``."""
    t0, seen = time.time(), None
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        while proc.poll() is None:
            time.sleep(2)
            if finished and seen is None and re.search(finished, log.read_text(errors="replace"), re.M):
                seen = time.time()
            if seen is not None and time.time() - seen > EXIT_GRACE_S:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return seen - t0, True
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{log.read_text(errors='replace')[-4000:]}")
    return time.time() - t0, False


def reuse(workdir: Path, cmd: list[str]) -> dict | None:
    """The result of a run of exactly ``cmd`` that finished in ``workdir`` before (``result.json``), else None."""
    try:
        found = json.loads((workdir / "result.json").read_text())
    except (OSError, ValueError):
        return None
    return found if found.get("cmd") == " ".join(cmd[1:]) else None


def _finish(workdir: Path, result: dict) -> dict:
    (workdir / "result.json").write_text(json.dumps(result) + "\n")
    return result


# timm's train.py (at TIMM_COMMIT) defaults of the flags `timm_flags` always passes, by argparse dest, with their
# line in that train.py. Left out, each would silently differ from a vitlarge recipe; `check_timm_defaults` reads
# them from the fetched train.py's own parser. The issue's first comparison left --smoothing out: timm's Mixup
# then smooths by 0.1 (its targets 0.01 / 0.91, also BCE's), vitlarge's by the recipe's 0.
TIMM_DEFAULTS = {
    "smoothing": 0.1,  # :326
    "color_jitter": 0.4,  # :280
    "hflip": 0.5,  # :276
    "train_interpolation": "random",  # :328 (bilinear or bicubic per image)
    "interpolation": "",  # :140 (the model's: bicubic)
    "crop_pct": None,  # :134 (the model's: 0.9 for vit_tiny_patch16_224)
    "mean": None,  # :136 (the model's: 0.5 for the augreg ViTs)
    "std": None,  # :138
    "scale": [0.08, 1.0],  # :272
    "ratio": [3.0 / 4.0, 4.0 / 3.0],  # :274
    "mixup": 0.0,  # :312
    "cutmix": 0.0,  # :314
    "mixup_prob": 1.0,  # :318
    "reprob": 0.0,  # :304
    "remode": "pixel",  # :306
    "recount": 1,  # :308
    "opt": "sgd",  # :191
    "opt_eps": None,  # :193 (Lamb's: 1e-6)
    "opt_betas": None,  # :195
    "weight_decay": 2e-5,  # :199
    "clip_grad": None,  # :201 (timm's Lamb clips the global norm at 1.0 itself)
    "drop": 0.0,  # :330
    "drop_path": None,  # :334
    "sched": "cosine",  # :215
    "warmup_lr": 1e-5,  # :241
    "min_lr": 0,  # :243
    "warmup_epochs": 5,  # :255
    "model_ema_decay": 0.9998,  # :358
}


def flag_values(flags: list[str]) -> dict:
    """``--a-b v1 v2 --c`` as ``{"a_b": ["v1", "v2"], "c": []}`` (argparse's dests; values as given)."""
    out, key = {}, None
    for f in flags:
        if f.startswith("--"):
            key = f[2:].replace("-", "_")
            out[key] = []
        elif key is not None:
            out[key].append(f)
    return out


def vitlarge_config(overrides: list[str]):
    """recipes/demo_digits.py with ``overrides`` applied as train.py applies them (validated)."""
    from vitlarge.config.load import load_recipe, validate
    from vitlarge.config.overrides import apply_override

    cfg = load_recipe(ROOT / RECIPE)
    for item in overrides:
        apply_override(cfg, item)
    validate(cfg)
    return cfg


def timm_updates_per_epoch(cfg, world_size: int) -> int:
    """Optimizer updates in an epoch of timm's train.py: its sampler's images per rank (``RepeatAugSampler``'s
    ``selected_round=256`` with ``--aug-repeats``, else DistributedSampler's padded ``ceil(n / world)``), batches
    of ``micro`` with the last partial one dropped, accumulation rounding the last update up."""
    n, t = cfg.data.num_train_examples, cfg.train
    per_rank = n // 256 * 256 // world_size if cfg.data.repeats > 1 else -(-n // world_size)
    accum = t.global_batch // (t.micro_batch * world_size)
    return -(-(per_rank // t.micro_batch) // accum)


def timm_flags(cfg, world_size: int) -> list[str]:
    """timm train.py's flags for what ``cfg`` trains, every flag of `TIMM_DEFAULTS` among them: the same model,
    data pipeline, loss, optimizer, schedule and EMA, and vitlarge's number of optimizer updates (timm's epochs
    rounded to it; see `timm_updates_per_epoch`). The lr ramps from vitlarge's first-step lr, as vitlarge's does."""
    from vitlarge.model.vit import model_kwargs
    from vitlarge.plan.plan import make_plan

    d, a, o, t, sch = cfg.data, cfg.augment, cfg.optim, cfg.train, cfg.schedule
    if d.crop != "rrc" or sch.decay != "cosine" or cfg.model.drop_path_schedule != "linear" or t.phases:
        raise SystemExit("timm_flags: only the random-resized crop, a cosine decay, one phase and timm's drop path")
    plan = make_plan(cfg, world_size, d.num_train_examples)
    kwargs = {k: v for k, v in model_kwargs(cfg).items() if k not in ("num_classes", "drop_rate", "drop_path_rate")}
    flags = ["--model", cfg.model.name, "--model-kwargs", *(f"{k}={v}" for k, v in kwargs.items())]
    flags += ["--drop", str(cfg.model.head_drop_rate), "--drop-path", str(cfg.model.drop_path_rate)]
    flags += ["--num-classes", str(d.num_classes), "--img-size", str(d.image_size)]
    flags += ["--scale", *map(str, d.crop_scale), "--ratio", *map(str, d.crop_ratio)]
    flags += ["--hflip", "0.5" if d.hflip else "0", "--train-interpolation", d.train_interpolation]
    flags += ["--interpolation", "bicubic", "--crop-pct", str(d.val_crop_pct)]  # vitlarge validates bicubically
    flags += ["--mean", *map(str, d.mean), "--std", *map(str, d.std), "--color-jitter", str(d.color_jitter)]
    if d.three_augment:
        flags += ["--aa", "3a"]
    elif d.randaugment:
        flags += ["--aa", d.randaugment]
    if d.repeats > 1:
        flags += ["--aug-repeats", str(d.repeats)]
    flags += ["--mixup", str(a.mixup_alpha), "--cutmix", str(a.cutmix_alpha), "--mixup-prob", str(a.mixup_prob)]
    flags += ["--smoothing", str(a.label_smoothing)]
    if a.loss == "bce":
        flags += ["--bce-loss"] + (
            ["--bce-target-thresh", str(a.bce_target_thresh)] if a.bce_target_thresh is not None else []
        )
    flags += ["--reprob", str(a.random_erase_prob), "--remode", "pixel", "--recount", "1"]
    flags += ["--opt", o.name, "--opt-eps", str(o.eps), "--opt-betas", *map(str, o.betas)]
    flags += ["--lr", str(o.lr), "--weight-decay", str(o.weight_decay)]
    flags += ["--clip-grad", str(o.clip_grad_norm)] if o.clip_grad_norm > 0 else ["--clip-grad", "1e30"]
    if o.layer_decay != 1.0:
        flags += ["--layer-decay", str(o.layer_decay)]
    updates = timm_updates_per_epoch(cfg, world_size)
    flags += ["--sched", "cosine", "--sched-on-updates", "--warmup-epochs", str(round(sch.warmup_epochs))]
    flags += ["--warmup-lr", str(o.lr / max(1, plan.warmup_steps)), "--min-lr", str(o.lr * sch.min_lr_ratio)]
    flags += ["--epochs", str(round(plan.total_steps / updates)), "--seed", str(t.seed)]
    flags += ["--batch-size", str(plan.phases[0].micro_batch), "--grad-accum-steps", str(plan.phases[0].accum_steps)]
    flags += ["--model-ema-decay", str(t.ema_decay)]
    if t.ema_decay > 0:
        flags += ["--model-ema"] + (["--model-ema-warmup"] if t.ema_warmup else [])
    if t.precision != "fp32":
        raise SystemExit("timm_flags: fp32 only (train.precision=fp32): timm's --amp is not vitlarge's auto")
    return flags


def vitlarge_overrides(pieces, seed: int, smoothing: float, extra: list[str]) -> list[str]:
    return [o for p in pieces for o in PIECES[p]] + [
        f"train.seed={seed}",
        f"augment.label_smoothing={smoothing}",
        "train.precision=fp32",
        "train.eval_every_epochs=0",  # the final evaluation only, as timm's run below
        "train.checkpoint_every_steps=0",
        *extra,
    ]


def run_vitlarge(overrides: list[str], data: Path, workdir: Path, port: int) -> dict:
    cmd = [str(VENV_BIN / "colossalai"), "run", "--nproc_per_node", "2", "--master_port", str(port), "train.py"]
    cmd += ["--config", RECIPE, "--data", str(data), "--workdir", str(workdir), *overrides]
    if done := reuse(workdir, cmd):
        return done
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    wall, hung = launch(cmd, ROOT, workdir.parent / f"{workdir.name}.log")
    records = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    final = [x for x in records if x["event"] == "eval"][-1]
    steps = [x for x in records if x["event"] == "train"]
    return _finish(
        workdir,
        dict(
            top1=round(100 * final["val_top1"], 2),
            top1_ema=round(100 * final["val_top1_ema"], 2) if "val_top1_ema" in final else None,
            steps=steps[-1]["step"],
            wall_s=round(wall, 1),
            hung_at_exit=hung,
            cmd=" ".join(cmd[1:]),
        ),
    )


ACC = re.compile(r"^(Test|Test \(EMA\)): \[\s*(\d+)/(\d+)\].*Acc@1:\s*[\d.]+\s*\(\s*([\d.]+)\)", re.M)


def run_timm(flags: list[str], src: Path, image_folder: Path, workdir: Path, port: int) -> dict:
    flags = [
        "--data-dir", str(image_folder), "--train-split", "train", "--val-split", "validation", "--device", "cpu",
        *flags,
        "--workers", "1", "--val-interval", "100000", "--checkpoint-hist", "1", "--log-interval", "100000",
        "--output", str(workdir), "--experiment", "run",
    ]  # fmt: skip
    cmd = [str(VENV_BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", str(port), "train.py", *flags]
    if done := reuse(workdir, cmd):
        return done
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    wall, hung = launch(cmd, src, workdir / "log.txt", finished=r"^--result")
    log = (workdir / "log.txt").read_text(errors="replace")
    last = {}
    for name, i, n, avg in ACC.findall(log):
        if i == n:  # the evaluation's running average after its last batch
            last[name] = float(avg)
    updates = re.findall(r"Train: \d+ \[\s*(\d+)/(\d+)", log)
    return _finish(
        workdir,
        dict(
            top1=last["Test"],
            top1_ema=last.get("Test (EMA)"),
            updates_per_epoch=int(updates[-1][1]) if updates else None,
            wall_s=round(wall, 1),
            hung_at_exit=hung,
            cmd=" ".join(cmd[1:]),
        ),
    )


def summarize(runs: list[dict]) -> dict:
    """Per variant and side: the medians over seeds; and the median of the per-seed differences vitlarge - timm."""
    out = {}
    for variant in dict.fromkeys(r["variant"] for r in runs):
        rows = [r for r in runs if r["variant"] == variant]
        entry = {}
        for side in ("vitlarge", "timm"):
            mine = [r for r in rows if r["side"] == side]
            entry[side] = {
                k: statistics.median(r[k] for r in mine) if mine and all(r[k] is not None for r in mine) else None
                for k in ("top1", "top1_ema", "wall_s")
            } | {"seeds": [r["seed"] for r in mine]}
        by_seed = {}
        for r in rows:
            by_seed.setdefault(r["seed"], {})[r["side"]] = r
        pairs = [v for v in by_seed.values() if len(v) == 2]
        for k in ("top1", "top1_ema"):
            d = [p["vitlarge"][k] - p["timm"][k] for p in pairs if p["vitlarge"][k] is not None and p["timm"][k]]
            entry[f"diff_{k}_median"] = round(statistics.median(d), 2) if d else None
        out[variant] = entry
    return out


def _num(x, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def show(summary: dict) -> None:
    print(
        "| variant | vitlarge top-1 / EMA | timm train.py top-1 / EMA | median diff top-1 / EMA | seeds | s per run v / t |"
    )
    print("|---|---|---|---|---|---|")
    for variant, e in summary.items():
        v, t = e["vitlarge"], e["timm"]
        cells = [
            f"{_num(v['top1'])} / {_num(v['top1_ema'])}",
            f"{_num(t['top1'])} / {_num(t['top1_ema'])}",
            f"{_num(e['diff_top1_median'], '+.2f')} / {_num(e['diff_top1_ema_median'], '+.2f')}",
            str(max(len(v["seeds"]), len(t["seeds"]))),
            f"{_num(v['wall_s'], '.0f')} / {_num(t['wall_s'], '.0f')}",
        ]
        print(f"| {variant} | " + " | ".join(cells) + " |")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    p.add_argument(
        "--variants",
        nargs="+",
        default=["all"],
        help=f"all, none, -piece, +piece or a+b (pieces: {', '.join(PIECES)})",
    )
    p.add_argument("--sides", nargs="+", choices=("vitlarge", "timm"), default=["vitlarge", "timm"])
    p.add_argument("--smoothing", type=float, default=0.1, help="label smoothing, both sides (timm's train.py default)")
    p.add_argument("--vitlarge-set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--timm-arg", action="append", default=[], metavar="FLAG")
    p.add_argument("--timm-src", default=os.environ.get("VITLARGE_TIMM_SRC"))
    p.add_argument("--master-port", type=int, default=0, help="0: a free port")
    p.add_argument("--workdir", default="runs/bench_timm_parity")
    p.add_argument("--name", default="timm_parity", help="results file: benchmarks/results/<name>.json")
    a = p.parse_args(argv)
    for v in a.variants:
        variant_pieces(v)
    data = demo_data()
    folder = export_image_folder(data) if "timm" in a.sides else None
    src = timm_checkout(a.timm_src) if "timm" in a.sides else None
    if src:
        check_timm_defaults(src)
    if not a.master_port:
        from vitlarge.distributed.launcher import free_port

        a.master_port = free_port()
    root, runs = Path(a.workdir).resolve(), []
    for i, seed in enumerate(a.seeds):
        for variant in a.variants:
            pieces = variant_pieces(variant)
            sides = a.sides if i % 2 == 0 else a.sides[::-1]  # A B, B A: load drifts hit both sides alike
            for side in sides:
                extra = a.vitlarge_set if side == "vitlarge" else a.timm_arg
                tag = "_" + hashlib.sha256(" ".join(extra).encode()).hexdigest()[:6] if extra else ""
                wd = root / f"{side}_{variant}_ls{a.smoothing:g}{tag}_{seed}"  # a rerun of the same command reuses it
                overrides = vitlarge_overrides(pieces, seed, a.smoothing, a.vitlarge_set)
                if side == "vitlarge":
                    r = run_vitlarge(overrides, data, wd, a.master_port)
                else:
                    flags = timm_flags(vitlarge_config(overrides), WORLD) + a.timm_arg
                    r = run_timm(flags, src, folder, wd, a.master_port)
                runs.append(dict(side=side, variant=variant, pieces=list(pieces), seed=seed, **r))
                print(json.dumps({k: v for k, v in runs[-1].items() if k != "cmd"}), flush=True)
    summary = summarize(runs)
    result = dict(
        timm=f"{TIMM_REPO}@{TIMM_COMMIT}",
        timm_patch=f"train.py: {DDP_LINE!r} -> {DDP_PATCH!r}",
        smoothing=a.smoothing,
        vitlarge_set=a.vitlarge_set,
        timm_args=a.timm_arg,
        summary=summary,
        runs=runs,
    )
    out = results.write_result(a.name, result)
    show(summary)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
