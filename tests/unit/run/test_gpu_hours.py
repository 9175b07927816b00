"""``--dry-run --gpu KIND``: wall time and GPU-hours from the GPU kit's images/s, against a hand computation: the
training steps, the validation passes and checkpoints of the recipe's schedule, the input pipeline a GPU needs, each
figure named measured, scaled or assumed; and the docs quote what the dry run prints.

The kit's results are a file made here (an H100 row set), so the arithmetic is checked on known numbers: ViT-B/16
(86,567,656 parameters) for vit_b16's 300 epochs of ImageNet at 32,768 images a step: 39 steps an epoch, 11,700
steps, an evaluation every 390 (10 epochs) and a checkpoint every 200."""

from __future__ import annotations

import json
import re

import pytest

from benchmarks.report.performance import DRY_RUNS
from tests.helpers import ROOT
from tests.unit.run.test_dry_run import dry_run
from vitlarge.config.load import load_config
from vitlarge.constants import IMAGENET_TRAIN_BYTES, IMAGENET_TRAIN_EXAMPLES
from vitlarge.errors import UserError
from vitlarge.plan.plan import make_plan
from vitlarge.run import cli
from vitlarge.run.run_costs import DECODE_IMAGES_PER_CORE, data_figures, pipeline_lines

PARAMS, STEPS, BATCH = 86_567_656, 11_700, 32_768
EVALS = 11_700 // 390  # 29 after steps 390 ... 11,310 and the final one
CHECKPOINTS = 11_699 // 200 + 1  # 58 after steps 200 ... 11,600 and the final one
CHECKPOINT_BYTES = PARAMS * (4 + 8)  # fp32 weights and LAMB's two fp32 moments


def kit_results(tmp_path, device: str, rows: dict) -> str:
    """A gpu.json of the kit's ``recipes`` section for vit_b16 with ``rows`` (name -> (precision, compiled, img/s))."""
    path = tmp_path / "kit.json"
    recipe = {"model": "vit_base_patch16_224", "image_size": 224, "micro_batch": 256, "activation_checkpointing": "off"}
    recipe["rows"] = {name: {"precision": p, "compiled": c, "images_per_s": ips} for name, (p, c, ips) in rows.items()}
    path.write_text(json.dumps({"device": {"type": "cuda", "name": device}, "recipes": {"vit_b16": recipe}}))
    return str(path)


def vit_b16_on(capsys, kind: str, world: int, results: str | None, *overrides: str) -> str:
    args = ["--config", str(ROOT / "recipes" / "vit_b16.py"), "--world-size", str(world), "--gpu", kind]
    out, _ = dry_run(capsys, *args, *(["--gpu-results", results] if results else []), *overrides)
    return out.split("gpu time (")[1]


def phase_rate(out: str) -> float:
    m = re.search(r"phase 0 \(224 px\): ([\d,.]+) img/s per GPU", out)
    assert m, out
    return float(m[1].replace(",", ""))


@pytest.fixture
def h100_results(tmp_path):
    path = tmp_path / "gpu.json"
    path.write_text(
        json.dumps(
            {
                "device": {"type": "cuda", "name": "NVIDIA H100 80GB HBM3"},
                "finished_at": "2026-12-01 10:00:00",
                "recipes": {
                    "vit_b16": {
                        "model": "vit_base_patch16_224",
                        "image_size": 224,
                        "micro_batch": 256,
                        "activation_checkpointing": "off",
                        "rows": {
                            "compiled_fp16": {"precision": "fp16", "compiled": True, "images_per_s": 2000.0},
                            "eager_fp16": {"precision": "fp16", "compiled": False, "images_per_s": 1600.0},
                        },
                    }
                },
            }
        )
    )
    return path


def totals(out: str) -> tuple[float, float]:
    """The training steps' hours and the GPU-hours of the whole run, from the total line."""
    m = re.search(r"total: ([\d.]+) h wall, ([\d,.]+) GPU-hours .*\(training steps ([\d.]+) h", out)
    assert m, out
    return float(m[3]), float(m[2].replace(",", ""))


def test_measured_kind_inside_a_node(capsys, h100_results):
    out, _ = dry_run(
        capsys,
        "--config",
        str(ROOT / "recipes" / "vit_b16.py"),
        "--world-size",
        "8",
        "--gpu",
        "h100",
        "--gpu-results",
        str(h100_results),
    )
    step = BATCH / (8 * 2000.0) + 2 * 7 / 8 * PARAMS * 4 / 150e9  # vit_b16 compiles on CUDA: the compiled fp16 row
    evals = EVALS * 50_000 / (8 * 3 * 2000.0)  # forward only: 3x the training rate
    saves = CHECKPOINTS * CHECKPOINT_BYTES / 1e9
    steps_h, gpu_hours = totals(out)
    assert steps_h == pytest.approx(STEPS * step / 3600, abs=0.005)  # 6.67 h
    assert gpu_hours == pytest.approx(8 * (STEPS * step + evals + saves) / 3600, abs=0.05)  # 53.7
    rates = out.split("gpu time (")[1].split("all-reduce per step")[0]
    assert "recipes.vit_b16.compiled_fp16 2,000.0 img/s" in rates and "not measured" not in rates
    assert "measured on an NVIDIA H100 80GB HBM3, 2026-12-01 10:00:00):" in rates


def test_another_kind_across_nodes_takes_the_datasheet_ratio_and_says_so(capsys, h100_results):
    out, _ = dry_run(
        capsys,
        "--config",
        str(ROOT / "recipes" / "vit_b16.py"),
        "--world-size",
        "16",
        "--gpu",
        "a100",
        "--gpu-results",
        str(h100_results),
        "train.compile=off",
    )
    ips = 1600.0 * 312.0 / 989.4  # the eager row, at the A100's share of the H100's dense bf16 peak (HBM: 0.61)
    step = BATCH / (16 * ips) + 2 * 15 / 16 * PARAMS * 4 / 20e9  # 16 GPUs: the ring crosses nodes
    steps_h, gpu_hours = totals(out)
    assert steps_h == pytest.approx(STEPS * step / 3600, abs=0.005)
    evals = EVALS * 50_000 / (16 * 3 * ips)
    saves = CHECKPOINTS * CHECKPOINT_BYTES / 1e9
    assert gpu_hours == pytest.approx(16 * (STEPS * step + evals + saves) / 3600, abs=0.05)
    assert "A100 SXM4 not measured: scaled x 0.32, the lower of its datasheet ratios to the H100 SXM" in out
    assert "at 20 GB/s across nodes" in out


def test_without_results_or_a_dry_run_it_says_what_to_do(tmp_path):
    args = cli.parse_args(
        [
            "--config",
            str(ROOT / "recipes" / "vit_b16.py"),
            "--dry-run",
            "--gpu",
            "h200",
            "--gpu-results",
            str(tmp_path / "none.json"),
        ]
    )
    from tests.unit.run.test_dry_run import ONE_PROCESS
    from vitlarge.distributed.threads import NO_THREADS

    with pytest.raises(UserError, match="no GPU kit results at .*none.json; run python -m benchmarks.gpu"):
        cli.plan_or_train(args, ONE_PROCESS, NO_THREADS)
    for argv in (["--gpu", "h100"], ["--dry-run", "--gpu-results", "x.json"], ["--dry-run", "--gpu", "v100"]):
        with pytest.raises(SystemExit) as e:
            cli.parse_args(["--config", str(ROOT / "recipes" / "vit_b16.py"), *argv])
        assert e.value.code == 2


def test_h200_figures_for_an_h100_take_the_hbm_bandwidth_ratio_and_say_so(capsys, tmp_path):
    # the same dense bf16 peak (989.4 TFLOP/s) but 3.35 against 4.8 TB/s of HBM: not x 1.00
    results = kit_results(tmp_path, "NVIDIA H200", {"compiled_fp16": ("fp16", True, 3000.0)})
    out = vit_b16_on(capsys, "h100", 8, results)
    assert phase_rate(out) == pytest.approx(3000.0 * 3.35 / 4.8, abs=0.06)
    assert "H100 SXM not measured: scaled x 0.70" in out
    assert "dense bf16 989.4 / 989.4 TFLOP/s = 1.00, HBM 3.35 / 4.8 TB/s = 0.70" in out
    assert "(fp16, compiled; measured)" in out


def test_an_fp16_recipe_from_bf16_rows_scales_by_the_precision_ratio_the_kit_measured(capsys, tmp_path):
    rows = {
        "compiled_bf16": ("bf16", True, 3000.0),
        "eager_bf16": ("bf16", False, 2400.0),
        "eager_fp16": ("fp16", False, 2340.0),
    }
    out = vit_b16_on(capsys, "h100", 8, kit_results(tmp_path, "NVIDIA H100 80GB HBM3", rows))
    assert phase_rate(out) == pytest.approx(3000.0 * 2340.0 / 2400.0, abs=0.06)  # vit_b16 is fp16 and compiled
    assert "fp16 not measured compiled: scaled x 0.975, the kit's eager fp16 / bf16" in out
    assert "the bf16 row" not in out  # no bf16 figure taken for fp16 as it is


def test_without_any_fp16_row_the_bf16_row_is_taken_and_the_line_says_so(capsys, tmp_path):
    out = vit_b16_on(capsys, "h100", 8, kit_results(tmp_path, "NVIDIA H100", {"c": ("bf16", True, 3000.0)}))
    assert phase_rate(out) == pytest.approx(3000.0) and "fp16 not measured: the bf16 row as it is" in out


def test_the_input_pipeline_a_gpu_needs_at_its_rate(capsys, h100_results):
    out = vit_b16_on(capsys, "h100", 8, str(h100_results))
    per_image = IMAGENET_TRAIN_BYTES / IMAGENET_TRAIN_EXAMPLES  # 115.4 kB
    cores, per_gpu = 2000.0 / 383.2, 2000.0 * per_image / 1e9
    assert (
        f"input pipeline per GPU at 2,000.0 img/s: {cores:.1f} CPU cores decoding on the CPU (measured: 383.2 img/s "
        f"per core, benchmarks/bench_data.py on a 2-core Intel Xeon); storage {per_gpu:.2f} GB/s per GPU, "
        f"{8 * per_gpu:.1f} GB/s for 8 GPUs (stated: 115.4 kB an image" in out
    )
    assert "data.hw_decoder_load 0.65" in out and "not yet measured" in out


def test_the_decode_rate_is_the_data_benchmarks_measurement():
    measured = json.loads((ROOT / "benchmarks" / "results" / "data.json").read_text())
    assert DECODE_IMAGES_PER_CORE == measured["images_per_cpu_s_median"]["dali_trainloader"]


def test_another_data_set_without_its_dataset_json_gets_no_imagenet_figures():
    demo = load_config(ROOT / "recipes" / "demo_digits.py")  # 1,437 training images: not ImageNet
    data = data_figures(demo, make_plan(demo, 2), None)
    assert (data.bytes_per_image, data.val_images) == (None, None)
    assert pipeline_lines(1000.0, 2, data, 0.65)[0].endswith(
        "storage bytes/s no dataset.json here (--data) and not ImageNet's count: unknown"
    )
    vit = load_config(ROOT / "recipes" / "vit_b16.py")
    data = data_figures(vit, make_plan(vit, 2), None)
    assert data.bytes_per_image == IMAGENET_TRAIN_BYTES / IMAGENET_TRAIN_EXAMPLES and data.val_images == 50_000
    synthetic = load_config(ROOT / "recipes" / "vit_b16.py", ["data.source=synthetic"])
    data = data_figures(synthetic, make_plan(synthetic, 2), None)
    assert data.val_images == 512 and pipeline_lines(1000.0, 2, data, 0.65) == [
        "  input pipeline: none (data.source=synthetic: made on the GPU: nothing read or decoded)"
    ]


def test_evaluation_and_checkpoints_of_the_schedule_are_in_the_total(capsys, h100_results):
    out = vit_b16_on(capsys, "h100", 8, str(h100_results))
    evals = EVALS * 50_000 / (8 * 3 * 2000.0)
    assert f"evaluation: {EVALS} passes x 50,000 validation images at 6,000 img/s per GPU (scaled: forward only" in out
    assert f"checkpoints: {CHECKPOINTS} x 1.04 GB (fp32 weights and 2 optimizer moments) at 1 GB/s (assumed" in out
    assert f"evaluation {evals / 60:.1f} min, checkpoints {CHECKPOINTS * CHECKPOINT_BYTES / 1e9 / 60:.1f} min" in out
    assert "figures: measured: the kit's images/s" in out and "assumed: network and checkpoint bandwidths" in out


def test_an_ema_is_validated_and_saved_beside_the_weights_and_without_periodic_checkpoints_only_the_last(
    capsys, h100_results
):
    out = vit_b16_on(capsys, "h100", 8, str(h100_results), "train.ema_decay=0.9998", "train.checkpoint_every_steps=0")
    assert f"evaluation: {EVALS} passes (and the EMA's)" in out
    assert "checkpoints: 1 x 1.39 GB (fp32 weights and 2 optimizer moments, EMA)" in out


@pytest.mark.parametrize(("kind", "world"), DRY_RUNS)
def test_the_docs_quote_the_dry_runs_run_time(capsys, kind, world):
    out = vit_b16_on(capsys, kind, world, None)  # the checkout's benchmarks/results/gpu.json
    total = re.search(r"total: [^\n]*", out)
    assert total, out
    command = f"python train.py --config recipes/vit_b16.py --dry-run --gpu {kind} --world-size {world}"
    for name in ("README.md", "docs/PERFORMANCE.md"):
        doc = (ROOT / name).read_text()
        assert command in doc, f"{name} does not show {command}"
        assert total[0] in doc, f"{name} does not quote what {command} prints: {total[0]}"


def test_under_full_activation_checkpointing_a_training_image_costs_four_forwards(capsys, h100_results):
    out = vit_b16_on(capsys, "h100", 8, str(h100_results), "train.activation_checkpointing=full")
    assert "activation checkpointing off in the row" in out  # the kit's row, 2,000 img/s, taken as it is
    assert "validation images at 8,000 img/s per GPU (scaled: forward only, 4x the training rate" in out


def test_a_data_set_here_gives_the_record_size_and_validation_count_of_its_dataset_json(capsys, tmp_path, h100_results):
    from tests.unit.run.test_dry_run import _data_set

    data = _data_set(tmp_path, 600, 10)  # 100 bytes a record, 36 validation records
    demo = str(ROOT / "recipes" / "demo_digits.py")
    out, _ = dry_run(capsys, "--config", demo, "--data", data, "--gpu", "h100", "--gpu-results", str(h100_results))
    assert "(measured: 0.1 kB a record in dataset.json's training shards)" in out
    assert " x 36 validation images at " in out


def _refusal(tmp_path, doc) -> str:
    """The one line a --gpu-results file ``doc`` (a JSON value, or the file's text) is refused with."""
    path = tmp_path / "kit.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    args = ["--config", str(ROOT / "recipes" / "vit_b16.py"), "--dry-run", "--world-size", "64"]
    args += ["--gpu", "h100", "--gpu-results", str(path)]
    from tests.unit.run.test_dry_run import ONE_PROCESS
    from vitlarge.distributed.threads import NO_THREADS

    with pytest.raises(UserError) as e:
        cli.plan_or_train(cli.parse_args(args), ONE_PROCESS, NO_THREADS)
    line = str(e.value)
    assert "\n" not in line and str(path) in line and "gpu.json" in line, line
    return line


def _kit(row: dict, **recipe) -> dict:
    recipe = {"model": "vit_base_patch16_224", "image_size": 224, **recipe, "rows": {"c": row}}
    return {"device": {"type": "cuda", "name": "NVIDIA H100"}, "recipes": {"vit_b16": recipe}}


BF16 = {"precision": "bf16", "compiled": True}


@pytest.mark.parametrize(
    ("doc", "names"),
    [
        # a rate that is no positive rate: -332 h (exit 0), 5e299 s a step, a NaN traceback, a str traceback
        (_kit({**BF16, "images_per_s": -5.0}), "recipes.vit_b16.rows.c.images_per_s is -5.0"),
        (_kit({**BF16, "images_per_s": 1e-300}), "recipes.vit_b16.rows.c.images_per_s is 1e-300"),
        (json.dumps(_kit({**BF16, "images_per_s": 7.5})).replace("7.5", "NaN"), "images_per_s is nan"),
        (_kit({**BF16, "images_per_s": "fast"}), "recipes.vit_b16.rows.c.images_per_s is fast"),
        # the row's model and size: a ValueError, an overflowing meta tensor, a KeyError
        (_kit({**BF16, "images_per_s": 100.0}, image_size="big"), "recipes.vit_b16.image_size is big"),
        (_kit({**BF16, "images_per_s": 100.0}, image_size=10**6), "recipes.vit_b16.image_size is 1000000"),
        (
            {"device": {"type": "cuda", "name": "H100"}, "recipes": {"a": {"rows": {"r": {"images_per_s": 5}}}}},
            "recipes.a.model",
        ),
        (_kit({"precision": 16, "images_per_s": 100.0}), "recipes.vit_b16.rows.c.precision is 16"),
        (_kit({"precision": "fp16", "compiled": "false", "images_per_s": 9.0}), "rows.c.compiled is false, not true"),
        # the containers: AttributeErrors
        ({"device": [1], "recipes": {}}, "device is [1]"),
        ({"device": {"type": "cuda", "name": "H100"}, "recipes": {"a": {"rows": [1, 2]}}}, "recipes.a.rows is [1, 2]"),
        ({"device": {"type": "cuda", "name": "H100"}, "large": {"x": 3}}, "large.x is 3"),
        ({"device": {"type": "cuda"}, "recipes": _kit({**BF16, "images_per_s": 10.0})["recipes"]}, "device.name"),
        # a GPU of no kind the datasheet table holds: its rates were taken as an H100's (x 1.00, "an upper bound")
        (
            {
                "device": {"type": "cuda", "name": "NVIDIA A10G"},
                "recipes": _kit({**BF16, "images_per_s": 10.0})["recipes"],
            },
            "measured on an NVIDIA A10G, a GPU of none of the kinds whose datasheet figures scale its rates (a100, h100, h200, b200)",
        ),
    ],
)
def test_a_gpu_results_file_from_elsewhere_is_data_one_line_naming_the_key(tmp_path, doc, names):
    assert names in _refusal(tmp_path, doc)


def test_a_gpu_results_row_of_a_model_that_is_no_vit_names_the_row(tmp_path):
    doc = {"device": {"type": "cuda", "name": "H100"}, "large": {"x": {**BF16, "model": "resnet50", "image_size": 224}}}
    doc["large"]["x"]["images_per_s"] = 10.0
    line = _refusal(tmp_path, doc)  # was "model.name='resnet50' / model.kwargs: ...": keys the user never set
    assert "large.x.model is resnet50" in line and "model.kwargs" not in line


def test_a_gpu_results_file_is_read_up_to_its_cap(tmp_path):
    path = tmp_path / "kit.json"
    with open(path, "wb") as f:  # sparse: 64 GiB declared, read whole (then cut at 16 MiB) before
        f.truncate(64 << 30)
    args = ["--config", str(ROOT / "recipes" / "vit_b16.py"), "--dry-run", "--gpu", "h100", "--gpu-results", str(path)]
    from tests.unit.run.test_dry_run import ONE_PROCESS
    from vitlarge.distributed.threads import NO_THREADS

    with pytest.raises(UserError, match=r"--gpu-results \S*kit\.json is larger than the 16,777,216-byte cap") as e:
        cli.plan_or_train(cli.parse_args(args), ONE_PROCESS, NO_THREADS)
    assert "\n" not in str(e.value)
