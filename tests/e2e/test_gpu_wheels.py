"""scripts/gpu_wheels.sh: the GPU kit runs the real Colossal-AI path from the wheels it packs.

The wheels are downloaded from PyPI for this machine's Python (the GPU machine gets them for its
own), then installed with ``--target`` into a folder that the kit reaches only through PYTHONPATH,
as on the bare GPU machine. The Python that runs the kit sees this suite's virtualenv without every
package requirements/gpu-kit.txt names, without DALI, TFRecord and crc32c, and without what Colossal-AI
pulls in that the kit does not take (`NOT_NEEDED`): a symlinked copy of site-packages that leaves them
out. So the run shows that the wheels alone make Colossal-AI import with the torch installed here, and
that the kit then takes its Booster path.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KIT_REQUIREMENTS = ROOT / "requirements" / "gpu-kit.txt"
ALSO_ABSENT = ("nvidia", "tfrecord", "crc32c")  # not on the GPU machine either
# What colossalai.booster's __init__ and Colossal-AI's declared requirements pull in and the kit does not take
# (vitlarge.distributed.booster loads the Booster without them): absent, so the run shows they are not needed.
NOT_NEEDED = (
    "transformers",
    "tokenizers",
    "huggingface_hub",
    "bitsandbytes",
    "galore_torch",
    "einops",
    "contexttimer",
    "pydantic",
    "pydantic_core",
    "typing_inspection",
    "annotated_types",
    "fabric",
)
# pip and venv are tools here, not vitlarge's code: the suite's deprecations-as-errors is not for them.
TOOL_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}


def _distribution_names() -> list[str]:
    names = [
        line.split("==")[0]
        for line in KIT_REQUIREMENTS.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    return [re.sub(r"[-.]", "_", n).lower() for n in names]


def _site_without(dropped: list[str], dest: Path) -> Path:
    """A Python whose site-packages is this venv's less ``dropped`` (import and dist-info names)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], env=TOOL_ENV, check=True)
    site = Path(sysconfig.get_paths()["purelib"])
    target = dest / Path(sysconfig.get_paths()["purelib"]).relative_to(sys.prefix)
    for entry in site.iterdir():
        stem = re.split(r"[-.]", entry.name, maxsplit=1)[0].lower()
        if stem not in dropped and not any(stem.startswith(p) for p in ALSO_ABSENT):
            (target / entry.name).symlink_to(entry)
    return dest / "bin" / "python"


@pytest.mark.slow
def test_kit_runs_the_colossalai_path_from_the_wheels_alone(tmp_path):
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    wheels = tmp_path / "whl"
    made = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_wheels.sh"), str(wheels), version],
        env=TOOL_ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    assert {w.name.split("-")[0].lower() for w in wheels.glob("*.whl")} == set(_distribution_names())

    dropped = _distribution_names() + list(NOT_NEEDED)
    python = _site_without(dropped, tmp_path / "bare")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": "1"}
    missing = subprocess.run([str(python), "-c", "import colossalai"], env=env, capture_output=True, text=True)
    assert missing.returncode != 0 and "No module named 'colossalai'" in missing.stderr

    site = tmp_path / "site"
    # --no-compile: what the kit imports is compiled as it is imported, the same files either way.
    # Colossal-AI alone is compiled as pip would (2 s): ten of its files hold invalid escape sequences, a
    # DeprecationWarning when compiled, which the suite's PYTHONWARNINGS would make an error in the kit's run.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-compile",
            "--no-index",
            "--no-deps",
            "--target",
            str(site),
            *map(str, sorted(wheels.glob("*.whl"))),
        ],
        env=TOOL_ENV,
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(site / "colossalai")],
        env=TOOL_ENV,
        check=True,
        capture_output=True,
    )
    out = tmp_path / "out"
    run = subprocess.run(
        [
            str(python),
            "-m",
            "benchmarks.gpu",
            "--device",
            "cpu",
            "--tiny",
            "--path",
            "colossalai",
            "--only",
            "train",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=env | {"PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads((out / "gpu.json").read_text())
    assert result["path"] == "colossalai", result["path_why"]
