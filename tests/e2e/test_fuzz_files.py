"""Random mutations of the real files vitlarge reads from elsewhere (meta.json, its phase list and schedule record,
an export's config.json, DCP's .metadata, rank files, the loader state, dataset.json, TFRecord headers, WebDataset tars, a workdir's
mlflow.db and the trackers' names beside it, overrides files, the loader state's DALI fields, TFRecord payloads, the
GPU parts bundle's manifest, a Hugging Face parquet set), a fixed seed, a few hundred per format: each
ends in a clean pass or one line (`UserError`, exit 2 at the CLIs; a tracker's warning line), touches nothing
outside its scratch folder, starts no process, connects to nothing, and answers within the driver's alarm; each
case's peak memory stays bounded (tests/helpers/fuzz_files.py)."""

import json
import os
import subprocess
import sys

from tests.helpers import ROOT

# Per format (TFRecord headers: a quarter, each rebuilds an index); ~2 min of CPU on 2 cores. Not fewer:
# the distinct refusals reached still grow between 150 and 200 cases for the checkpoint formats
# (meta.json 35 -> 37, .metadata 31 -> 33, rank file 10 -> 11 at seed 7, counting each entry point's line).
CASES = 200
CASE_PEAK_MIB = 2048
"""One case's peak RSS (the kernel's high-water mark, reset before each case), the process's own ~1.1 GiB (torch,
DALI, MLflow loaded) included: 1.05-1.2 GiB measured (AMD EPYC, 2 cores); a crafted file that took memory out of
proportion to its size (a YAML alias bomb, a flooded pickle) would go past it."""
FORMATS = (
    "meta.json",
    "export config.json",
    "meta.json phases and schedule",
    ".metadata",
    "rank file",
    "loader state",
    "dataset.json",
    "TFRecord headers",
    "WebDataset tars",
    "TFDS folder",
)
TRACKERS = ("mlflow.db", "tracker names")
OVERRIDES_AND_DATA = ("YAML overrides", ".py overrides", "loader state DALI fields", "TFRecord payloads")
PARTS = ("parts manifest",)  # scripts/gpu_parts.py: receive and join (PartsError: the refusal)
PARQUET = ("parquet",)  # a Hugging Face parquet set converted (data_tools.parquet_source)


def test_files_from_elsewhere_fuzz(tmp_path, demo_data):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    r = subprocess.run(
        [sys.executable, "-m", "tests.helpers.fuzz_files", str(scratch), demo_data, "20261125", str(CASES)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout[r.stdout.index("FUZZ ") + 5 :])
    for name in FORMATS + TRACKERS + OVERRIDES_AND_DATA + PARTS + PARQUET:
        result = report[name]
        assert result["failures"] == [], f"{name}: {result['failures'][:5]}"
        assert result["refused"] > 0  # the mutations reach the checks (not all swallowed as passes)
        assert result["peak_rss_mib"] < CASE_PEAK_MIB, f"{name}: {result['peak_rss_mib']} MiB"
        if name in OVERRIDES_AND_DATA + PARTS + PARQUET:
            assert result["passed"] > 0  # and keep some files valid: the valid path runs too
    assert report["violations"] == []
    assert report["peak_rss_mib"] < 3072
