"""vitlarge.evaluate across processes: periodic evaluations of a 7-process run equal 1-process ones.

The case guarded: the digits' 360 validation images over 7 ranks (51 or 52 each)
with micro-batch 51, where rank 0..3 hold exactly one batch while DALI pads every rank to 52
records, i.e. a second, padding-only batch. Sized by record counts, the loader left that batch
for the next evaluation, which then counted padding; sized from DALI's padded epoch, every
evaluation counts each image once.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed as dist

from hooks.jsonl import read_metrics
from tests.helpers import launcher
from tests.helpers.spawn import exit_worker, free_port, spawn

RECIPE = "recipes/demo_digits.py"
# fp32 (fp16 matmuls crawl on CPUs without avx512_fp16), no Mixup (51 is odd), 4 steps/epoch.
OVERRIDES = [
    "train.micro_batch=51",
    "train.global_batch=357",
    "train.precision=fp32",
    "augment.mixup_alpha=0",
    "augment.cutmix_alpha=0",
]


def test_seven_process_evaluations_equal_one_process_evaluations_of_the_same_checkpoints(demo_data, tmp_path):
    args = [
        "--config",
        RECIPE,
        "--data",
        demo_data,
        "--workdir",
        str(tmp_path),
        *OVERRIDES,
        "train.max_steps=6",
        "train.eval_every_epochs=0.5",
        "train.checkpoint_every_steps=2",
        "train.log_every_steps=1",
    ]
    r = launcher.run(args, nproc=7, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    evals = {x["step"]: x for x in read_metrics(str(tmp_path / "metrics.jsonl")) if x["event"] == "eval"}
    assert sorted(evals) == [2, 4, 6]  # periodic at 2 and 4, final at 6: three passes of the same loaders
    for step in evals:  # each a one-process evaluation (python -m vitlarge.evaluate), forked: not a launcher test
        r = launcher.python(
            [
                "-m",
                "vitlarge.evaluate",
                "--config",
                RECIPE,
                "--data",
                demo_data,
                "--checkpoint",
                str(tmp_path / "checkpoints" / f"step_{step:07d}"),
                "--json",
                *OVERRIDES,
            ],
            timeout=300,
        )
        assert r.returncode == 0, r.stderr[-2000:]
        single = json.loads(r.stdout.strip().splitlines()[-1])
        assert evals[step]["val_images"] == single["val_images"] == 360
        assert evals[step]["val_loss"] == pytest.approx(single["val_loss"], abs=1e-5), step
        assert evals[step]["val_top1"] == pytest.approx(single["val_top1"], abs=1e-9), step


# Under fsdp every forward is collective, so every rank must run the same number of evaluation forwards
# (the count itself: tests/unit/train/test_evaluation.py). A loader that skipped DALI's padding-only runs
# left a rank whose slice is a whole number of batches one forward short, and the other rank hung.


def _fsdp_eval_worker(rank: int, port: int, data: str, out: str) -> None:
    from tests.helpers.loaders import open_val
    from vitlarge.config.load import load_recipe
    from vitlarge.distributed.fsdp import FSDPPlugin
    from vitlarge.distributed.launcher import DistEnv
    from vitlarge.distributed.process import init_distributed
    from vitlarge.model.precision import Precision
    from vitlarge.model.vit import build_model
    from vitlarge.train.validation import evaluate

    cpu = torch.device("cpu")
    torch.set_num_threads(1)
    init_distributed(DistEnv(rank, 2, rank, "127.0.0.1", port, "test"), "gloo", collective_timeout_s=60)
    cfg = load_recipe(RECIPE)
    cfg.data.num_classes = 129
    torch.manual_seed(0)
    model = FSDPPlugin("fp32", cpu).configure(build_model(cfg))[0]
    forwards = []
    model.unwrap().register_forward_pre_hook(lambda m, args: forwards.append(len(args[0])))
    loader = open_val(data, 64, 16, rank=rank, world_size=2, device=cpu, num_threads=1)
    passes = [evaluate(model, loader, Precision("fp32", cpu)) for _ in range(2)]
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(dict(passes=passes, forwards=forwards, real=loader.num_examples_this_rank), f)
    dist.destroy_process_group()
    exit_worker()


def test_two_rank_fsdp_evaluation_of_129_images_at_micro_batch_64_finishes_exactly(tmp_path):
    """Rank 0 holds 64 records (1 batch + DALI's padding-only run), rank 1 65 (2 batches): the case
    that left rank 1 alone in an all-gather. Labels are record indexes (identical images), so the
    mean loss identifies the set of records counted; it must equal one unsharded process's."""
    from data_tools.make_id_dataset import make_id_dataset
    from tests.helpers.loaders import open_val
    from vitlarge.config.load import load_recipe
    from vitlarge.model.precision import Precision
    from vitlarge.model.vit import build_model
    from vitlarge.train.validation import evaluate

    data = str(tmp_path / "ids")
    make_id_dataset(data, train=129, train_shards=1, validation=129, val_shards=2)
    spawn(
        _fsdp_eval_worker,
        2,
        free_port(),
        data,
        str(tmp_path),
        timeout=300,
        what="2-rank fsdp evaluation (ranks ran different numbers of forwards?)",
    )
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["real"] for r in ranks] == [64, 65]
    assert [r["forwards"] for r in ranks] == [[64, 64] * 2, [64, 1] * 2]  # 2 per pass on each; padding forwarded whole

    cpu = torch.device("cpu")
    cfg = load_recipe(RECIPE)
    cfg.data.num_classes = 129
    torch.manual_seed(0)
    ref = evaluate(build_model(cfg), open_val(data, 64, 16, rank=0, world_size=1, device=cpu), Precision("fp32", cpu))
    assert ref["val_images"] == 129
    for r in ranks:
        for got in r["passes"]:  # both ranks, both passes
            assert got["val_images"] == 129
            assert round(got["val_top1"] * 129) == round(ref["val_top1"] * 129)
            assert round(got["val_top5"] * 129) == round(ref["val_top5"] * 129)
            assert got["val_loss"] == pytest.approx(ref["val_loss"], rel=1e-6)


def test_the_export_of_a_48_px_run_evaluates_as_trained_and_prints_a_table(demo_data, tmp_path):
    """The 16 px recipe on the export of a 48 px run: evaluated at 48 px, as its config.json records (before, refused
    with "pass data.image_size=48"), printed as a table (``--json``: the other tests here read it)."""
    from vitlarge.checkpoint.export import export
    from vitlarge.config.load import load_config
    from vitlarge.evaluate import JSON_MOVED
    from vitlarge.model.vit import build_model

    trained = load_config(RECIPE, ["data.image_size=48"])
    path = export(tmp_path, build_model(trained), trained)
    cmd = ["-m", "vitlarge.evaluate", "--config", RECIPE, "--data", demo_data, "--checkpoint", str(path)]
    r = launcher.python(cmd, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [
        f"warning: {path} was trained with other data.image_size than --config gives; evaluating as it was trained "
        "(its config.json)",
        f"classes matched by index: {path}/config.json records no class names",  # exported without label_names
        JSON_MOVED,  # stdout is a pipe here: a script reads it
    ]
    lines = r.stdout.strip().splitlines()
    assert lines[:2] == [f"evaluated  {path}", "images     360 validation images at 48 px"]
    assert [line.split()[0] for line in lines[2:]] == ["top-1", "top-5", "loss"]
    assert lines[2].endswith("%") and 0 <= float(lines[2].split()[1][:-1]) <= 100


FIVE = {"one": 0, "two": 70, "three": 140, "four": 210, "five": 280}  # sorted as text: five, four, one, three, two


def _fitted_export(tmp_path, data: str, classes: list[str]):
    """The demo's model on ``data``'s classes with its classifier fitted (least squares on the features of the
    validation images), exported with ``classes`` as its label_names: a model that tells these images apart, as a
    trained one does, in a second. Returns the export's folder and the model."""
    from vitlarge.checkpoint.export import export
    from vitlarge.config.load import load_config
    from vitlarge.data.sources import val_loader
    from vitlarge.model.vit import build_model

    cfg = load_config(RECIPE, [f"data.num_classes={len(classes)}", "train.precision=fp32"], data__path=data)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    images, labels = zip(*val_loader(cfg, 0, 1, torch.device("cpu")))
    with torch.no_grad():
        features = model.forward_head(model.forward_features(torch.cat(images)), pre_logits=True)
    x = torch.cat([features, torch.ones(len(features), 1)], 1).double()
    target = torch.nn.functional.one_hot(torch.cat(labels), len(classes)).double() * 10
    w = torch.linalg.lstsq(x, target).solution.float()
    model.head.weight.data, model.head.bias.data = w[:-1].T.contiguous(), w[-1].contiguous()
    return export(tmp_path / "run", model, cfg, classes), model, cfg


def test_an_export_of_five_classes_on_a_set_of_four_of_them_is_scored_by_name(tmp_path):
    """Issue 55: an export of 5 classes evaluated on a converted set holding 4 of them (``four`` missing) printed
    top-1 4.14% with exit 0: the set's labels 0..3 were taken for the model's 0..3. Scored by name, its top-1 is
    the one of the same model with only those 4 outputs (its classifier's rows by name): computed here in the test
    process, the same images through the same loader."""
    from data_tools.imagenet_to_tfrecord import convert
    from tests.helpers.data_fixtures import make_colour_folder
    from vitlarge.data.sources import val_loader
    from vitlarge.model.precision import Precision
    from vitlarge.train.validation import evaluate

    cpu = torch.device("cpu")
    for name, kept in (("five", FIVE), ("four", {k: v for k, v in FIVE.items() if k != "four"})):
        for split, n in (("train", 2), ("val", 12)):
            make_colour_folder(str(tmp_path / f"{name}_src"), kept, n, split)
        convert(str(tmp_path / f"{name}_src"), str(tmp_path / name), workers=0, progress=False, min_class_images=1)
    path, model, cfg = _fitted_export(tmp_path, str(tmp_path / "five"), sorted(FIVE))
    assert evaluate(model, val_loader(cfg, 0, 1, cpu), Precision("fp32", cpu))["val_top1"] > 0.9  # it tells them apart
    four = sorted(k for k in FIVE if k != "four")
    rows = [sorted(FIVE).index(k) for k in four]
    model.head.weight.data, model.head.bias.data = model.head.weight.data[rows], model.head.bias.data[rows]
    cfg.data.path, cfg.data.num_classes = str(tmp_path / "four"), 4
    reference = evaluate(model, val_loader(cfg, 0, 1, cpu), Precision("fp32", cpu))

    cmd = ["-m", "vitlarge.evaluate", "--config", RECIPE, "--data", str(tmp_path / "four"), "--checkpoint", str(path)]
    r = launcher.python([*cmd, "--json", "data.num_classes=5", "train.precision=fp32"], timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert (got["val_images"], got["val_top1"]) == (48, reference["val_top1"])  # 4.14%-like before: four's labels shift
    assert got["val_loss"] == pytest.approx(reference["val_loss"], rel=1e-4)
    assert got["val_top5"] is None  # 4 classes scored: every image is in its top 5
    assert (
        f"scoring 4 of the model's 5 classes by name: five, one, three, two ({tmp_path / 'four'}/dataset.json has no "
        "four)"
    ) in r.stderr.splitlines()
