"""The run in MLflow (``log.mlflow=true``): one MLflow run per checkpoint line, written off the training thread.

Main rank only. Tracking URI: ``log.mlflow_uri``, else ``MLFLOW_TRACKING_URI``, else ``sqlite:///<workdir>/mlflow.db``
(artifacts of an SQLite store beside it, in ``<workdir>/mlartifacts``). Experiment: ``log.experiment`` (the recipe's
name unless set). Through `mlflow.MlflowClient` with explicit run ids (no global active run), on `hooks._sender`'s
thread: a tracker that is down or slow costs one warning line, never a step (docs/LOGS.md, "Experiment trackers").

* parameters: every resolved config key (``train.global_batch``...), values cut at 500 characters; a resume whose
  config differs keeps the first values (MLflow's parameters cannot change) and tags the segment with the edits;
* tags: ``vitlarge.commit``, ``vitlarge.world_size``, ``vitlarge.device``, ``vitlarge.precision`` and
  ``vitlarge.precision_reason``, ``vitlarge.plugin``, and ``vitlarge.segment.<nnn>`` per process start (``001``...;
  JSON: start step, world size, reason); ``mlflow.parentRunId`` on a run a ``--resume`` of an older step started;
* metrics at the optimizer step, named as metrics.jsonl names them: every numeric field of a ``train`` record
  (``train_loss``, ``lr``, ``grad_norm``, ``loss_scale``, ``images_per_s``, ``data_time``, ``peak_mem_bytes``,
  ``skipped``...) and of an ``eval`` record (``val_top1``, ``val_top5``, ``val_loss`` and the EMA's);
* artifacts at the end: the timm export (``model/``) and ``metrics.png``.

At its start the run is named in one line: its id, experiment and store, and where its artifacts go.

The workdir's own store (no ``log.mlflow_uri`` nor ``MLFLOW_TRACKING_URI``) is data from elsewhere once the workdir is
handed over, so it stays inside the workdir and names no destination: ``mlflow.db``, SQLite's files beside it and
``mlartifacts`` must resolve inside the workdir (a planted link stops the run in one line, as ``tb`` does), and the
run's artifact location, which the database records, must be a folder under ``<workdir>/mlartifacts`` without links in
it. A location elsewhere (a workdir moved, or one whose database was edited: ``file:///elsewhere``, a server) is
refused in one warning line and the run is not tracked in MLflow; training goes on. A store the user names
(``log.mlflow_uri``, ``MLFLOW_TRACKING_URI``) keeps its artifacts where its experiment says, named in the start line.
A new workdir store's ``Default`` experiment keeps its artifacts in ``<workdir>/mlartifacts/0`` (MLflow's default
would be ``./mlruns`` in whatever folder the run started from).

A saved run id the store does not know (the run deleted, the store reset, the workdir moved to a machine whose store
has the same URI) starts a new run for the line: tag ``vitlarge.lost_run`` (the old id), segment reason ``lost``,
one warning line.

Steps replayed after a kill -9 (between the last checkpoint and the kill) are logged again at the same steps:
MLflow keeps both values, the later timestamp is the resumed run's (what `read_metrics` keeps).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING

from vitlarge import fileio
from vitlarge.events import RunInfo

from . import _tracking
from ._sender import FLUSH_TIMEOUT_S, Sender

if TYPE_CHECKING:
    from mlflow import MlflowClient  # lazy: MLflow, only with log.mlflow, off every start-up path

TRACKER = "mlflow"
STORE_FILE = "mlflow.db"
ARTIFACTS_DIR = "mlartifacts"
WORKDIR_NAMES = (STORE_FILE, f"{STORE_FILE}-journal", f"{STORE_FILE}-wal", f"{STORE_FILE}-shm", ARTIFACTS_DIR)
"""What the workdir's own store creates by name: the database, SQLite's journal, write-ahead log and shared memory
beside it, and the artifacts folder."""


def tracking_uri(uri: str | None, workdir: str) -> str:
    """The store a run writes to (see the module docstring)."""
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(workdir).absolute() / STORE_FILE}"


def local_path(uri: str) -> Path | None:
    """The folder an artifact location names on this machine (``file:`` URIs and plain paths), else None."""
    u = urllib.parse.urlsplit(uri)
    if u.scheme == "file" and u.netloc in ("", "localhost"):
        return Path(urllib.parse.unquote(u.path))
    return Path(uri) if not u.scheme and uri.startswith("/") else None


class _Refused(Exception):
    """The workdir's store sends artifacts outside the workdir: the message is the one line that says so."""


class MlflowHook(_tracking.TrackerHook):
    tracker, title = TRACKER, "MLflow"

    def __init__(self, workdir: str, flush_timeout_s: float = FLUSH_TIMEOUT_S):
        super().__init__(workdir, flush_timeout_s)
        self.run_id: str | None = None
        self._lost: str | None = None  # the line's saved run id when the store does not know it
        self._lost_said = False
        self._refused = False  # the store's artifact location is outside the workdir: nothing is sent
        self.artifact_uri = ""
        self._link_said = False
        self.own_store = True
        """The workdir's own store (not named by ``log.mlflow_uri`` or ``MLFLOW_TRACKING_URI``): kept inside it."""

    def _begin(self, run: RunInfo) -> None:
        self.own_store = not (run.cfg.log.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI"))
        if self.own_store:
            _tracking.check_inside_workdir(run.workdir, *WORKDIR_NAMES)
        # A server that is down must fail a request at once, not after MLflow's default 7 retries with backoff.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        # Imported here, before the first step, as TensorBoard's writer is (a few seconds): on the sender's thread it
        # would hold the first records back while the steps go on, and a kill -9 then loses them.
        import mlflow  # noqa: F401  lazy: MLflow, only with log.mlflow, off every start-up path

        self.uri = tracking_uri(run.cfg.log.mlflow_uri, run.workdir)
        self._run = run
        self._continued = _tracking.begin(run, TRACKER, same_store={"uri": self.uri})
        self._client: MlflowClient | None = None
        self.sender = Sender("mlflow", self._send, what=self.uri)
        self.sender.put(("start",))

    def _metrics_record(self, step: int, values: dict[str, float]) -> tuple:
        return ("metrics", step, values, _now_ms())

    def on_export(self, run: RunInfo, path: str) -> None:
        if self.sender is None:
            return
        self.sender.put(("artifacts", path, "model"))
        png = Path(self.workdir) / "metrics.png"
        if png.is_file():
            self.sender.put(("artifact", str(png)))

    # On the sender's thread from here.

    def _send(self, batch: list) -> None:
        from mlflow.entities import Metric  # lazy: MLflow, only with log.mlflow, off every start-up path

        if "MLFLOW_LOGGING_LEVEL" not in os.environ:  # its INFO lines (creating a database...) are not the run's
            logging.getLogger("mlflow").setLevel(logging.WARNING)

        if self._refused:
            return  # its one line said so: this run is not tracked in MLflow
        if self.run_id is None:
            try:
                self._start()
            except _Refused as e:
                self._refused = True
                _tracking.log.warning(str(e))
                return
        client, run_id = self._started()
        metrics = []
        for rec in batch:
            match rec[0]:
                case "start":
                    pass
                case "metrics":
                    _, step, values, ms = rec
                    metrics += [Metric(k, v, ms, step) for k, v in values.items()]
                case "artifacts":
                    self._flush(metrics)
                    metrics = []
                    if self._destination_safe():
                        client.log_artifacts(run_id, rec[1], rec[2])
                case "artifact":
                    self._flush(metrics)
                    metrics = []
                    if self._destination_safe():
                        client.log_artifact(run_id, rec[1])
                case "end":
                    self._flush(metrics)
                    metrics = []
                    client.set_terminated(run_id, "FINISHED" if rec[1] else "KILLED")
        self._flush(metrics)

    def _started(self) -> tuple[MlflowClient, str]:
        """The client and the run's id, which `_start` sets (or raises)."""
        assert self._client is not None and self.run_id is not None
        return self._client, self.run_id

    def _flush(self, metrics: list) -> None:
        client, run_id = self._started()
        for i in range(0, len(metrics), 1000):  # MLflow's MAX_METRICS_PER_BATCH
            client.log_batch(run_id, metrics=metrics[i : i + 1000], synchronous=True)

    def _start(self) -> None:
        """Creates the run (or finds the one this line has) and records this segment."""
        from mlflow import MlflowClient  # lazy: MLflow, only with log.mlflow, off every start-up path
        from mlflow.entities import Param, RunTag  # lazy: MLflow, only with log.mlflow, off every start-up path

        if self._client is None:
            if self.own_store:
                self._new_store()
            self._client = MlflowClient(tracking_uri=self.uri)
        client = self._client
        c = self._continued
        if c.run_id is not None and not self._known(client, c.run_id):  # deleted, or a reset store under the same URI
            self._lost = c.run_id
            c = self._continued = dataclasses.replace(
                c, run_id=None, segment=dataclasses.replace(c.segment, reason="lost")
            )
        run = self._run
        run_id = c.run_id or self._find_by_token(client, c.token)
        if run_id is None:
            name = experiment(run)
            exp = client.get_experiment_by_name(name)
            if exp is None:
                location = None
                if self.uri.startswith("sqlite:///"):  # not MLflow's ./mlruns in whatever folder the run started from
                    location = (Path(self.uri[len("sqlite:///") :]).parent / "mlartifacts").absolute().as_uri()
                exp_id = client.create_experiment(name, artifact_location=location)
            else:
                exp_id = exp.experiment_id
                if self.own_store:  # before a run is made there
                    self._check_location(exp.artifact_location)
            tags = {
                "vitlarge.token": c.token,
                "vitlarge.line": _tracking.line_key(run.lineage) or "(from scratch)",
                "vitlarge.workdir": str(Path(run.workdir).absolute()),
            }
            if c.parent_id:
                tags["mlflow.parentRunId"] = c.parent_id
            if self._lost:
                tags["vitlarge.lost_run"] = self._lost
            run_name = Path(run.workdir).name + (f"-from-step-{run.start_step}" if c.parent_id else "")
            run_id = client.create_run(exp_id, tags=tags, run_name=run_name).info.run_id
        else:
            if self.own_store:  # before it is marked running again
                self._check_location(client.get_run(run_id).info.artifact_uri or "")
            client.update_run(run_id, status="RUNNING")
        found = client.get_run(run_id)
        where = self.artifact_uri = found.info.artifact_uri or ""
        if self.own_store:
            self._check_location(where)
        _tracking.save_id(run.workdir, run.lineage, TRACKER, run_id)
        self._continued = dataclasses.replace(c, run_id=run_id)  # a start that fails below is retried on this run
        if self._lost and not self._lost_said:
            self._lost_said = True
            _tracking.log.warning(
                f"warning: mlflow: run {self._lost} of this line is not in {self.uri} (deleted, or another store under "
                f"the same URI); run {run_id} continues the line (tag vitlarge.lost_run)"
            )

        params = _tracking.flat_params(run.record)
        logged = found.data.params
        edits = {k: f"{logged[k]} -> {v}" for k, v in params.items() if k in logged and logged[k] != v}
        new = [Param(k, v) for k, v in params.items() if k not in logged]
        seg = c.segment.record()
        if edits:
            seg["edited"] = edits
        tags = {
            "vitlarge.commit": _tracking.source_commit(),
            "vitlarge.world_size": str(run.world_size),
            "vitlarge.device": run.device,
            "vitlarge.precision": run.precision,
            "vitlarge.precision_reason": run.precision_why or "set by the config (train.precision)",
            "vitlarge.plugin": run.cfg.train.plugin,
            f"vitlarge.segment.{c.segment.name}": json.dumps(seg)[:7900],
        }
        for i in range(0, len(new), 100):  # MLflow's MAX_PARAMS_TAGS_PER_BATCH
            client.log_batch(run_id, params=new[i : i + 100], synchronous=True)
        client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()], synchronous=True)
        self.run_id = run_id  # started: parameters and tags written (a partial start is tried again by the next batch)
        name = client.get_experiment(found.info.experiment_id).name
        _tracking.log.info(f"mlflow: run {run_id} (experiment {name}) in {self.uri}; artifacts to {where}")

    def _new_store(self) -> None:
        """The workdir's store, on its first open: MLflow's tables and its ``Default`` experiment, whose artifacts
        go to ``<workdir>/mlartifacts/0`` (see the module docstring). Nothing when the database is there."""
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore  # lazy: MLflow, only with log.mlflow

        if (Path(self.workdir) / STORE_FILE).exists():
            return
        SqlAlchemyStore(self.uri, (Path(self.workdir).absolute() / ARTIFACTS_DIR).as_uri()).engine.dispose()

    def _check_location(self, where: str) -> None:
        """`_Refused` unless ``where`` (the run's artifact location, as the workdir's database records it) is a
        folder under ``<workdir>/mlartifacts``: never a destination taken from a file."""
        root = Path(self.workdir).absolute() / ARTIFACTS_DIR
        local = local_path(where)
        if local is not None and fileio.is_inside(local, root):
            return
        raise _Refused(
            f"warning: mlflow: {Path(self.workdir).absolute() / STORE_FILE} sends this run's artifacts to {where}, "
            f"outside {root} (a workdir moved, or its database edited); refused: this run is not tracked in MLflow, "
            f"training goes on; move {STORE_FILE} aside to start a new store here, or name the store in "
            "log.mlflow_uri to use that location"
        )

    def _destination_safe(self) -> bool:
        """Whether artifacts may be written under the run's artifact folder: a store the user named, or the
        workdir's with no link in that folder (one planted there would take a copy elsewhere); else one line."""
        if not self.own_store:
            return True
        folder = local_path(self.artifact_uri)
        assert folder is not None  # `_check_location` passed
        for top, dirs, files in os.walk(folder):
            for name in dirs + files:
                if os.path.islink(os.path.join(top, name)):
                    if not self._link_said:
                        self._link_said = True
                        _tracking.log.warning(
                            f"warning: mlflow: {os.path.join(top, name)} is a link; this run's artifacts are not sent "
                            "(remove it, then log them with MlflowClient.log_artifacts)"
                        )
                    return False
        return True

    def _known(self, client: MlflowClient, run_id: str) -> bool:
        """Whether the store has the run ``run_id`` (not deleted); other failures (the server down) raise."""
        from mlflow.exceptions import MlflowException  # lazy: MLflow, only with log.mlflow, off every start-up path

        try:
            return client.get_run(run_id).info.lifecycle_stage != "deleted"
        except MlflowException as e:
            if e.error_code == "RESOURCE_DOES_NOT_EXIST":
                return False
            raise

    def _find_by_token(self, client: MlflowClient, token: str) -> str | None:
        """The run a process killed before saving its id had created (its token tag), or None."""
        exp = client.get_experiment_by_name(experiment(self._run))
        if exp is None:
            return None
        found = client.search_runs([exp.experiment_id], f"tags.`vitlarge.token` = '{token}'", max_results=1)
        return found[0].info.run_id if found else None


def experiment(run: RunInfo) -> str:
    """``log.experiment``, which loading the config sets (the recipe's name unless given)."""
    name = run.cfg.log.experiment
    assert name is not None, "log.experiment is set when the config loads"
    return name


def _now_ms() -> int:
    return int(time.time() * 1000)
