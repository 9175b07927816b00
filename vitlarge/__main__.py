"""``python -m vitlarge``: the training command, as train.py (``torchrun -m vitlarge`` where vitlarge is installed)."""

from vitlarge.run.cli import console

console()
