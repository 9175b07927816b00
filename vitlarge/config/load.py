"""Loading a recipe, dotted ``key=value`` overrides and validation, all before the world size is known.

``load_config(path, overrides)`` runs the recipe, applies the overrides (`vitlarge.config.overrides`, from the
command line and the files `vitlarge.config.override_files` reads; typed by `vitlarge.config.coerce`; unknown keys
rejected with the closest match) and validates the result (`vitlarge.config.checks.validate`): one line naming
the key and a valid setting for each bad value. ``vitlarge.plan.plan.make_plan`` then derives the step counts for a
world size. This module imports nothing from torch, so recipes load fast and ``--dry-run`` touches no data.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib.util
import sys
import zlib
from collections.abc import Sequence
from pathlib import Path

from vitlarge import beside
from vitlarge.config.checks import validate
from vitlarge.config.override_files import read_overrides_file
from vitlarge.config.overrides import apply_override, set_value
from vitlarge.config.schema import Config
from vitlarge.errors import UserError


def shipped_recipes() -> Path:
    """The folder of the shipped recipes: the checkout's recipes/, or vitlarge/recipes/ where installed (both
    are the package ``vitlarge.recipes``)."""
    return Path(next(iter(beside("recipes").__path__)))


def _no_recipe(given: Path, path: Path) -> UserError:
    """A recipe that is not there: the closest name in its folder (or among the shipped ones), else what exists."""
    bare = given == Path(given.name) and given.suffix == ""
    names = sorted(p.stem for p in path.parent.glob("*.py") if p.stem != "__init__") if path.parent.is_dir() else []
    close = difflib.get_close_matches(path.stem, names, n=1, cutoff=0.6)
    if close:
        guess = close[0] if bare else str(given.with_name(close[0] + ".py"))
        return UserError(f"recipe {given} does not exist; did you mean {guess}?")
    shipped = ", ".join(p.stem for p in sorted(shipped_recipes().glob("*.py")) if p.stem != "__init__")
    if bare:
        return UserError(f"recipe {given}: no shipped recipe has that name ({shipped}); or pass a recipe file's path")
    return UserError(f"recipe {path} does not exist; pass a recipe file's path or a shipped recipe's name ({shipped})")


def _relative_import(path: Path) -> UserError:
    """The fix for a recipe that imports its base relatively (``from .vit_b16 import config``) from outside a
    package, where Python cannot resolve it: a recipe copied out of a package, or one of one's own."""
    line = "it imports relatively"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in node.names)
            line = (
                f"line {node.lineno}, 'from {'.' * node.level}{node.module or ''} import {names}', is a relative import"
            )
            if node.level == 1 and node.module and (shipped_recipes() / f"{node.module}.py").is_file():
                return UserError(
                    f"recipe {path}: {line}, which works only inside recipes/; import the shipped recipe by its "
                    f"full name: from vitlarge.recipes.{node.module} import {names}"
                )
            break
    return UserError(
        f"recipe {path}: {line}, which works only inside a package; import by the full name "
        f"(from vitlarge.recipes.vit_b16 import config), or put an __init__.py in {path.parent}"
    )


def _sibling_import(path: Path, error: ModuleNotFoundError) -> UserError | None:
    """The fix for a recipe whose import names its own folder (``from myrecipes.common import X``) or a sibling
    file (``from common import X``), which resolved while the loader put the recipe's folder on ``sys.path``: it
    no longer does (a planted ``timm.py`` there ran), so such a sibling is reached relatively, from a package;
    None for any other missing module."""
    folder, missing = path.resolve().parent, (error.name or "").split(".")
    if not missing[0] or not (
        missing[0] == folder.name or (folder / f"{missing[0]}.py").is_file() or (folder / missing[0]).is_dir()
    ):
        return None
    sibling = missing[0] if missing[0] != folder.name else ".".join(missing[1:])
    if not sibling:  # the folder by name: the sibling is the rest of the module the recipe's statement names
        tree = ast.parse(path.read_text())
        modules = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        modules += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        sibling = next((m.split(".", 1)[1] for m in modules if m.startswith(folder.name + ".")), "common")
    fix = "" if (folder / "__init__.py").is_file() else f"add an __init__.py to {folder} and "
    return UserError(
        f"recipe {path} failed to load: {type(error).__name__}: {error}; {fix}import it as "
        f"`from .{sibling} import ...` (vitlarge puts no recipe folder on sys.path; docs/RECIPES.md)"
    )


def _package(root: Path, package: list[str]) -> str:
    """The module name of the package ``root/package[0]/.../package[-1]`` that holds a recipe, imported so that
    the recipe's relative imports resolve, without putting ``root`` (or any folder) on ``sys.path``.

    Where the import path already finds that very folder under the name (the shipped ``recipes`` of the checkout
    this runs from, ``vitlarge.recipes`` installed), it is that package. Otherwise each level is loaded from its
    ``__init__.py`` under a private name made from ``root``: its modules are reached only relatively, and no
    module of the recipe's folder can stand in for a package that is imported later (a planted ``timm.py``)."""
    dotted = ".".join(package)
    try:
        found = importlib.util.find_spec(dotted)
    except (ImportError, ValueError):  # a parent that does not import, or is no package: not this folder
        found = None
    here = root.joinpath(*package)
    if found is not None and any(Path(p).resolve() == here for p in found.submodule_search_locations or ()):
        importlib.import_module(dotted)
        return dotted
    name = f"_vitlarge_recipes_{zlib.crc32(str(root).encode()):08x}"
    folder = root
    for part in package:
        name, folder = f"{name}.{part}", folder / part
        if name in sys.modules:
            continue
        spec = importlib.util.spec_from_file_location(
            name, folder / "__init__.py", submodule_search_locations=[str(folder)]
        )
        assert spec is not None and spec.loader is not None  # a .py file by the name: always a source spec
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return name


def load_recipe(path: str | Path) -> Config:
    """Runs a recipe file and returns its ``config()``; errors name the file. ``path``: a recipe file, or a shipped
    recipe's name (``vit_b16``). A recipe is Python by design: it derives from a shipped one (``from
    vitlarge.recipes.vit_b16 import config as base``) and changes fields, with the editor's and the type
    checker's help on every name; `validate` checks the result as strictly as an override."""
    given = path = Path(path)
    if not path.is_file() and path.suffix == "" and len(path.parts) == 1:  # a shipped recipe's name: vit_b16
        path = shipped_recipes() / f"{path}.py"
    if not path.is_file():
        raise _no_recipe(given, path)
    root, package = path.resolve().parent, []
    while (root / "__init__.py").is_file():  # recipes/ (vitlarge.recipes installed): loaded as that package's
        package.insert(0, root.name)
        root = root.parent
    try:
        name = f"{_package(root, package)}.{path.stem}" if package else f"_vitlarge_recipe_{path.stem}"
    except Exception as e:
        raise UserError(
            f"recipe {path}: its package {'.'.join(package)} failed to load: {type(e).__name__}: {e}"
        ) from None
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:  # not a Python source file
        raise UserError(f"recipe {path} is not a Python file; pass --config recipes/<name>.py")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except UserError:
        raise
    except ImportError as e:
        if "relative import" in str(e):
            raise _relative_import(path) from None
        if isinstance(e, ModuleNotFoundError) and (hint := _sibling_import(path, e)):
            raise hint from None
        raise UserError(f"recipe {path} failed to load: {type(e).__name__}: {e}") from None
    except Exception as e:
        raise UserError(f"recipe {path} failed to load: {type(e).__name__}: {e}") from None
    if not callable(getattr(module, "config", None)):
        raise UserError(f"recipe {path} defines no config() function; add 'def config() -> Config'")
    try:
        cfg = module.config()
    except UserError:
        raise
    except Exception as e:
        raise UserError(f"recipe {path}: config() raised {type(e).__name__}: {e}") from None
    if not isinstance(cfg, Config):
        raise UserError(f"recipe {path}: config() returned {type(cfg).__name__}, not vitlarge.config.schema.Config")
    return cfg


def load_config(
    path: str | Path,
    overrides: Sequence[str] = (),
    override_files: Sequence[str | Path] = (),
    *,
    base: Config | None = None,
    **direct: str | None,
) -> Config:
    """Recipe + direct settings (``data.path``, ``workdir``) + overrides files in order + dotted overrides (the
    command line wins), validated; an error about a key an override set names the override's origin. ``base``: a
    config made elsewhere (an export's, `vitlarge.evaluate.export_config`) in place of the recipe, ``path`` then
    what errors and the trackers' experiment name it by."""
    cfg = base if base is not None else load_recipe(path)
    overridden: dict[str, str] = {}
    for key, value in direct.items():
        if value is not None:
            overridden[apply_override(cfg, f"{key.replace('__', '.')}={value}")] = "command line"
    for file in override_files:
        for key, value in read_overrides_file(file):
            overridden[set_value(cfg, key, value, str(file))] = str(file)
    for item in overrides:
        overridden[apply_override(cfg, item)] = "command line"
    if cfg.log.experiment is None:  # the trackers' experiment: the recipe's name unless set
        cfg.log.experiment = Path(path).stem
    validate(cfg, origin=str(path), overridden=overridden)
    return cfg


def add_override_arguments(parser: argparse.ArgumentParser) -> None:
    """The two ways a command takes overrides for `load_config`, said the same in every command's ``--help``:
    ``--overrides FILE`` (repeatable, as ``override_files``) and dotted ``key=value`` words (as ``overrides``)."""
    parser.add_argument(
        "--overrides",
        dest="override_files",
        action="append",
        default=[],
        metavar="FILE",
        help="a .py (dotted.key = value lines) or .yaml file of overrides, applied before the command line's",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="dotted config overrides: optim.lr=0.01, optim.betas=0.9,0.98, model.kwargs.depth=2, "
        "train.phases.1.image_size=192",
    )
