"""Evaluation forwards (vitlarge.data.loader.val_forwards): every rank runs the same number.

Under fsdp every forward is collective, so every rank must run the same number of evaluation
forwards. A loader that skipped DALI's padding-only runs made a rank whose slice is a whole number
of batches run one forward fewer than a rank holding one more record, and the collective hung.
The multi-process evaluations are in tests/e2e/test_evaluate.py.
"""

import math

import pytest

IMAGENET_VAL = 50_000


@pytest.mark.parametrize("world_size", [*range(1, 10), 71, 130, 156])
def test_every_rank_runs_the_same_number_of_forwards_on_imagenet_val(world_size):
    from vitlarge.data.loader import val_forwards
    from vitlarge.data.pipelines import shard_range

    mb = 64
    forwards = val_forwards(IMAGENET_VAL, world_size, mb)  # what ValLoader.masked gives every rank
    real = [shard_range(IMAGENET_VAL, r, world_size) for r in range(world_size)]
    real = [end - begin for begin, end in real]
    assert sum(real) == IMAGENET_VAL
    assert all(math.ceil(n / mb) <= forwards for n in real)  # every real record fits the forwards
    skipped = {math.ceil(n / mb) for n in real}  # the old count: padding-only runs skipped
    if world_size in (71, 130, 156):  # slices of two sizes: 11/12, 6/7, 5/6 forwards
        assert len(skipped) == 2 and max(skipped) == forwards


def test_rectangular_batches_run_a_compiled_model_eagerly_with_the_same_numbers():
    """A batch shape per chunk would compile a graph per shape (a few dozen per ImageNet pass): a loader whose
    ``rect`` is true is evaluated with the compiled model run eagerly, and gives the eager model's numbers."""
    import torch
    from torch._dynamo.testing import CompileCounter

    from vitlarge.model.precision import Precision
    from vitlarge.train.validation import evaluate

    class Net(torch.nn.Module):  # a module of its own: Dynamo does not trace torch.nn's own forwards at the top
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(12, 7)

        def forward(self, x):
            return self.head(torch.nn.functional.adaptive_avg_pool2d(x, 2).flatten(1))

    class Rect(list):
        rect = True

    torch.manual_seed(0)
    model, fp32 = Net(), Precision("fp32", torch.device("cpu"))
    batches = Rect((torch.randn(3, 3, 8, w), torch.tensor([0, 1, 2])) for w in (8, 12, 16, 20))
    eager = evaluate(model, batches, fp32)
    compiled = CompileCounter()
    model.compile(backend=compiled, dynamic=False)
    assert evaluate(model, batches, fp32) == eager and compiled.frame_count == 0
    evaluate(model, list(batches), fp32)  # the same batches from a square loader: one graph per shape
    assert compiled.frame_count == 4


def test_logits_taken_at_the_classes_indices_score_as_a_model_of_those_outputs():
    """``evaluate(..., classes)`` (a data set of some of the model's classes, `vitlarge.data.class_map`): the
    numbers of a model whose classifier holds only those rows, in that order."""
    import torch

    from vitlarge.model.precision import Precision
    from vitlarge.train.validation import evaluate

    torch.manual_seed(0)
    full = torch.nn.Linear(8, 5)
    rows = [4, 0, 2]
    part = torch.nn.Linear(8, 3)
    part.weight.data, part.bias.data = full.weight.data[rows], full.bias.data[rows]
    batches = [(torch.randn(16, 8), torch.randint(0, 3, (16,))) for _ in range(3)]
    cpu = Precision("fp32", torch.device("cpu"))
    assert evaluate(full, batches, cpu, classes=rows) == evaluate(part, batches, cpu)
    assert evaluate(full, batches, cpu) != evaluate(part, batches, cpu)  # scored by index: other numbers
