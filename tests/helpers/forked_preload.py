"""What the forkserver of `tests.helpers.forked` imports once, before it forks any rank: the modules a
training or evaluation run loads (torch, timm, DALI, Colossal-AI's Booster, DCP, every vitlarge and hooks
module), after vitlarge's own warning filters for them, as ``train.py`` sets them before its imports.

Nothing here may fail silently: multiprocessing's forkserver swallows an ImportError from a preload module
(every rank would then import on its own: green, but slow) and dies on any other exception. So everything
is caught and kept in `ERROR`; `tests.helpers.forked.context` asks a forked probe for it and fails the session
with this traceback. `READY` says the preload ran to its end.
"""

import gc
import sys
import traceback

ERROR = ""
READY = False


def _preload() -> None:
    import importlib
    import pkgutil

    # The suite's contract (conftest.py): a deprecation is an error in every process a test starts.
    if "error::DeprecationWarning" not in sys.warnoptions:
        raise RuntimeError(
            f"the forkserver started without PYTHONWARNINGS' error filters (sys.warnoptions={sys.warnoptions})"
        )
    from vitlarge.distributed import process, quiet

    process.quiet_imports()
    quiet.quiet_checkpoint_writer()

    import matplotlib

    matplotlib.use("Agg")  # as vitlarge.report.plot selects it before pyplot
    import matplotlib.pyplot  # noqa: F401
    import nvidia.dali.plugin.pytorch  # noqa: F401
    import timm  # noqa: F401
    import torch.distributed.checkpoint  # noqa: F401
    import torch.utils.tensorboard  # noqa: F401

    import hooks
    import vitlarge
    from vitlarge.distributed import booster

    booster.load()  # Colossal-AI's Booster, as a run imports it

    for package in (vitlarge, hooks):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if not info.name.endswith("__main__"):
                importlib.import_module(info.name)
    _warm_caches()


def _warm_caches() -> None:
    """Work every forked rank would otherwise repeat, done once here: DALI's AutoGraph conversion of the training
    pipeline's code (cached per code object; about 0.4-2 s per rank and loader build) for each branch the recipes
    take, and matplotlib's font and text caches (the plot hook's first figure, about 0.7 s). Nothing here starts a
    thread or builds a DALI pipeline (no backend), so forking afterwards stays safe."""
    import io
    import os
    import warnings

    import matplotlib.pyplot as plt

    from vitlarge.data import pipelines
    from vitlarge.data.spec import TrainSpec

    base = dict(data_dir="", batch_size=2, image_size=16, seed=1, crop_scale=(0.6, 1.0), crop_ratio=(0.8, 1.25))
    base.update(mean=(0.5,) * 3, std=(0.5,) * 3, initial_fill=16, num_threads=1)
    variants = [
        {},
        {"randaugment": "rand-m9-mstd0.5-inc1"},
        {"crop": "src", "three_augment": True, "color_jitter": 0.3},
    ]
    # DALI's RandAugment names its own deprecated fn.experimental aliases and forces those warnings on (see
    # vitlarge/data/loader.py): kept off the server's stderr, which is the capture of whichever test started it.
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull, warnings.catch_warnings():
        os.dup2(devnull.fileno(), 2)
        try:
            for extra in variants:
                spec = TrainSpec(**{**base, **extra})
                pipelines.train_pipeline(
                    spec,
                    [("/nonexistent", "/nonexistent.idx")],
                    shard_id=0,
                    num_shards=1,
                    decoder="cpu",
                    batch_size=2,
                    num_threads=1,
                    device_id=None,
                    seed=1,
                )
        finally:
            os.dup2(saved, 2)
            os.close(saved)

    fig, ax = plt.subplots(2, 2)
    ax[0, 0].plot([0, 1], [0, 1], label="x")
    ax[0, 0].legend()
    fig.suptitle("warm")
    fig.tight_layout()
    fig.savefig(io.BytesIO(), dpi=50, format="png")
    plt.close(fig)


try:
    _preload()
    READY = True
except BaseException:  # noqa: BLE001 - reported by tests.helpers.forked.context, with this traceback
    ERROR = traceback.format_exc()
gc.freeze()  # what the ranks inherit is never traversed by their collections (vitlarge collects at phase changes)
