"""Phased loaders (vitlarge.data.phased.PhasedLoaders): rebuilt at a phase boundary at the phase's sizes.

Real DALI pipelines on the demo digits, one process: a phase's loader state continues it bitwise, a
state from another phase (or another phase list) is dropped, as train.py does on resume.
"""

import torch

from tests.helpers import ROOT
from tests.helpers.recipes import DEMO_TRAIN_EXAMPLES, demo
from vitlarge.config.load import load_config
from vitlarge.data import phased
from vitlarge.plan.plan import make_plan

N = DEMO_TRAIN_EXAMPLES


def test_loaders_are_rebuilt_at_a_boundary_at_the_phase_size_and_resume_exactly(demo_data):
    """Real DALI: phase 0 decodes to 8 px, phase 1 to 12 px (eval 16 px); a phase's state continues it bitwise,
    a state from the phase before is dropped and the new phase starts as an uninterrupted run does."""
    c = demo(
        [{"epoch": 0, "image_size": 8}, {"epoch": 1, "image_size": 12, "global_batch": 64, "eval_size": 16}],
        micro_batch=16,
    )
    c.data.path = demo_data
    c.augment.mixup_alpha = 0.0
    plan = make_plan(c, 1, N)
    dev = torch.device("cpu")
    loaders = phased.PhasedLoaders(c, plan, 0, 1, dev)
    train, val = loaders.enter(0)
    assert loaders.enter(10) is None and not loaders.changes_at(10) and loaders.changes_at(11)  # same phase: kept
    x, y = next(train)
    assert x.shape == (16, 3, 8, 8) and y.dtype == torch.int64
    state0 = train.state()
    after = next(train)[0]
    assert next(iter(val))[0].shape[-1] == 8
    train1, val1 = loaders.enter(11)
    b1 = [next(train1)[0] for _ in range(2)]
    assert b1[0].shape == (16, 3, 12, 12) and next(iter(val1))[0].shape[-1] == 16
    # Resume inside phase 0: the same next batch.
    again = phased.PhasedLoaders(c, plan, 0, 1, dev, state=state0)
    assert torch.equal(next(again.enter(5)[0])[0], after)
    # Resume at the boundary with phase 0's state: phase 1's stream from its start, as above.
    at_boundary = phased.PhasedLoaders(c, plan, 0, 1, dev, state=state0)
    t = at_boundary.enter(11)[0]
    assert all(torch.equal(next(t)[0], b) for b in b1)
    # The state is tied to the phase list: an edit of train.phases (a phase inserted) or a state
    # written without phases is "another phase list", and train.py drops it with a warning.
    assert not phased.state_of_other_phases(state0, c, plan) and not phased.state_of_other_phases(None, c, plan)
    edited = demo(
        [
            {"epoch": 0, "image_size": 8},
            {"epoch": 0.5, "image_size": 8, "crop_scale": (0.5, 1.0)},
            {"epoch": 1, "image_size": 12, "global_batch": 64, "eval_size": 16},
        ],
        micro_batch=16,
    )
    assert phased.state_of_other_phases(state0, edited, make_plan(edited, 1, N))
    assert phased.state_of_other_phases(train.loader.state(), c, plan)  # a TrainLoader state without phases
    again = demo(list(c.train.phases), micro_batch=16)
    assert phased.fingerprint(c, plan) == phased.fingerprint(again, make_plan(again, 4, N))  # any world size


def test_the_phase_list_fingerprint_hashes_the_bytes_it_always_has():
    """Checkpoints written before `PhaseEntry` hold these fingerprints (computed on the dict lists): a typed phase
    list must hash the same bytes, or every resume would drop its data position as "another phase list"."""
    listed = [{"epoch": 0, "image_size": 8, "lr": None, "crop_scale": [0.5, 1]}, {"epoch": 30.5, "lr": (1e-3, 1e-4)}]
    cases = [
        ("demo_digits_progressive", [], "3ff2d849b3422003"),
        ("vit_b16_progressive", [], "5522937e9a6f6cae"),
        ("demo_digits", [], phased.NO_PHASES),
        ("demo_digits", [f"train.phases={listed}"], "56a2946e99f2384c"),
    ]
    for name, overrides, expected in cases:
        c = load_config(ROOT / "recipes" / f"{name}.py", overrides)
        assert phased.fingerprint(c, make_plan(c, 1, c.data.num_train_examples)) == expected, name
