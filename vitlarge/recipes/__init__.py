"""The shipped recipes as ``vitlarge.recipes`` in a checkout too: this package's modules are the checkout's
recipes/ folder, so a recipe of one's own derives from a shipped one with one import that works in a checkout
and where vitlarge is installed (docs/RECIPES.md):

    from vitlarge.recipes.vit_b16 import config as base

Installed (a wheel, ``pip install -e .``), pyproject.toml's package-dir makes recipes/ itself this package and
this file is not used.
"""

import os

__path__ = [os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "recipes")]
