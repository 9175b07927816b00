"""Demo: the digits demo's ViT on images of varied aspect ratio, validated rectangular (fast.ai's ``rect_val``).

    python -m data_tools.make_aspect_dataset data/aspect     # a few seconds
    colossalai run --nproc_per_node 2 train.py --config recipes/demo_aspect.py

Hardware: 2 CPU processes (gloo); training takes 0.6x the digits demo's (451 s against 727 s, one after the
other on a shared 2-core AMD EPYC at load average 14; about a minute idle). The data (data_tools/make_aspect_dataset.py):
gray noise, 1:1 to 2.5:1 landscape or portrait, with a band of the class's colour across each end of the
longer side; 4 classes, 2,000 training and 400 validation images. Training is the demo's machinery with
random-resized crops that often hold a band, and is the same whichever crop validates. Validation is
``data.rect_val``: batches of the aspect-sorted split, each cropped to its mean aspect ratio, which keeps the
bands that timm's square centre crop (``val_crop_pct`` 0.875) cuts away. Measured (benchmarks/bench_rect_val.py,
docs/PROGRESSIVE.md#rectangular-validation): 100.00% top-1 rectangular, 46.25% with the square crop, the same
export.
"""

from vitlarge.recipes.demo_digits import config as base


def config():
    c = base()
    c.data.path = "data/aspect"
    c.data.num_classes = 4
    c.data.num_train_examples = 2000
    c.data.crop_scale = (0.25, 1.0)
    c.data.hflip = True  # the bands are symmetric
    c.data.val_crop_pct = 0.875  # timm's and ImageNet's: the square crop keeps 7/8 of the shorter side
    c.data.rect_val = True
    c.train.epochs = 30
    c.train.eval_every_epochs = 10
    c.workdir = "runs/demo_aspect"
    return c
