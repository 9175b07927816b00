"""What the forkserver of `tests.helpers.forked` imports once, before it forks any rank: the modules a
training or evaluation run loads (torch, timm, DALI, Colossal-AI's Booster, DCP, every vitlarge and hooks
module), after vitlarge's own warning filters for them, as ``train.py`` sets them before its imports."""

import gc
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


def _warm_caches() -> None:
    """Work every forked rank would otherwise repeat, done once here: DALI's AutoGraph conversion of the training
    pipeline's code (cached per code object; about 0.4-2 s per rank and loader build) for each branch the recipes
    take, and matplotlib's font and text caches (the plot hook's first figure, about 0.7 s). Nothing here starts a
    thread or builds a DALI pipeline (no backend), so forking afterwards stays safe."""
    import io

    from nvidia.dali import types

    from vitlarge.data import pipelines, randaugment

    base = dict(
        shard_id=0,
        num_shards=1,
        reader_seed=1,
        file_order_seed=1,
        image_size=16,
        decoder="cpu",
        crop_scale=(0.6, 1.0),
        crop_ratio=(0.8, 1.25),
        hflip=True,
        randaugment=None,
        mean=[0.5] * 3,
        std=[0.5] * 3,
        initial_fill=16,
        interp=types.INTERP_LINEAR,
        batch_size=2,
        num_threads=1,
        device_id=None,
        seed=1,
    )
    variants = [
        {},
        {"randaugment": randaugment.spec("rand-m9-mstd0.5-inc1")},
        {"crop": "src", "three_augment": True, "color_jitter": 0.3},
    ]
    for extra in variants:
        try:
            pipelines.train_pipeline(["/nonexistent"], ["/nonexistent.idx"], **{**base, **extra})
        except Exception:  # noqa: BLE001 - a cache left cold only costs the ranks their own conversion
            pass

    fig, ax = matplotlib.pyplot.subplots(2, 2)
    ax[0, 0].plot([0, 1], [0, 1], label="x")
    ax[0, 0].legend()
    fig.suptitle("warm")
    fig.tight_layout()
    fig.savefig(io.BytesIO(), dpi=50, format="png")
    matplotlib.pyplot.close(fig)


_warm_caches()
gc.freeze()  # what the ranks inherit is never traversed by their collections (vitlarge collects at phase changes)
