"""Observers of a training run, one per file; each implements `vitlarge.events.Hook`.

`build_hooks` is the standard set; the trainer calls each event on the hooks in list order.
"""

from __future__ import annotations

from vitlarge.events import Hook, RunInfo, StopTraining

from .console import ConsoleHook
from .jsonl import JsonlHook, read_metrics
from .mlflow import MlflowHook
from .nan_guard import NanGuardHook
from .plot import PlotHook
from .tensorboard import TensorBoardHook
from .total_batch import TotalBatchHook
from .wandb import WandbHook

__all__ = [
    "Hook",
    "RunInfo",
    "StopTraining",
    "ConsoleHook",
    "JsonlHook",
    "MlflowHook",
    "NanGuardHook",
    "PlotHook",
    "TensorBoardHook",
    "TotalBatchHook",
    "WandbHook",
    "build_hooks",
    "read_metrics",
]


def build_hooks(
    workdir: str,
    *,
    log_every: int,
    nan_patience: int,
    tensorboard: bool = True,
    console: bool = True,
    plot: bool = True,
    mlflow: bool = False,
    wandb: bool = False,
) -> list[Hook]:
    """The default hooks for a run writing under ``workdir``; build the same list on every rank.

    Each hook decides for itself what a non-main rank does (only `NanGuardHook` acts there).
    The NaN guard comes last so the step that stops the run is still logged by the others. ``mlflow``, ``wandb``:
    the trackers (``log.mlflow``, ``log.wandb``), after the picture so that it is drawn when they upload it.
    """
    hooks: list[Hook] = [TotalBatchHook()]
    if console:
        hooks.append(ConsoleHook(log_every))
    hooks.append(JsonlHook(workdir))
    if tensorboard:
        hooks.append(TensorBoardHook(workdir))
    if plot:  # after JsonlHook: it draws what that hook wrote
        hooks.append(PlotHook(workdir))
    if mlflow:
        hooks.append(MlflowHook(workdir))
    if wandb:
        hooks.append(WandbHook(workdir))
    hooks.append(NanGuardHook(nan_patience))
    return hooks
