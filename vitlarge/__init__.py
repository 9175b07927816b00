"""vitlarge: large-batch ViT pretraining recipes on Colossal-AI.

The repository's other top-level packages install inside this one (pyproject.toml's ``package-dir``):
``hooks/`` as ``vitlarge.hooks``, ``recipes/`` as ``vitlarge.recipes``, ``data_tools/`` as
``vitlarge.data_tools``, so an installed vitlarge claims no generic top-level name. `beside` finds them
in either layout.
"""

from __future__ import annotations

import importlib
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
