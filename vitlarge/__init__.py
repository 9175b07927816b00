"""vitlarge: large-batch ViT pretraining recipes on Colossal-AI.

The repository's other top-level packages install inside this one (pyproject.toml's ``package-dir``):
``hooks/`` as ``vitlarge.hooks``, ``recipes/`` as ``vitlarge.recipes``, ``data_tools/`` as
``vitlarge.data_tools``, so an installed vitlarge claims no generic top-level name. `beside` finds them
in either layout, and `command` names the command that runs one of their tools there.
"""

from __future__ import annotations

import importlib
import importlib.util
import types

__version__ = "0.3.0"

BESIDE = ("hooks", "recipes", "data_tools")
"""The repository's folders beside ``vitlarge/`` that install as ``vitlarge.<name>``."""


def beside(name: str) -> types.ModuleType:
    """The package ``name`` (one of `BESIDE`): ``vitlarge.<name>`` where vitlarge is installed (a wheel, or
    ``pip install -e .``), else the top-level folder of the checkout this runs from."""
    if name not in BESIDE:
        raise ValueError(f"{name!r} is not one of {BESIDE}")
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":  # a dependency missing inside it: that error, not the fallback's
            raise
    return importlib.import_module(name)


SCRIPTS = {
    "data_tools.imagenet_to_tfrecord": "vitlarge-convert",
    "data_tools.make_index": "vitlarge-index",
}
"""The console scripts of the tools beside vitlarge/ (pyproject.toml's ``[project.scripts]``), by checkout module."""


def command(module: str) -> str:
    """The command that runs ``module`` (its checkout name, ``data_tools.make_index``) where this vitlarge runs, for
    messages and ``--help``: ``python -m data_tools.make_index`` in a checkout (from its root); installed, the console
    script (``vitlarge-index``) or ``python -m vitlarge.data_tools.make_index`` where there is none."""
    top = module.split(".")[0]
    if top not in BESIDE:
        raise ValueError(f"{module!r} is not in one of {BESIDE}")
    if importlib.util.find_spec(f"{__name__}.{top}") is None:  # a checkout: the folder is top-level
        return f"python -m {module}"
    return SCRIPTS.get(module) or f"python -m {__name__}.{module}"
