"""The ``log`` section's checks before the rendezvous: a tracker turned on is installed, and an MLflow tracking URI
is well-formed (a typo would otherwise cost a whole run's metrics: the hooks never stop training)."""

from __future__ import annotations

import importlib.util
import os
import urllib.parse
from collections.abc import Callable

from vitlarge.config.schema import Config
from vitlarge.errors import UserError

# The schemes MLflow's stores take (its tracking-URI grammar): a server, a database through SQLAlchemy, Databricks.
MLFLOW_SCHEMES = ("http", "https", "sqlite", "postgresql", "mysql", "mssql", "databricks", "file")
TRACKERS_FIX = "pip install -r requirements/trackers.txt"


def mlflow_uri_problem(uri: str) -> str | None:
    """Why ``uri`` is not an MLflow tracking URI, or None. Checked before the rendezvous: a typo would otherwise
    cost a whole run's metrics (the hook never stops training, so it would only warn)."""
    if uri == "databricks":
        return None
    try:
        u = urllib.parse.urlsplit(uri)
        _ = u.port  # raises on a port that is not a number or out of range
    except ValueError as e:
        return f"not a URI ({e})"
    scheme = u.scheme.split("+")[0]  # postgresql+psycopg2://
    if not scheme or not uri.startswith(f"{u.scheme}:"):  # host:port parses as scheme "host"
        return "no scheme (http://, sqlite:///...)"
    if scheme not in MLFLOW_SCHEMES:
        return f"scheme '{u.scheme}' is not one of {', '.join(s + '://' for s in MLFLOW_SCHEMES)}"
    if scheme in ("http", "https") and not u.hostname:
        return "an http(s) URI needs a host"
    if scheme == "sqlite" and not u.path.strip("/"):
        return "an sqlite URI needs a file, sqlite:///path/mlflow.db"
    if scheme == "file" and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("true", "1"):
        # MLflow >= 3.13 refuses its file store at runtime (the run would go untracked): refused here instead.
        return "MLflow (>= 3.13) refuses its file store unless MLFLOW_ALLOW_FILE_STORE=true"
    return None


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a finder that refuses it; a module left half-imported
        return False


def check_log(cfg: Config, where: Callable[..., str]) -> None:
    """Trackers turned on must be installed and reachable by a well-formed URI (one line each; the rendezvous
    has not started, so every rank says the same and none waits)."""
    log = cfg.log
    for on, name, key in ((log.mlflow, "mlflow", "log.mlflow"), (log.wandb, "wandb", "log.wandb")):
        if on and not _importable(name):
            raise UserError(
                f"{where(key)}: {key}=true but the {name} package is not installed; {TRACKERS_FIX} or set {key}=false"
            )
    if log.mlflow_uri is not None:
        problem = mlflow_uri_problem(log.mlflow_uri)
        if problem:
            raise UserError(
                f"{where('log.mlflow_uri')}: log.mlflow_uri={log.mlflow_uri!r}: {problem}; set it like "
                "log.mlflow_uri=http://127.0.0.1:5000 or sqlite:///runs/mlflow.db (none: <workdir>/mlflow.db)"
            )
    elif log.mlflow and os.environ.get("MLFLOW_TRACKING_URI"):
        problem = mlflow_uri_problem(os.environ["MLFLOW_TRACKING_URI"])
        if problem:
            raise UserError(
                f"MLFLOW_TRACKING_URI={os.environ['MLFLOW_TRACKING_URI']!r} (used by log.mlflow=true): {problem}; "
                "fix the variable, unset it (<workdir>/mlflow.db) or set log.mlflow_uri"
            )
