"""vitlarge/distributed/booster.py's two changes, on planted packages: stand-ins for a package's names while a block
runs, and a package made without its ``__init__``. (On Colossal-AI itself, in a fresh interpreter:
e2e/test_process_start.py.)"""

from __future__ import annotations

import sys

import pytest

from vitlarge.distributed import booster

FAKE = "vitlarge_fake_peft"
STAND_INS = {FAKE: ("Model", "Kind"), f"{FAKE}.utils": (), f"{FAKE}.utils.other": ("NAMES",)}


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A package `FAKE` (a model class, an enum-like class, a list in a submodule) that counts its own imports, and
    `booster.STAND_INS` naming it instead of peft; every module it made is gone afterwards."""
    root = tmp_path / "site" / FAKE
    (root / "utils").mkdir(parents=True)
    (root / "__init__.py").write_text(
        "import builtins\nbuiltins.fake_imports = getattr(builtins, 'fake_imports', 0) + 1\n"
        "class Model:\n    pass\nclass Kind:\n    LORA = 'lora'\n"
    )
    (root / "utils" / "__init__.py").write_text("")
    (root / "utils" / "other.py").write_text("NAMES = ['embed_tokens']\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(booster, "STAND_INS", STAND_INS)
    monkeypatch.setattr(booster, "CLASSES", (f"{FAKE}.Model",))
    import builtins

    monkeypatch.setattr(builtins, "fake_imports", 0, raising=False)
    yield
    for name in [m for m in sys.modules if m == FAKE or m.startswith(FAKE + ".")]:
        del sys.modules[name]


def test_stand_ins_hold_the_names_read_while_loading_and_the_real_ones_after(planted):
    import builtins

    with booster._stand_ins():
        from vitlarge_fake_peft import Kind, Model  # pyright: ignore[reportMissingImports]
        from vitlarge_fake_peft.utils.other import NAMES  # pyright: ignore[reportMissingImports]
    assert builtins.fake_imports == 0 and FAKE not in sys.modules  # nothing of the package ran; the stand-ins left
    assert not isinstance(object(), Model) and not issubclass(int, Model)  # nothing is one before the package loads
    assert Kind.LORA == "lora" and "embed_tokens" in NAMES and list(NAMES) == ["embed_tokens"]  # the real ones, now
    assert builtins.fake_imports == 1
    import vitlarge_fake_peft as real  # pyright: ignore[reportMissingImports]

    assert isinstance(real.Model(), Model) and issubclass(real.Model, Model) and not isinstance(object(), Model)
    assert isinstance(Model(), real.Model)  # calling the stand-in makes the real class's object
    assert builtins.fake_imports == 1


def test_a_name_or_module_the_stand_ins_do_not_hold_stops_the_load_with_its_name(planted):
    with booster._stand_ins(), pytest.raises(ImportError, match=f"reads {FAKE}.Other when it loads.*STAND_INS"):
        from vitlarge_fake_peft import Other  # noqa: F401  # pyright: ignore[reportMissingImports]
    with booster._stand_ins(), pytest.raises(ImportError, match=f"imports {FAKE}.tuners when it loads.*STAND_INS"):
        import vitlarge_fake_peft.tuners  # noqa: F401  # pyright: ignore[reportMissingImports]
    with booster._stand_ins(), pytest.raises(ImportError, match=f"subclasses {FAKE}.Model when it loads"):
        from vitlarge_fake_peft import Model  # pyright: ignore[reportMissingImports]

        class Adapter(Model):  # noqa: F841
            pass

    assert FAKE not in sys.modules


def test_a_package_already_imported_or_not_installed_is_not_stood_in(planted, monkeypatch):
    import vitlarge_fake_peft as real  # pyright: ignore[reportMissingImports]

    with booster._stand_ins():
        from vitlarge_fake_peft import Model  # pyright: ignore[reportMissingImports]
    assert Model is real.Model
    monkeypatch.setattr(booster, "STAND_INS", {"vitlarge_not_installed": ("X",)})
    with booster._stand_ins(), pytest.raises(ModuleNotFoundError):
        import vitlarge_not_installed  # noqa: F401  # pyright: ignore[reportMissingImports]


def test_a_package_made_without_its_init_runs_it_when_another_name_is_read(tmp_path, monkeypatch):
    root = tmp_path / "site" / "vitlarge_fake_plugins"
    root.mkdir(parents=True)
    (root / "__init__.py").write_text("from .base import Base\nfrom .heavy import Heavy\nINIT_RAN = True\n")
    (root / "base.py").write_text("class Base:\n    pass\n")
    (root / "heavy.py").write_text("class Heavy:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    try:
        package = booster.package_without_init("vitlarge_fake_plugins")
        from vitlarge_fake_plugins.base import Base  # pyright: ignore[reportMissingImports]

        package.Base = Base
        assert "INIT_RAN" not in vars(package) and "vitlarge_fake_plugins.heavy" not in sys.modules
        from vitlarge_fake_plugins import Base as again  # pyright: ignore[reportMissingImports]

        assert again is Base and "INIT_RAN" not in vars(package)
        from vitlarge_fake_plugins import Heavy  # pyright: ignore[reportMissingImports]

        assert package.INIT_RAN and Heavy is sys.modules["vitlarge_fake_plugins.heavy"].Heavy and package.Base is Base
        with pytest.raises(AttributeError):
            _ = package.Missing
    finally:
        for name in [m for m in sys.modules if m.startswith("vitlarge_fake_plugins")]:
            del sys.modules[name]
