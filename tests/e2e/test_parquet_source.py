"""The digits demo from Hugging Face parquet, end to end: the set written by ``datasets`` as the Hub lays it out,
converted by the converter's worker processes, then a short train.py run that validates every one of its 360
validation images once and exports the class names from the parquet metadata."""

from __future__ import annotations

import json
import os

from data_tools.make_parquet_dataset import write_parquet
from hooks.jsonl import read_metrics
from tests.helpers import launcher
from tests.helpers.runs import demo_args


def test_the_demo_from_parquet_trains_and_validates_all_360_images_with_its_class_names(demo_data, tmp_path):
    hub = str(tmp_path / "hub")
    write_parquet(os.path.join(demo_data, "src"), hub, files_per_split=2)
    data = str(tmp_path / "data")
    args = ["--src", hub, "--out", data, "--workers", "2", "--train-shards", "4", "--val-shards", "2", "--no-progress"]
    r = launcher.python(["-m", "data_tools.imagenet_to_tfrecord", *args])
    assert r.returncode == 0, r.stderr
    assert "train: 1,437 images in 4 shards, validation: 360 images in 2 shards; 10 classes" in r.stderr
    workdir = tmp_path / "run"
    r = launcher.run(demo_args(data, workdir, "train.max_steps=2"), launcher="single")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    evals = [x for x in read_metrics(str(workdir / "metrics.jsonl")) if x["event"] == "eval"]
    assert evals[-1]["val_images"] == 360
    with open(workdir / "model" / "config.json") as f:
        assert json.load(f)["label_names"] == [str(i) for i in range(10)]  # timm reads them as pretrained_cfg's
