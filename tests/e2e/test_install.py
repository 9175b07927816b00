"""The install: the default stack (requirements.txt) is what this suite runs on, and the CUDA 13
stack (``make install STACK=cuda13``) resolves to a CUDA 13 PyTorch with the matching DALI.

The CUDA 13 stack is resolved against PyPI (``pip install --dry-run``: metadata only, nothing is
installed) with this machine's pip settings left out, as on a user's machine.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT


def _pins(path: Path) -> dict[str, str]:
    """``name -> version`` of every ``name==version`` line of a requirements file and the files it includes."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r "):
            pins |= _pins(path.parent / line[3:].strip())
        elif "==" in line:
            name, version = line.split("==")
            pins[name.strip()] = version.strip()
    return pins


def test_this_environment_is_the_default_stack_with_every_pin():
    import torch

    pins = _pins(ROOT / "requirements.txt") | _pins(ROOT / "requirements" / "colossalai.txt")
    wrong = {
        name: (want, importlib.metadata.version(name))
        for name, want in pins.items()
        if importlib.metadata.version(name) != want
    }
    assert not wrong, f"installed versions differ from the pins (pinned, installed): {wrong}"
    assert torch.__version__.split("+")[0] == pins["torch"]
    assert torch.version.cuda == "12.8", "the default stack is PyTorch's CUDA 12.8 build"


def test_make_install_takes_the_stack_file_and_colossalai_without_its_dependencies(tmp_path):
    def dry(*args):
        return subprocess.run(
            ["make", "-n", "install", f"VENV={tmp_path}/venv", *args], cwd=ROOT, capture_output=True, text=True
        )

    default, cuda13 = dry(), dry("STACK=cuda13")
    assert default.returncode == 0 and cuda13.returncode == 0, default.stderr + cuda13.stderr
    assert "-r requirements.txt" in default.stdout and "cuda13" not in default.stdout
    assert "-r requirements/cuda13.txt" in cuda13.stdout
    for out in (default.stdout, cuda13.stdout):
        assert "--no-deps -r requirements/colossalai.txt" in out
    bad = dry("STACK=cuda11")
    assert bad.returncode != 0 and "STACK=cuda11: use cuda12 or cuda13" in bad.stderr


def test_a_venv_keeps_its_stack_and_refuses_another(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / ".installed-cuda13").touch()

    def dry(*args):
        return subprocess.run(["make", "-n", "test", f"VENV={venv}", *args], cwd=ROOT, capture_output=True, text=True)

    same = dry()
    assert same.returncode == 0 and "requirements.txt" not in same.stdout, (
        same.stdout
    )  # cuda13, installed: nothing to do
    other = dry("STACK=cuda12")
    assert other.returncode != 0
    assert f"{venv} holds the cuda13 stack, not STACK=cuda12; to change it: rm -rf {venv}" in other.stderr


def test_cuda13_stack_resolves_to_a_cuda13_torch_and_dali(tmp_path):
    report = tmp_path / "report.json"
    # pip is a tool here, not vitlarge's code: its own deprecation warnings are not ours to fail on.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "PYTHONWARNINGS"}
    env["PIP_CONFIG_FILE"] = os.devnull
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--report",
            str(report),
            "-r",
            str(ROOT / "requirements" / "cuda13.txt"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    resolved = {
        i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]
    }
    pins = _pins(ROOT / "requirements" / "cuda13.txt")
    assert resolved["torch"] == pins["torch"] and resolved["nvidia-dali-cuda130"] == pins["nvidia-dali-cuda130"]
    assert resolved["nvidia-cuda-runtime"].startswith("13."), resolved
    cuda12 = sorted(n for n in resolved if re.search(r"cu(da)?12", n))
    assert not cuda12, f"CUDA 12 packages in the CUDA 13 stack: {cuda12}"
