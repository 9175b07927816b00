"""The layout stays one-way and formatted: import-linter's contracts (layers; no import cycle inside any package of
the checkout), ruff."""

import ast
import logging
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_packages_import_only_downwards(capsys, monkeypatch):
    """pyproject.toml's contracts: a new upward import (and with it any circle between packages) fails, and so does a
    circle between the modules of one package (acyclic_siblings).
    import-linter's ``lint-imports`` in this process: its function, from the repository root, as the command runs."""
    from importlinter.cli import EXIT_STATUS_SUCCESS, lint_imports

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "path", list(sys.path))  # it puts the working directory first; put back after
    # It configures logging with dictConfig, which disables every logger that exists ("vitlarge" among them):
    # the tests after this one in the process (an xdist worker's next file) would capture no records.
    loggers = [x for x in logging.Logger.manager.loggerDict.values() if isinstance(x, logging.Logger)]
    disabled = [(x, x.disabled) for x in loggers]
    try:
        status = lint_imports(no_logo=True)
    finally:
        for logger, was in disabled:
            logger.disabled = was
    out = capsys.readouterr().out
    assert status == EXIT_STATUS_SUCCESS, out[-4000:]
    assert "0 broken" in out


def test_the_library_names_no_package_above_it():
    """vitlarge/ is handed its hooks (train.py, the installed command's `console`): no module of it imports
    hooks/, data_tools/ or benchmarks/, not even by name through `vitlarge.beside`, which import-linter cannot
    see. `vitlarge.run.cli.console` is the one entry that looks the standard hooks up (installed, they are
    ``vitlarge.hooks``)."""
    import ast

    found = []
    for path in sorted(p for package in ("vitlarge", "hooks", "data_tools") for p in (ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "beside":
                names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            for name in names:
                if name.split(".")[0] in ("hooks", "data_tools", "benchmarks") or name.startswith("vitlarge.hooks"):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    entry = "vitlarge/run/cli.py"
    assert [f for f in found if not f.startswith(entry)] == []
    assert len([f for f in found if f.startswith(entry)]) == 1  # console's lookup, nothing else there


def test_the_contracts_cover_every_package_of_the_checkout():
    """No import circle in any folder: every package at the checkout's top (a folder with an ``__init__.py``:
    benchmarks/, scripts/ and tests/ as much as vitlarge/) is a root package, in the layers contract (the tests above
    benchmarks and scripts, they above hooks, data_tools and recipes, those above vitlarge: no circle between
    packages) and an ancestor of the acyclic_siblings contract (no circle inside one, at any depth). A new package
    folder fails here until it is added to all three."""
    import tomllib

    linter = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    packages = sorted(p.parent.name for p in ROOT.glob("*/__init__.py"))
    assert sorted(linter["root_packages"]) == packages
    layers = [c["layers"] for c in linter["contracts"] if c["type"] == "layers"]
    assert ["tests", "benchmarks | scripts", "hooks | data_tools | recipes", "vitlarge"] in layers
    (acyclic,) = [c for c in linter["contracts"] if c["type"] == "acyclic_siblings"]
    assert sorted(acyclic["ancestors"]) == packages


def test_a_cycle_inside_a_package_breaks_the_contract(tmp_path, monkeypatch, capsys):
    """pyproject.toml's acyclic_siblings contract is live: two modules of a planted package that import each other,
    one of them inside a function (it counts when it runs), break it."""
    import tomllib
    from importlinter.cli import EXIT_STATUS_ERROR, lint_imports

    pkg = tmp_path / "circle"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from circle import b\n")
    (pkg / "b.py").write_text("def f():\n    from circle import a\n")
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (acyclic,) = [c for c in contracts if c["type"] == "acyclic_siblings"]
    config = tmp_path / "importlinter.toml"
    config.write_text(
        '[tool.importlinter]\nroot_packages = ["circle"]\n\n[[tool.importlinter.contracts]]\n'
        f'name = "{acyclic["name"]}"\ntype = "acyclic_siblings"\nancestors = ["circle"]\n'
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    loggers = [x for x in logging.Logger.manager.loggerDict.values() if isinstance(x, logging.Logger)]
    disabled = [(x, x.disabled) for x in loggers]
    try:
        status = lint_imports(config_filename=str(config), no_logo=True, no_cache=True)
    finally:
        for logger, was in disabled:
            logger.disabled = was
        sys.modules.pop("circle", None)
    out = capsys.readouterr().out
    assert status == EXIT_STATUS_ERROR and "1 broken" in out, out[-3000:]
    assert "No cycles are allowed in circle." in out and "- .b -> .a (1 import)" in out, out[-3000:]


def test_the_tree_is_ruff_formatted_and_clean():
    """ruff is a Rust binary with no in-process API: the one process tests/unit starts (conftest.py, ALLOWED)."""
    fmt = subprocess.run([str(BIN / "ruff"), "format", "--check", "."], cwd=ROOT, capture_output=True, text=True)
    assert fmt.returncode == 0, fmt.stdout[-3000:] + fmt.stderr[-1000:]
    lint = subprocess.run([str(BIN / "ruff"), "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout[-3000:] + lint.stderr[-1000:]


def test_the_commands_messages_name_are_the_checkouts_here_and_the_console_scripts_installed():
    """`vitlarge.command`: from a checkout ``python -m data_tools...``; installed (tests/e2e/test_install.py) the
    console scripts, which must be pyproject.toml's, for the same modules."""
    import tomllib

    import vitlarge

    assert vitlarge.command("data_tools.make_index") == "python -m data_tools.make_index"
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for module, script in vitlarge.SCRIPTS.items():
        assert scripts[script] == f"vitlarge.{module}:main"


def test_exit_statuses_are_named_in_one_place():
    """The statuses vitlarge chooses (2 bad input, 3 NaN guard, 69 rendezvous, 75 preempted, 124 collective timeout,
    130 Ctrl-C) are
    `vitlarge.errors`' ``EXIT_*`` constants: no return, exit, launcher report or status variable writes one bare."""
    import ast

    from vitlarge import errors

    statuses = {2, 3, 69, 75, 124, 130}
    assert {v for k, v in vars(errors).items() if k.startswith("EXIT_")} == statuses
    exits = {"exit", "_exit", "SystemExit", "tell_launcher"}
    bare = []
    files = [ROOT / "train.py", *[p for d in ("vitlarge", "hooks", "data_tools") for p in (ROOT / d).rglob("*.py")]]
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Return):
                values = [node.value]
            elif isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                values = list(node.args) if name in exits else []
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                values = [node.value] if {"code", "status"} & set(names) else []
            else:
                continue
            bare += [
                f"{path.relative_to(ROOT)}:{node.lineno}"
                for v in values
                if isinstance(v, ast.Constant) and type(v.value) is int and v.value in statuses
            ]
    assert not bare, f"bare exit statuses (use vitlarge.errors.EXIT_*): {bare}"


def test_an_import_inside_a_function_says_what_it_keeps_off_which_path():
    """An import belongs at the module's top, where a reader sees what the module depends on. One inside a function
    is there to keep a heavy package (torch, DALI, Colossal-AI, a tracker, matplotlib) off a start-up path that does
    not use it (``train.py --help``, the dry run until the thread pools are sized, a data tool: the paths
    tests/e2e/test_process_start.py::test_light_paths checks), and says so on its first line or in a comment line
    just above it: ``# lazy: keeps torch off train.py --help``."""
    said = re.compile(r"#.*\blazy: \S")
    unsaid = []
    for path in sorted(p for package in ("vitlarge", "hooks", "data_tools") for p in (ROOT / package).rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        lines = path.read_text().splitlines()

        def walk(node, inside: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)) and inside:
                    first = lines[child.lineno - 1]
                    above = lines[child.lineno - 2] if lines[child.lineno - 2].lstrip().startswith("#") else ""
                    if not said.search(first) and not said.search(above):
                        unsaid.append(f"{name}:{child.lineno} {first.strip()}")
                walk(child, inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

        walk(ast.parse("\n".join(lines)), False)
    assert not unsaid, f"{len(unsaid)} imports inside functions without '# lazy: <what it keeps off which path>':\n" + (
        "\n".join(unsaid)
    )


def test_few_functions_take_many_parameters():
    """A function that needs many values takes the spec that holds them (STYLE.md 17-19): at most
    `AT_MOST_MANY` functions of the checkout (every package, tests and train.py) take more than `MANY_PARAMETERS`
    parameters, none more than `MOST_PARAMETERS`. Counted as scripts/structure_report.py counts: every parameter but
    ``self``/``cls``, ``*args`` and ``**kwargs`` one each."""
    from scripts.structure_report import AT_MOST_MANY, MANY_PARAMETERS, MOST_PARAMETERS, many_parameters

    many = many_parameters(ROOT)
    listing = "\n".join(f"  {n:3d}  {where}" for n, where in many)
    assert len(many) <= AT_MOST_MANY, f"{len(many)} functions take more than {MANY_PARAMETERS} parameters:\n{listing}"
    assert all(n <= MOST_PARAMETERS for n, _ in many), f"over {MOST_PARAMETERS} parameters:\n{listing}"
