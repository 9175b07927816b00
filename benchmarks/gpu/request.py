"""What the kit's command line asks for, made once by `benchmarks.gpu.kit.main` and read by the sections: a frozen
spec handed on, not a parameter per flag in each section's function."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Request:
    tiny: bool
    """``--tiny``: the smoke sizes on any device (a CPU: eager rows, one recipe's rows of each kind)."""
    path: str = "auto"
    """``--path``: the engine's Booster asked for (``auto``, ``plain``, ``colossalai``); `kit.choose_path` decides."""
    sections: tuple[str, ...] = ()
    """``--only``: the sections after the matmul peak, in the kit's order."""
    deterministic: bool = True
    """``--deterministic on``: train.deterministic as the recipes set it."""
    overrides: tuple[str, ...] = ()
    """``--set KEY=VALUE``: train.py overrides applied to every recipe row."""
    rows: tuple[str, ...] = ()
    """``--rows RECIPE.ROW``: only these recipe rows (empty: all)."""
    time_budget: float | None = None
    """``--time-budget``: seconds from the start after which no recipe row starts (None: no budget)."""

    def deadline(self, start: float) -> float | None:
        """The ``time.perf_counter`` value past which no row starts, for a kit started at ``start``."""
        return start + self.time_budget if self.time_budget else None
