"""The install: the default stack (requirements.txt) is what this suite runs on, and the CUDA 13
stack (``make install STACK=cuda13``) resolves to a CUDA 13 PyTorch with the matching DALI.

The CUDA 13 stack is resolved against PyPI by the venv's uv (``uv pip compile``: wheels' metadata only,
nothing downloaded or installed) with this machine's pip and uv settings left out, as on a user's machine.

vitlarge itself: ``pip install .`` (a wheel built here, installed into a folder) and ``pip install -e .``
(into a throwaway venv that sees this one's packages) put one name in site-packages, ``vitlarge``, with the
checkout's hooks/, recipes/ and data_tools/ inside it, and its commands run from any directory: a recipe of
one's own outside the checkout, the commands its messages name. Both build from a copy of the sources, without
the network, and leave the copy as it was (no build/, no vitlarge.egg-info/).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
    assert (
        f"uv pip install --compile-bytecode --python {tmp_path}/venv/bin/python -r requirements.txt ||"
        in default.stdout
    )
    assert "uv could not install -r requirements.txt; pip installs it" in default.stdout  # uv reads no pip settings
    assert "pip install -q uv==" in default.stdout  # the pinned uv, where the venv has no uv of that version
    with_pip = dry("INSTALLER=pip")
    assert with_pip.returncode == 0 and "uv pip" not in with_pip.stdout and "uv==" not in with_pip.stdout
    assert "-m pip install --progress-bar on -r requirements.txt" in with_pip.stdout
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


def test_make_help_names_every_target():
    phony = re.search(r"^\.PHONY: (.*)$", (ROOT / "Makefile").read_text(), re.M)
    r = subprocess.run(["make", "help"], cwd=ROOT, capture_output=True, text=True)
    assert phony and r.returncode == 0, r.stderr
    words = set(re.findall(r"[\w-]+", r.stdout))
    assert [t for t in phony.group(1).split() if t not in words] == [], r.stdout
    assert "make demo NPROC=4 PORT=29600" in r.stdout


UV = Path(sys.executable).parent / "uv"
"""The installer `make install` puts in the venv (pinned in the Makefile): it resolves a stack from the wheels'
metadata (PEP 658 files) in seconds, downloading none of the 3.5 GB a pip dry run fetched (pypa/pip#12603)."""


def test_cuda13_stack_resolves_to_a_cuda13_torch_and_dali(tmp_path):
    assert UV.exists(), f"{UV} is missing: make install puts uv in the venv (the Makefile's UV_VERSION)"
    # resolved for a Linux x86-64 GPU server with Python 3.11, with no uv or pip settings of this machine's
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_")) and k != "PYTHONWARNINGS"}
    p = subprocess.run(
        [
            str(UV),
            "pip",
            "compile",
            "--quiet",
            "--no-config",
            "--no-header",
            "--no-annotate",
            "--python-version",
            "3.11",
            "--python-platform",
            "x86_64-manylinux_2_28",
            str(ROOT / "requirements" / "cuda13.txt"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    resolved = {}
    for line in p.stdout.splitlines():
        if "==" in line and not line.lstrip().startswith("#"):
            name, version = line.strip().split("==")
            resolved[name.lower()] = version
    pins = _pins(ROOT / "requirements" / "cuda13.txt")
    assert resolved["torch"] == pins["torch"] and resolved["nvidia-dali-cuda130"] == pins["nvidia-dali-cuda130"]
    assert resolved["nvidia-cuda-runtime"].startswith("13."), resolved
    for name, version in pins.items():  # every pin of the stack, common.txt's included, holds together
        assert resolved[name.lower()] == version, (name, version, resolved.get(name.lower()))
    cuda12 = sorted(n for n in resolved if re.search(r"cu(da)?12", n))
    assert not cuda12, f"CUDA 12 packages in the CUDA 13 stack: {cuda12}"


# --- vitlarge as a package -------------------------------------------------------------------------------------

INSTALLED_AS = {
    "vitlarge": "vitlarge",
    "hooks": "vitlarge/hooks",
    "recipes": "vitlarge/recipes",
    "data_tools": "vitlarge/data_tools",
}
"""The checkout's folders the package holds, and where each installs (pyproject.toml's package-dir)."""


def _pip(python: Path | str, *args: str) -> None:
    # pip is a tool here, not vitlarge's code: its own deprecation warnings are not ours to fail on.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "PYTHONWARNINGS"}
    env["PIP_CONFIG_FILE"] = os.devnull
    cmd = [str(python), "-m", "pip", *args, "--no-deps", "--no-build-isolation", "--no-index", "--quiet"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]


BUILD_FILES = ("pyproject.toml", "README.md", "MANIFEST.in", "scripts/__init__.py", "scripts/build_backend.py")
"""What a build reads besides the packages: the metadata and the in-tree backend (pyproject.toml's backend-path)."""


def _sources(tmp: Path) -> Path:
    src = tmp / "src"
    (src / "scripts").mkdir(parents=True)
    for name in (*BUILD_FILES, *INSTALLED_AS):
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / name, src / name)
    return src


def _run(cmd: list, python_path: Path | None, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """``cmd`` in ``cwd`` (not the checkout), with only ``python_path`` on the path besides the venv's packages."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if python_path:
        env["PYTHONPATH"] = str(python_path)
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def wheel_install(tmp_path_factory) -> tuple[Path, Path, Path]:
    """``(wheel, target, sources)``: the wheel ``pip wheel .`` builds from a copy of the sources, installed with
    ``pip install --target``."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = _sources(tmp)
    _pip(sys.executable, "wheel", "--wheel-dir", str(tmp / "dist"), str(src))
    (wheel,) = (tmp / "dist").glob("vitlarge-*.whl")
    _pip(sys.executable, "install", "--target", str(tmp / "site"), str(wheel))
    return wheel, tmp / "site", src


def test_the_wheel_holds_every_module_under_the_one_name_vitlarge(wheel_install):
    import zipfile

    wheel, site, src = wheel_install
    left = sorted(p.name for p in src.iterdir() if p.name not in {*INSTALLED_AS, *BUILD_FILES, "scripts"})
    assert left == [], "pip wheel left these beside the sources (scripts/build_backend.py builds elsewhere)"
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {n.split("/")[0] for n in names} == {"vitlarge", f"{wheel.name.split('-py')[0]}.dist-info"}
    want = {
        f"{where}/{f.relative_to(ROOT / folder).as_posix()}"
        for folder, where in INSTALLED_AS.items()
        for f in (ROOT / folder).rglob("*.py")
        if "__pycache__" not in f.parts
    }
    assert want - names == set(), "modules the wheel lacks (a package missing from pyproject.toml's list?)"
    # recipes/'s own __init__.py, not the checkout's vitlarge/recipes/__init__.py (which points at recipes/)
    assert (
        zipfile.ZipFile(wheel).read("vitlarge/recipes/__init__.py") == (ROOT / "recipes" / "__init__.py").read_bytes()
    )
    assert sorted(p.name for p in site.iterdir()) == ["bin", "vitlarge", wheel.name.split("-py")[0] + ".dist-info"]
    entry_points = (site / f"{wheel.name.split('-py')[0]}.dist-info" / "entry_points.txt").read_text()
    for command in ("vitlarge-train", "vitlarge-evaluate", "vitlarge-convert", "vitlarge-index", "vitlarge-plot"):
        assert f"{command} = " in entry_points


MY_RECIPE = """from vitlarge.recipes.deit3_b16_32k import config as base


def config():
    c = base()
    c.workdir = "runs/mine"
    return c
"""
"""A user's recipe in a folder of their own: one import of a shipped recipe, the same as in a checkout."""

INSTALLED_LINES = """
import vitlarge.recipes as r
from vitlarge.config.load import load_recipe
from vitlarge.data.manifest import load_manifest
from vitlarge.errors import UserError

print(list(r.__path__))
print(load_recipe("copied.py") == load_recipe("demo_digits_ft24"))
for bad in ("vit_b61", "data/digits"):
    try:
        load_manifest(bad) if "/" in bad else load_recipe(bad)
    except UserError as e:
        print(e)
"""


def test_the_installed_commands_run_from_any_directory(wheel_install, tmp_path):
    """The entry points and ``python -m`` from a folder that is not the checkout; a recipe of one's own there, which
    imports a shipped one (whose base imports its own); a shipped recipe copied there; the hooks found inside the
    package; the commands that --help and the messages name are the installed ones."""
    _, site, _ = wheel_install
    help_train = _run([site / "bin" / "vitlarge-train", "--help"], site, tmp_path)
    assert help_train.returncode == 0 and "usage: vitlarge-train" in help_train.stdout, help_train.stderr
    for module in ("vitlarge.report.plot", "vitlarge.data_tools.make_index", "vitlarge"):
        r = _run([sys.executable, "-m", module, "--help"], site, tmp_path)
        assert r.returncode == 0 and "usage:" in r.stdout, (module, r.stderr[-2000:])
    help_convert = _run([site / "bin" / "vitlarge-convert", "--help"], site, tmp_path)
    assert help_convert.stdout.startswith("usage: vitlarge-convert [-h] --src SRC"), help_convert.stdout
    where = _run(
        [sys.executable, "-c", "import vitlarge; print(vitlarge.__file__, vitlarge.beside('hooks').__name__)"],
        site,
        tmp_path,
    )
    assert where.stdout.split() == [str(site / "vitlarge" / "__init__.py"), "vitlarge.hooks"], where.stderr
    (tmp_path / "mine.py").write_text(MY_RECIPE)
    shutil.copy(ROOT / "recipes" / "demo_digits_ft24.py", tmp_path / "copied.py")
    lines = _run([sys.executable, "-c", INSTALLED_LINES], site, tmp_path)
    assert lines.stdout.splitlines() == [
        str([str(site / "vitlarge" / "recipes")]),
        "True",
        "recipe vit_b61 does not exist; did you mean vit_b16?",
        "data/digits: data directory does not exist; the demo's digits data set is made with python -m "
        "vitlarge.data_tools.make_demo_dataset data/digits (a few seconds); for other images convert with "
        "vitlarge-convert",
    ], lines.stderr[-3000:]
    dry = _run(
        [site / "bin" / "vitlarge-train", "--config", "mine.py", "--dry-run", "--world-size", "128"],
        site,
        tmp_path,
        300,
    )
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "global batch 32768 = 256 (micro) x 1 (accumulation) x 128 (devices)" in dry.stdout, dry.stdout


def test_an_editable_install_maps_the_checkouts_folders_into_vitlarge(tmp_path):
    """``pip install -e .``: vitlarge.hooks is the checkout's hooks/, and no top-level ``hooks`` appears."""
    src = _sources(tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    purelib = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], capture_output=True, text=True
    ).stdout.strip()
    import sysconfig

    (Path(purelib) / "this_venv.pth").write_text(sysconfig.get_path("purelib") + "\n")  # pip, torch and the rest
    _pip(py, "install", "--editable", str(src))
    (tmp_path / "elsewhere").mkdir()
    r = _run(
        [
            py,
            "-c",
            "import importlib.util, vitlarge.hooks, vitlarge.data_tools, vitlarge.recipes as r; "
            "print(vitlarge.hooks.__file__, *r.__path__, importlib.util.find_spec('hooks'))",
        ],
        None,
        tmp_path / "elsewhere",
    )
    assert r.stdout.split() == [str(src / "hooks" / "__init__.py"), str(src / "recipes"), "None"], r.stderr[-3000:]
    assert sorted(p.name for p in src.iterdir() if p.name not in {*INSTALLED_AS, *BUILD_FILES, "scripts"}) == []
    help_train = _run([venv / "bin" / "vitlarge-train", "--help"], None, tmp_path / "elsewhere")
    assert help_train.returncode == 0 and "usage: vitlarge-train" in help_train.stdout, help_train.stderr
