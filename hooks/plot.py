"""At the end of training, a picture of the run next to metrics.jsonl (``<workdir>/metrics.png``).

Main rank only, after the final evaluation (so the picture holds it). It reads back what
`JsonlHook` wrote, so it must come after that hook in the list. A failure to draw is one warning
line, never a failed run: the model and checkpoints matter more than the picture, which
``python -m vitlarge.report.plot WORKDIR`` can redraw at any time.
"""

from __future__ import annotations

import logging

from vitlarge.events import EvalMetrics, Hook, RunInfo


class PlotHook(Hook):
    def __init__(self, workdir: str):
        self.workdir = workdir
        self.path: str | None = None

    def on_train_end(self, run: RunInfo, summary: EvalMetrics) -> None:
        if not run.is_main:
            return
        from vitlarge.report.plot import plot_run

        log = logging.getLogger("vitlarge")
        try:
            self.path = str(plot_run(self.workdir))
        except Exception as e:  # noqa: BLE001 (whatever breaks the drawing must not fail a finished run)
            log.warning(
                f"warning: no picture of the run ({e}); draw it with python -m vitlarge.report.plot {self.workdir}"
            )
            return
        log.info(f"plot  {self.path}")
