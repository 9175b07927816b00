"""What the tracker hooks share: one tracked run per checkpoint line, kept in ``<workdir>/trackers.json``.

Contract:

* ``trackers.json`` maps each checkpoint line (`RunInfo.lineage`; ``""`` for the line started from scratch) and
  tracker (``mlflow``, ``wandb``) to the tracked run's id, the segments it has had and, for a line started by a
  ``--resume`` of another line's checkpoint, that line's run (the parent). Written with `fileio.write_atomic`
  by the main rank only; read back as data (at most `STATE_MAX_BYTES`, every id checked against `RUN_ID`), never
  inferred from a name. A file that fails the check is one warning line and a new tracked run.
* Every process start of the main rank with a tracker on is one segment: its number, start step, world size and
  reason (`Segment`), which each tracker records on its run.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import vitlarge
from vitlarge import fileio
from vitlarge.errors import UserError
from vitlarge.events import EvalMetrics, Hook, RunInfo, StepMetrics

from ._sender import FLUSH_TIMEOUT_S, Sender

log = logging.getLogger("vitlarge")

STATE_FILE = "trackers.json"
STATE_MAX_BYTES = 1 << 20
RUN_ID = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
"""MLflow's run ids are 32 hex digits, W&B's 8 characters of [a-z0-9] (``WANDB_RUN_ID`` may set others)."""
TOKEN = re.compile(r"^[0-9a-f]{32}$")
PARAM_MAX_CHARS = 500
"""A parameter's value is cut here: MLflow servers before 2.x refused longer values (3.x takes 6,000)."""

_lock = threading.Lock()  # the MLflow and W&B senders both write the file


@dataclass(frozen=True)
class Segment:
    """One process start of a tracked run."""

    number: int
    """1 for the run's first start, then 2, 3, ... across resumes and requeues."""
    start_step: int
    world_size: int
    reason: str
    """``start``, ``restart`` (again from step 0: killed before its first checkpoint), ``resume``, ``requeue``
    (``SLURM_RESTART_COUNT`` > 0), ``resume-from`` (the first segment of a line a ``--resume`` started); `hooks.mlflow`
    sets ``lost`` on the first segment of a run that replaced one its store no longer has."""
    time: str

    @property
    def name(self) -> str:
        """The number as tag and config keys carry it (``vitlarge.segment.002``): zero-padded, so they sort in order."""
        return f"{self.number:03d}"

    def record(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Continued:
    """What `begin` decided for one tracker: the run to continue (None: create one), its parent, the segment."""

    run_id: str | None
    parent_id: str | None
    token: str
    """Unique per tracked run, set as a tag/config value when it is created: a process killed between creating
    the run and saving its id finds it again by this token."""
    saved: dict
    """The tracker's entry as saved (its ``uri`` or ``project``...)."""
    segment: Segment


def line_key(line: str | None) -> str:
    return line or ""


def _valid_entry(entry: Any) -> bool:
    if not isinstance(entry, dict):
        return False
    rid, token, seg = entry.get("id"), entry.get("token"), entry.get("segments", 0)
    return (
        (rid is None or (isinstance(rid, str) and bool(RUN_ID.match(rid))))
        and isinstance(token, str)
        and bool(TOKEN.match(token))
        and isinstance(seg, int)
        and not isinstance(seg, bool)
        and 0 <= seg < 10**6
        and all(isinstance(v, (str, int, type(None))) for v in entry.values())
    )


def read_state(workdir: str | Path) -> dict:
    """``{"lines": {line: {tracker: entry}}}`` from ``trackers.json`` (empty when there is none); a malformed file
    or entry is one warning line and left out."""
    path = Path(workdir) / STATE_FILE
    empty: dict = {"lines": {}}
    try:
        data = json.loads(fileio.read_capped(path, STATE_MAX_BYTES, follow=False))
    except FileNotFoundError:
        return empty
    except (OSError, ValueError, RecursionError) as e:
        log.warning(f"warning: {path} is unreadable ({getattr(e, 'strerror', None) or e}); new tracked runs start")
        return empty
    lines = data.get("lines") if isinstance(data, dict) else None
    if not isinstance(lines, dict):
        log.warning(f"warning: {path} holds no 'lines' map; new tracked runs start")
        return empty
    out: dict = {}
    for line, trackers in lines.items():
        if not isinstance(trackers, dict):
            continue
        good = {t: e for t, e in trackers.items() if isinstance(t, str) and _valid_entry(e)}
        if len(good) < len(trackers):
            log.warning(f"warning: {path}: a malformed entry of line {line[:200]!r} left out; a new tracked run starts")
        out[line] = good
    return {"lines": out}


def _write_state(workdir: str | Path, state: dict) -> None:
    fileio.write_atomic(Path(workdir) / STATE_FILE, json.dumps(state, indent=1, sort_keys=True), root=workdir)


def begin(run: RunInfo, tracker: str, same_store: dict | None = None) -> Continued:
    """Main rank, train start: the run ``tracker`` continues on this line and this start's `Segment`; records the
    segment. ``same_store``: values the saved entry must match to be continued (an MLflow URI: a run id of another
    store would not be found); a mismatch starts a new tracked run."""
    with _lock:
        state = read_state(run.workdir)
        key = line_key(run.lineage)
        entries = state["lines"].setdefault(key, {})
        saved = entries.get(tracker)
        if saved is not None and same_store and any(saved.get(k) != v for k, v in same_store.items()):
            saved = None
        parent = None
        if saved is None:
            if run.start_step == 0:
                reason = "start"
            elif line_key(run.parent_lineage) != key:
                reason = "resume-from"
                if _in_checkpoints(run.workdir, key):  # another workdir's lines are not in this trackers.json
                    parent = state["lines"].get(line_key(run.parent_lineage), {}).get(tracker, {}).get("id")
            else:
                reason = "resume"
            saved = {"id": None, "token": uuid.uuid4().hex, "segments": 0, "parent": parent, **(same_store or {})}
        elif run.start_step == 0:
            reason = "restart"
        else:
            restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
            reason = "requeue" if restarts.isdigit() and int(restarts) > 0 else "resume"
        saved["segments"] += 1
        entries[tracker] = saved
        segment = Segment(
            number=saved["segments"],
            start_step=run.start_step,
            world_size=run.world_size,
            reason=reason,
            time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        )
        _write_state(run.workdir, state)
        return Continued(saved["id"], saved.get("parent"), saved["token"], dict(saved), segment)


def _in_checkpoints(workdir: str, checkpoint: str) -> bool:
    """Whether ``checkpoint`` (a line: the path a ``--resume`` named) is in this workdir's ``checkpoints/``."""
    try:
        return Path(checkpoint).resolve().is_relative_to((Path(workdir) / "checkpoints").resolve())
    except (OSError, RuntimeError):  # a link loop
        return False


def save_id(workdir: str, line: str | None, tracker: str, run_id: str) -> None:
    """Records the tracked run's id once the tracker made it (from a sender's thread)."""
    if not RUN_ID.match(run_id):
        raise ValueError(f"{tracker} run id {run_id[:80]!r} does not look like one")
    with _lock:
        state = read_state(workdir)
        entry = state["lines"].setdefault(line_key(line), {}).get(tracker)
        if entry is None:
            return
        entry["id"] = run_id
        _write_state(workdir, state)


def flat_params(cfg_dict: dict) -> dict[str, str]:
    """Every resolved config key as ``section.key`` -> text (JSON for lists, tuples and dicts), cut at
    `PARAM_MAX_CHARS`."""
    out = {}
    for section, values in cfg_dict.items():
        items = values.items() if isinstance(values, dict) else [(None, values)]
        for name, value in items:
            key = f"{section}.{name}" if name is not None else section
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            out[key] = text if len(text) <= PARAM_MAX_CHARS else text[: PARAM_MAX_CHARS - 3] + "..."
    return out


def numbers(record: dict) -> dict[str, float]:
    """The numeric fields of a metrics.jsonl record (booleans as 0/1; None and ``step`` left out)."""
    out = {}
    for k, v in record.items():
        if k == "step" or v is None or isinstance(v, str):
            continue
        if isinstance(v, (bool, int, float)):
            out[k] = float(v)
    return out


def check_inside_workdir(workdir: str | Path, *names: str) -> None:
    """A one-line `UserError` unless each of ``names`` under the workdir, where it exists, resolves inside it
    (`fileio.check_inside`): a link planted in a handed-over workdir (``mlflow.db -> elsewhere``) would carry the
    tracker's files out of it. The run stops, as for a planted ``tb`` link (`hooks.tensorboard`)."""
    for name in names:
        path = Path(workdir) / name
        try:
            fileio.check_inside(path, workdir)
        except fileio.UnsafeFile as e:
            raise UserError(f"{path}: {e.strerror}; remove the link and run again") from None


def warn_off(tracker: str, title: str, e: BaseException) -> None:
    """The one line of a tracker that could not start: this run is not tracked there, training goes on."""
    why = " ".join(str(e).split())[:300]
    log.warning(
        f"warning: {tracker}: cannot start ({type(e).__name__}{': ' + why if why else ''}); this run is not tracked "
        f"in {title}, training goes on without it"
    )


def source_commit() -> str:
    """The git commit of the vitlarge checkout this runs from (read from ``.git``, no process started), else
    ``vitlarge <version>`` (an installed wheel)."""
    root = Path(vitlarge.__file__).resolve().parent.parent
    version = f"vitlarge {vitlarge.__version__}"
    try:
        git = root / ".git"
        if git.is_file():  # a worktree: "gitdir: <path>"
            git = Path(git.read_text()[:4096].split(":", 1)[1].strip())
        head = (git / "HEAD").read_text()[:4096].strip()
        if not head.startswith("ref: "):
            return head
        ref = head[5:]
        for base in (git, Path((git / "commondir").read_text().strip()) if (git / "commondir").exists() else git):
            base = base if base.is_absolute() else git / base
            if (base / ref).is_file():
                return (base / ref).read_text()[:100].strip()
            packed = base / "packed-refs"
            if packed.is_file():
                for line in packed.read_text()[: 1 << 20].splitlines():
                    if line.endswith(" " + ref):
                        return line.split()[0]
    except (OSError, IndexError):
        pass
    return version


class TrackerHook(Hook):
    """What the MLflow and W&B hooks share: the main rank only; `_begin` at train start, where any failure (a
    broken install, an unwritable trackers.json) turns this tracker off in one line and training goes on, but a
    `UserError` (the workdir at fault: a planted link) stops the run in one line; each
    step's and evaluation's numbers queued for the sender as `_metrics_record` makes them; at close the run ended
    (``("end", finished)``: the final evaluation happened, or not) and a bounded flush."""

    tracker: str  # the name in its lines and in trackers.json
    title: str  # the product's name in the line that turns it off

    def __init__(self, workdir: str, flush_timeout_s: float = FLUSH_TIMEOUT_S):
        self.workdir = workdir
        self.flush_timeout_s = flush_timeout_s
        self.sender: Sender | None = None
        self._finished = False

    def _begin(self, run: RunInfo) -> None:
        raise NotImplementedError

    def _metrics_record(self, step: int, values: dict[str, float]) -> tuple:
        raise NotImplementedError

    def on_train_start(self, run: RunInfo) -> None:
        if not run.is_main:
            return
        try:
            self._begin(run)
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001
            self.sender = None
            warn_off(self.tracker, self.title, e)

    def on_step_end(self, run: RunInfo, m: StepMetrics) -> None:
        if self.sender is not None:
            self.sender.put(self._metrics_record(m.step, numbers(m.record())))

    def on_eval_end(self, run: RunInfo, m: EvalMetrics) -> None:
        if self.sender is not None:
            self.sender.put(self._metrics_record(m.step, numbers(m.record())))

    def on_train_end(self, run: RunInfo, summary: EvalMetrics) -> None:
        self._finished = True

    def on_close(self, run: RunInfo) -> None:
        if self.sender is None:
            return
        self.sender.put(("end", self._finished))
        self.sender.close(self.flush_timeout_s)
        self.sender = None
