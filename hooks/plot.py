"""At the end of training, a picture of the run next to metrics.jsonl (``<workdir>/metrics.png``).

Main rank only, after the final evaluation (so the picture holds it). It reads back what
`JsonlHook` wrote, so it must come after that hook in the list. A failure to draw is one warning
line, never a failed run: the model and checkpoints matter more than the picture, which
``python -m vitlarge.report.plot WORKDIR`` can redraw at any time.
"""

from __future__ import annotations

import gc
import logging

from vitlarge.events import EvalMetrics, Hook, RunInfo
from vitlarge.report.plot import plot_run


class PlotHook(Hook):
    def __init__(self, workdir: str):
        self.workdir = workdir
        self.path: str | None = None

    def on_train_end(self, run: RunInfo, summary: EvalMetrics) -> None:
        if not run.is_main:
            return

        log = logging.getLogger("vitlarge")
        collecting = gc.isenabled()
        # matplotlib's many small objects would set off a full collection over the training process's heap (torch,
        # the model, the loaders: some 370k objects, a few tenths of a second); the figure's own cycles are few,
        # and are collected after.
        gc.disable()
        try:
            self.path = str(plot_run(self.workdir))
        except Exception as e:  # noqa: BLE001 (whatever breaks the drawing must not fail a finished run)
            log.warning(
                f"warning: no picture of the run ({e}); draw it with python -m vitlarge.report.plot {self.workdir}"
            )
            return
        finally:
            if collecting:
                gc.enable()
        log.info(f"plot  {self.path}")
