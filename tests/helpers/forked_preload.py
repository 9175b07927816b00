"""What the forkserver of `tests.helpers.forked` imports once, before it forks any rank: the modules a
training or evaluation run loads (torch, timm, DALI, Colossal-AI's Booster, DCP, every vitlarge and hooks
module), after vitlarge's own warning filters for them, as ``train.py`` sets them before its imports."""

import importlib
import pkgutil

from vitlarge.distributed import launch, quiet

launch.quiet_imports()
quiet.quiet_checkpoint_writer()

import colossalai.booster  # noqa: E402
import matplotlib  # noqa: E402

matplotlib.use("Agg")  # as vitlarge.report.plot selects it before pyplot

import colossalai.booster.plugin  # noqa: E402,F401
import matplotlib.pyplot  # noqa: E402,F401
import nvidia.dali.plugin.pytorch  # noqa: E402,F401
import timm  # noqa: E402,F401
import torch.distributed.checkpoint  # noqa: E402,F401
import torch.utils.tensorboard  # noqa: E402,F401

import hooks  # noqa: E402
import vitlarge  # noqa: E402

for package in (vitlarge, hooks):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
