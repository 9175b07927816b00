"""vitlarge/checkpoint/checkpointer.py in one process: the surface run/ and train/ use of checkpoint/, the workdir's
checks in one call before any work (a resume through it: tests/e2e/test_resume_paths.py).

The multi-process paths (a workdir not shared by every node, rank 0's choice broadcast) are in
tests/e2e/test_resume_paths.py and tests/e2e/test_preflight.py.
"""

import ast

import pytest

from tests.helpers import ROOT
from vitlarge.checkpoint.checkpointer import Checkpointer
from vitlarge.config.load import load_recipe
from vitlarge.errors import UserError


@pytest.fixture(scope="module")
def cfg():
    return load_recipe(ROOT / "recipes" / "demo_digits.py")


def checkpoint_names_imported_by(package: str) -> set[str]:
    """``module.name`` of every name a module of vitlarge/<package>/ imports from vitlarge.checkpoint (any depth)."""
    names = set()
    for path in (ROOT / "vitlarge" / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vitlarge.checkpoint"):
                module = (node.module or "").removeprefix("vitlarge.checkpoint.")
                names |= {f"{module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                names |= {a.name for a in node.names if a.name.startswith("vitlarge.checkpoint")}
    return names


def test_run_and_train_use_the_checkpointer_and_nothing_else_of_checkpoint_but_export_and_init_from():
    used = checkpoint_names_imported_by("run") | checkpoint_names_imported_by("train")
    assert used == {
        "checkpointer.Checkpointer",
        "export.export",
        "export.weights_to_export",
        "init_from.check_source",
        "init_from.load_into",
        "init_from.plan_notes",
        "trust.meta.is_number",  # the one rule for a number read from a file (gpu_hours reads a gpu.json from elsewhere)
    }


def test_the_checkpointers_public_surface_is_construct_check_attach_resume_save_prune():
    public = {n for n in vars(Checkpointer) if not n.startswith("_")}
    assert public == {"folder", "any", "check_workdir", "attach", "resume", "has", "save", "prune"}


def test_check_workdir_makes_a_writable_workdir_and_leaves_no_probe(tmp_path, cfg):
    work = tmp_path / "new" / "run"
    Checkpointer(work, cfg).check_workdir()
    assert work.is_dir() and list(work.iterdir()) == []  # the write test and the shared probe are gone


def test_check_workdir_refuses_a_linked_checkpoints_folder_before_a_missing_resume(tmp_path, cfg):
    """The workdir's lines in their order: its checkpoints folder a link elsewhere, then ``--resume``."""
    (tmp_path / "elsewhere").mkdir()
    work = tmp_path / "run"
    work.mkdir()
    (work / "checkpoints").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UserError, match=rf"^{work / 'checkpoints'} is a symbolic link \(to {tmp_path / 'elsewhere'}\)"):
        Checkpointer(work, cfg).check_workdir(tmp_path / "missing")
    (work / "checkpoints").unlink()
    with pytest.raises(UserError, match="missing"):
        Checkpointer(work, cfg).check_workdir(tmp_path / "missing")


def test_each_checkpoint_records_the_data_sets_class_names_for_evaluate(tmp_path, cfg):
    """``vitlarge.evaluate`` maps a data set by name (`vitlarge.data.class_map`): the run's checkpoints carry the
    names its Checkpointer was given (the manifest's, `vitlarge.run.job`)."""
    from tests.helpers.tiny_model import make
    from vitlarge.checkpoint.trust.layout import read_meta

    names = [f"n{i:02d}" for i in range(cfg.data.num_classes)]
    path = Checkpointer(tmp_path, cfg, classes=names).attach(*make(cfg)).save(3)
    assert read_meta(path)["classes"] == names
