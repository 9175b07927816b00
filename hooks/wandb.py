"""The run in Weights & Biases (``log.wandb=true``): one W&B run per checkpoint line, written off the training thread.

Main rank only. Configured as W&B users expect, by its own variables (``WANDB_PROJECT``, ``WANDB_ENTITY``,
``WANDB_MODE=offline``, ``WANDB_DIR``, ``WANDB_API_KEY``...); ``log.wandb_project`` sets the project, else
``WANDB_PROJECT``, else ``log.experiment`` (the recipe's name). The run's files go to ``WANDB_DIR``, else the workdir
(``<workdir>/wandb``). The run id is this line's (``trackers.json``), else ``WANDB_RUN_ID``, else a new one.
``wandb.init`` and every ``log`` run on `hooks._sender`'s thread: W&B's service process (``wandb-core``, started by
``wandb.init``: about a second and ~100 MB) never delays a step, and a W&B that is down costs one warning line.
Console capture is off unless ``WANDB_CONSOLE`` says otherwise (the launcher's log has the console). Without
``WANDB_DIR`` the ``wandb`` folder must resolve inside the workdir: a link planted in a handed-over workdir stops the
run in one line rather than carrying W&B's files elsewhere (W&B replaces its own links inside it, ``latest-run``...).

* config: the resolved config (nested as the recipe's sections), and ``vitlarge`` (commit, world size, device,
  precision and its reason, plugin, parent run); ``segment_<nnn>`` per process start (``segment_001``...; start
  step, world size, reason);
* history at the optimizer step: the same fields as `hooks.mlflow` (metrics.jsonl's names);
* at the end: the timm export as a ``model`` artifact and ``metrics.png`` among the run's files.

A resume continues the same run (``resume="allow"``). A resume that replays steps (metrics.jsonl has steps past the
resumed one: a kill -9 after the last checkpoint) rewinds it to the resumed step instead
(``resume_from="<id>?_step=<step>"``, a W&B preview feature): the replayed steps replace the killed attempt's, as in
`read_metrics`. Offline, W&B records the rewind and
``wandb sync`` applies it; where the server refuses rewinding, the hook resumes with ``resume="allow"`` instead and
W&B drops the replayed steps (it takes no step below the run's last): the history then keeps the killed attempt's
values for them (docs/LOGS.md).
"""

from __future__ import annotations

import os
import secrets
import string
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitlarge.events import RunInfo
from vitlarge.report.metrics_log import FILENAME, records

from . import _tracking
from ._sender import FLUSH_TIMEOUT_S, Sender

if TYPE_CHECKING:
    import wandb

TRACKER = "wandb"


def _new_id() -> str:
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


class WandbHook(_tracking.TrackerHook):
    tracker, title = TRACKER, "W&B"

    def __init__(self, workdir: str, flush_timeout_s: float = FLUSH_TIMEOUT_S):
        super().__init__(workdir, flush_timeout_s)
        self.wandb_run: wandb.Run | None = None

    def _begin(self, run: RunInfo) -> None:
        if not os.environ.get("WANDB_DIR"):
            _tracking.check_inside_workdir(run.workdir, "wandb")
        import wandb  # lazy: W&B, only with log.wandb, off every start-up path

        # Loaded here, before the first step, as hooks.mlflow imports MLflow (a run makes W&B a lazy module until its
        # first attribute: vitlarge.distributed.process.quiet_imports).
        wandb.Settings  # noqa: B018

        self._run = run
        self.project = run.cfg.log.wandb_project or os.environ.get("WANDB_PROJECT") or run.cfg.log.experiment
        self._continued = _tracking.begin(run, TRACKER)
        self.run_id = self._continued.run_id or os.environ.get("WANDB_RUN_ID") or _new_id()
        if not _tracking.RUN_ID.match(self.run_id):
            self.run_id = _new_id()
        if self._continued.run_id is None:  # known before W&B starts: a kill -9 during init still continues it
            _tracking.save_id(run.workdir, run.lineage, TRACKER, self.run_id)
        # Read here, before this segment logs a step: a rewind only where steps past the resumed one were logged.
        self._rewind = self._continued.segment.number > 1 and replays(run.workdir, run.start_step)
        self.sender = Sender("wandb", self._send, what=f"W&B project {self.project}")
        self.sender.put(("start",))

    def _metrics_record(self, step: int, values: dict[str, float]) -> tuple:
        return ("log", step, values)

    def on_export(self, run: RunInfo, path: str) -> None:
        if self.sender is not None:
            self.sender.put(("export", path))

    # On the sender's thread from here.

    def _send(self, batch: list) -> None:
        if self.wandb_run is None:
            self._start()
        r = self.wandb_run
        assert r is not None  # _start set it, or raised
        for rec in batch:
            match rec[0]:
                case "log":
                    r.log(rec[2], step=rec[1])
                case "export":
                    import wandb  # lazy: W&B, only with log.wandb, off every start-up path

                    art = wandb.Artifact(f"{_safe(Path(self.workdir).name)}-model", type="model")
                    art.add_dir(rec[1])
                    r.log_artifact(art)
                    png = Path(self.workdir) / "metrics.png"
                    if png.is_file():
                        r.save(str(png), base_path=self.workdir, policy="now")
                case "end":
                    r.finish(exit_code=0 if rec[1] else 1)

    def _start(self) -> None:
        import wandb  # lazy: W&B, only with log.wandb, off every start-up path

        run, c = self._run, self._continued
        seg = c.segment
        vitlarge = {
            "commit": _tracking.source_commit(),
            "world_size": run.world_size,
            "device": run.device,
            "precision": run.precision,
            "precision_reason": run.precision_why or "set by the config (train.precision)",
            "plugin": run.cfg.train.plugin,
            "line": _tracking.line_key(run.lineage) or "(from scratch)",
            "parent_run": c.parent_id,
        }
        kwargs: dict[str, Any] = dict(
            project=self.project,
            config={**run.record, "vitlarge": vitlarge},
            name=Path(run.workdir).name,
            dir=None if os.environ.get("WANDB_DIR") else run.workdir,
            settings=wandb.Settings(console="off") if "WANDB_CONSOLE" not in os.environ else None,
        )
        if c.parent_id:
            kwargs["notes"] = f"continues W&B run {c.parent_id} from step {run.start_step} (--resume of an older step)"
        if not self._rewind:  # a new run, or a resume after a clean stop: nothing to replace
            self.wandb_run = wandb.init(id=self.run_id, resume="allow", **kwargs)
        else:
            try:  # rewind to the resumed step: the replayed steps replace the killed attempt's
                self.wandb_run = wandb.init(resume_from=f"{self.run_id}?_step={run.start_step}", **kwargs)
            except Exception:  # noqa: BLE001 (a server without rewinding: continue the run, replayed steps dropped)
                self.wandb_run = wandb.init(id=self.run_id, resume="allow", **kwargs)
        self.wandb_run.config.update({f"segment_{seg.name}": seg.record()}, allow_val_change=True)


def replays(workdir: str, start_step: int) -> bool:
    """Whether a run resumed at ``start_step`` logs again steps an earlier attempt logged: metrics.jsonl (read as
    written, every attempt's records) has a ``train`` or ``eval`` record past ``start_step``."""
    try:
        return any(
            r["event"] in ("train", "eval") and r["step"] > start_step for r in records(Path(workdir) / FILENAME)
        )
    except OSError:
        return False


def _safe(name: str) -> str:
    """An artifact name: letters, digits, ``-``, ``_`` and ``.``."""
    return "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in name) or "run"
