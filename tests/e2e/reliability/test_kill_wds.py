"""kill -9 of a 2-rank run reading WebDataset tars (timm's layout, in place), then the same command: exact resume.

The digits demo as tars (`demo_wds`: the TFRecords' records, tar for shard) gives the TFRecords' batches bit for bit,
so the interrupted run, resumed, must end on the uninterrupted TFRecord reference's weights: the reader's order,
its checkpoint across kill -9, the validation of all 360 images once and the export's class names, end to end.
"""

from __future__ import annotations

from hooks.jsonl import read_metrics
from tests.helpers import launcher, runs

TIMEOUT = 600


def test_kill_9_mid_epoch_on_webdataset_resumes_to_the_tfrecord_reference_bitwise(
    demo_data, demo_wds, tmp_path_factory, tmp_path
):
    import timm

    ref = runs.reference_run(demo_data, tmp_path_factory)
    workdir = tmp_path / "run"
    args = runs.train_args(demo_wds, workdir)
    log = tmp_path / "killed.log"
    proc = launcher.start(args, nproc=2, launcher="fork", log=log)
    try:  # after step 7: checkpoint 6 on disk, mid-epoch (11 steps an epoch)
        assert launcher.wait_for(runs.metrics_has_step(workdir, 7), TIMEOUT, proc), log.read_text()[-3000:]
    finally:
        launcher.kill_tree(proc)
    proc.wait(timeout=60)
    r = launcher.run(args, nproc=2, timeout=TIMEOUT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert runs.resumed_at(r.stdout + r.stderr) == [(str(workdir / "checkpoints" / "step_0000006"), 6)]
    runs.assert_bitwise_equal(runs.final_weights(ref), runs.final_weights(workdir))
    evals = [m for m in read_metrics(str(workdir / "metrics.jsonl")) if m["event"] == "eval"]
    assert evals[-1]["step"] == runs.REFERENCE_STEPS and evals[-1]["val_images"] == 360
    model = timm.create_model(f"local-dir:{workdir / 'model'}", pretrained=True)
    assert model.pretrained_cfg["label_names"] == [str(i) for i in range(10)]  # the .json members' class names
