"""The digits demo from TFDS's layout, read in place: a read-only TFDS version folder, indexed with
``make_index --out``, trained by train.py from the index folder; every validation image counted once and the
export naming the classes from TFDS's ``label.labels.txt``. Nothing is written into the TFDS folder."""

from __future__ import annotations

import json

from data_tools import make_index, tfds_layout
from hooks.jsonl import read_metrics
from tests.helpers import launcher
from tests.helpers.mounts import read_only, snapshot
from tests.helpers.runs import demo_args


def test_the_demo_trains_from_a_read_only_tfds_folder_through_an_index_folder(demo_data, tmp_path):
    src = tmp_path / "digits" / "1.0.0"
    tfds_layout.tfds_from_tfrecords(demo_data, str(src), "digits")
    index, workdir = tmp_path / "index", tmp_path / "run"
    before = snapshot(src)
    with read_only(src):
        make_index.make_index(str(src), out=str(index), workers=1)
        r = launcher.run(demo_args(str(index), workdir, "train.max_steps=2"), launcher="single", timeout=600)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert snapshot(src) == before
    evals = [x for x in read_metrics(str(workdir / "metrics.jsonl")) if x["event"] == "eval"]
    assert evals[-1]["step"] == 2 and evals[-1]["val_images"] == 360
    config = json.loads((workdir / "model" / "config.json").read_text())
    assert config["label_names"] == [str(i) for i in range(10)]  # label.labels.txt's, as timm reads them
