"""vitlarge/plan/phases.py: phase planning, the lr over phase boundaries, the generator, bad phases, the table,
and the position-embedding resample. The loaders rebuilt at a boundary are in tests/unit/data/test_phased.py."""

import json

import pytest
import torch

from tests.helpers import ROOT
from tests.helpers.recipes import DEMO, DEMO_TRAIN_EXAMPLES, demo
from vitlarge.config import phase_list
from vitlarge.config.load import load_config, load_recipe, validate
from vitlarge.errors import UserError
from vitlarge.plan.plan import make_plan
from vitlarge.plan.schedule import lr_at

N = DEMO_TRAIN_EXAMPLES


def test_phases_plan_per_phase_batches_steps_and_accumulation_over_uneven_boundaries():
    c = demo(
        [
            {"epoch": 0, "image_size": 8},
            {"epoch": 12.5, "image_size": 12, "global_batch": 64, "micro_batch": 8},
            {"epoch": 40, "image_size": 16, "crop_scale": (0.8, 1.0)},
        ]
    )
    plan = make_plan(c, 2, N)
    p0, p1, p2 = plan.phases
    assert [p.image_size for p in plan.phases] == [8, 12, 16]
    assert [(p.global_batch, p.micro_batch, p.accum_steps, p.steps_per_epoch) for p in plan.phases] == [
        (128, 16, 4, 11),
        (64, 8, 4, 22),
        (64, 8, 4, 22),
    ]  # carried over: batch into phase 2
    assert [p.crop_scale for p in plan.phases] == [(0.6, 1.0), (0.6, 1.0), (0.8, 1.0)]
    assert (p0.start_step, p0.end_step) == (0, 138)  # 12.5 epochs x 11 = 137.5 -> 138
    assert (p1.start_step, p1.end_step) == (138, 138 + 605)  # 27.5 x 22
    assert (p2.start_step, p2.end_step, plan.total_steps) == (743, 743 + 440, 1183)
    assert plan.phase_at(137).index == 0 and plan.phase_at(138).index == 1
    assert plan.epoch_at(138) == pytest.approx(138 / 11) and plan.epoch_at(1183) == 60
    assert plan.warmup_steps == 55  # 5 epochs, inside phase 0
    # World size 4 changes the accumulation only; the same run in optimizer steps.
    plan4 = make_plan(c, 4, N)
    assert [p.accum_steps for p in plan4.phases] == [2, 2, 2] and plan4.total_steps == plan.total_steps


def test_first_phase_after_epoch_0_gets_the_recipes_values_and_keys_carry_over():
    c = demo(
        [
            {"epoch": 10, "image_size": 8, "eval_size": 16},
            {"epoch": 20, "lr_scale": 0.5, "lr": (1e-3, 1e-4)},
            {"epoch": 30},
        ]
    )
    plan = make_plan(c, 2, N)
    assert [(p.start_epoch, p.image_size, p.eval_size, p.lr_scale, p.lr) for p in plan.phases] == [
        (0, 16, 16, 1.0, None),
        (10, 8, 16, 1.0, None),
        (20, 8, 8, 0.5, (1e-3, 1e-4)),
        (30, 8, 8, 0.5, None),
    ]
    # eval_size and an lr segment are their phase's own; the size and lr_scale carry over


def test_rect_val_is_a_phase_key_that_carries_over_and_leaves_the_phase_lists_fingerprint():
    """fast.ai's last phase sets ``rect_val``; a phase without it takes the one before's (the first:
    ``data.rect_val``). It only changes how a phase is validated: editing it keeps a checkpoint's data position."""
    from vitlarge.data import phased

    listed = [{"epoch": 0, "image_size": 8}, {"epoch": 30, "image_size": 12}, {"epoch": 50, "image_size": 16}]
    square = demo(listed)
    fastai = demo([*listed[:2], dict(listed[2], rect_val=True)])
    assert [p.rect_val for p in make_plan(fastai, 2, N).phases] == [False, False, True]
    assert not phase_list.rect_val_anywhere(square) and phase_list.final_rect_val(fastai)
    from_data = load_recipe(DEMO)
    from_data.data.rect_val, from_data.train.phases = True, [*listed[:2], dict(listed[2], rect_val=False)]
    validate(from_data)
    assert [p.rect_val for p in make_plan(from_data, 2, N).phases] == [True, True, False]
    prints = {phased.fingerprint(c, make_plan(c, 2, N)) for c in (square, fastai, from_data)}
    assert prints == {phased.fingerprint(square, make_plan(square, 2, N))}
    assert [p.to_dict() for p in fastai.train.phases][2] == {"epoch": 50, "image_size": 16, "rect_val": True}


def test_fast_ais_phases_as_docs_progressive_writes_them_plan_on_vit_b16_at_8_gpus():
    """docs/PROGRESSIVE.md#rectangular-validation: fast.ai/DIUx imagenet18's command line as a phase list. It
    validates on recipes/vit_b16.py and plans at 8 GPUs: fast.ai's per-GPU batches, its sizes, its lr segments,
    rectangular validation in the last phase only."""
    import ast

    doc = (ROOT / "docs" / "PROGRESSIVE.md").read_text()
    section = doc[doc.index("## Rectangular validation") :]
    block = section[section.index("c.train.phases = [") + len("c.train.phases = ") : section.index("]\n```")] + "]"
    c = load_recipe(ROOT / "recipes" / "vit_b16.py")
    c.train.epochs, c.schedule.warmup_epochs, c.train.phases = 28, 0, ast.literal_eval(block)
    validate(c)
    plan = make_plan(c, 8, 1_281_167)
    assert [(p.start_epoch, p.image_size, p.micro_batch, p.accum_steps) for p in plan.phases] == [
        (0, 128, 512, 1),
        (7, 128, 512, 1),
        (13, 224, 224, 1),
        (22, 224, 224, 1),
        (25, 288, 128, 1),
    ]
    assert [p.rect_val for p in plan.phases] == [False] * 4 + [True] and plan.phases[-1].eval_size == 288
    assert [p.lr for p in plan.phases][-1] == (0.0025, 0.00025) and plan.phases[2].crop_scale == (0.087, 1.0)


def test_without_phases_the_plan_is_one_phase_with_the_recipes_values():
    c = load_recipe(DEMO)
    plan = make_plan(c, 2, N)
    (ph,) = plan.phases
    assert plan.phase_at(0) is ph and plan.phase_at(plan.total_steps) is ph and plan.epoch_at(22) == 2
    assert (ph.image_size, ph.global_batch, ph.micro_batch, ph.crop_scale) == (
        c.data.image_size,
        c.train.global_batch,
        c.train.micro_batch,
        tuple(c.data.crop_scale),
    )
    assert (ph.start_step, ph.end_step, ph.lr_scale, ph.lr) == (0, plan.total_steps, 1.0, None)


def test_lr_is_a_pure_function_of_the_step_across_boundaries():
    same = demo([{"epoch": 0, "image_size": 8}, {"epoch": 30, "image_size": 12}, {"epoch": 48, "image_size": 16}])
    plain = load_recipe(DEMO)
    p_same, p_plain = make_plan(same, 2, N), make_plan(plain, 2, N)
    kw = dict(
        peak_lr=plain.optim.lr, total_steps=p_plain.total_steps, warmup_steps=p_plain.warmup_steps, decay="cosine"
    )
    # Same batch in every phase: exactly the fixed-resolution schedule, continuous over boundaries.
    assert [p_same.lr_at(same, s) for s in range(p_same.total_steps)] == [
        lr_at(s, **kw) for s in range(p_plain.total_steps)
    ]
    # Halved batch with lr_scale 0.5 from epoch 30; an explicit lr segment for the last 10 epochs.
    c = demo([{"epoch": 0}, {"epoch": 30, "global_batch": 64, "lr_scale": 0.5}, {"epoch": 50, "lr": (1e-3, 0.0)}])
    plan = make_plan(c, 2, N)
    p0, p1, p2 = plan.phases
    assert (p0.end_step, p1.steps_per_epoch, p1.end_step, plan.total_steps) == (330, 22, 770, 990)
    lrs = [plan.lr_at(c, s) for s in range(plan.total_steps)]
    assert lrs[329] == lr_at(329, peak_lr=2e-2, total_steps=990, warmup_steps=55, decay="cosine")
    assert lrs[330] == 0.5 * lr_at(330, peak_lr=2e-2, total_steps=990, warmup_steps=55, decay="cosine")
    assert lrs[770] == 1e-3 and lrs[988] == pytest.approx(1e-3 / 219) and lrs[989] == 0.0  # reaches its end
    assert all(a >= b for a, b in zip(lrs[55:], lrs[56:]))  # decays monotonically after warmup


IMAGENET = 1_281_167


def test_vit_b16_progressive_plans_at_every_world_size_vit_b16_does_at_imagenet_size():
    """The phase micro batch is capped at global/world: 128 and 256 GPUs plan (phase 0 asks for 512 per
    device); world sizes that do not divide 32K fail with one line, as vit_b16.py's do. Same schedule:
    the same total steps and warmup, and the same lr at every step as the unphased recipe."""
    prog = load_recipe(ROOT / "recipes" / "vit_b16_progressive.py")
    base = load_recipe(ROOT / "recipes" / "vit_b16.py")
    validate(prog)
    for world in [1, 2, 3, 4, 5, 6, 7, 8, 9, 128, 256]:
        if 32768 % world:
            for c in (prog, base):
                with pytest.raises(UserError, match=f"32768 does not divide over {world} processes, so no ") as e:
                    make_plan(c, world, IMAGENET)
                assert "\n" not in str(e.value)
            continue
        plan = make_plan(prog, world, IMAGENET)
        micro = [p.micro_batch for p in plan.phases]
        assert micro == [min(512, 32768 // world), min(256, 32768 // world), min(256, 32768 // world)], world
        assert all(p.micro_batch * p.accum_steps * world == 32768 for p in plan.phases)
        if world <= 128:  # vit_b16.py itself (micro 256) stops at 128 devices
            ref = make_plan(base, world, IMAGENET)
            assert (plan.total_steps, plan.warmup_steps) == (ref.total_steps, ref.warmup_steps) == (11700, 5850)
    plan, ref = make_plan(prog, 128, IMAGENET), make_plan(base, 128, IMAGENET)
    assert [(p.start_step, p.end_step) for p in plan.phases] == [(0, 5850), (5850, 9360), (9360, 11700)]
    kw = dict(
        peak_lr=base.optim.lr,
        total_steps=ref.total_steps,
        warmup_steps=ref.warmup_steps,
        decay=base.schedule.decay,
        min_lr_ratio=base.schedule.min_lr_ratio,
    )
    assert [plan.lr_at(prog, s) for s in range(plan.total_steps)] == [lr_at(s, **kw) for s in range(ref.total_steps)]


def test_phase_boundaries_round_cumulatively_so_total_steps_do_not_drift():
    """progressive() starts phases at fractional epochs; rounded piece by piece they drifted by a step
    (11701 vs 11700). Rounded from absolute epochs, every boundary is round(epoch x steps per epoch)."""
    c = load_recipe(ROOT / "recipes" / "vit_b16.py")
    ref = make_plan(c, 4, IMAGENET)
    c.train.phases = phase_list.progressive(c)
    validate(c)
    plan = make_plan(c, 4, IMAGENET)
    assert len(plan.phases) > 5 and plan.total_steps == ref.total_steps == 11700
    assert plan.warmup_steps == ref.warmup_steps
    spe = ref.phases[0].steps_per_epoch
    assert all(p.start_step == int(p.start_epoch * spe + 0.5) for p in plan.phases)
    assert all(a.end_step == b.start_step for a, b in zip(plan.phases, plan.phases[1:]))


def test_progressive_without_a_finetune_part_still_ends_at_the_full_size():
    c = load_recipe(ROOT / "recipes" / "vit_b16.py")
    for ff in (0.0, 0.2):
        ph = phase_list.progressive(c, initial_scale=0.5, delay_fraction=0.0, finetune_fraction=ff)
        assert ph[-1]["image_size"] == 224 and ph[0]["image_size"] == 112, ff
        sizes = [p["image_size"] for p in ph]
        assert sizes == sorted(set(sizes))
    c.train.phases = ph
    validate(c)


def test_progressive_generator_builds_composer_phases_in_one_line():
    c = load_recipe(DEMO)
    c.data.image_size, c.model.kwargs = 32, dict(c.model.kwargs)  # patch 4: sizes 16, 20, ..., 32
    c.train.phases = phase_list.progressive(c, initial_scale=0.5, delay_fraction=0.5, finetune_fraction=0.2)
    validate(c)
    sizes = [p.image_size for p in c.train.phases]
    starts = [p.epoch for p in c.train.phases]
    # Sizes round down to the increment, as composer's: 20 px from scale 0.625, 57.5% into the run.
    assert sizes == [16, 20, 24, 28, 32] and starts[0] == 0 and starts[1] == pytest.approx(34.5, abs=0.05)
    assert starts[-1] == pytest.approx(48, abs=0.05) and starts == sorted(starts)
    assert [p["image_size"] for p in phase_list.progressive(c, initial_scale=0.5, size_increment=8)] == [16, 24, 32]
    with pytest.raises(UserError, match=r"size_increment=6\): not a multiple of the patch size 4; use 4"):
        phase_list.progressive(c, size_increment=6)


@pytest.mark.parametrize(
    "bad, message",
    [
        (
            [{"epoch": 0}, {"epoch": 20}, {"epoch": 10}],
            "train.phases[2].epoch=10 is not after train.phases[1].epoch=20; list phases in increasing order",
        ),
        ([{"epoch": 0}, {"epoch": 0, "image_size": 8}], "train.phases[1].epoch=0 is not after train.phases[0].epoch=0"),
        (
            [{"epoch": 0, "image_size": 10}],
            "train.phases[0].image_size=10 is not a multiple of the patch size 4; use 8 or 12",
        ),
        ([{"epoch": 0, "eval_size": 18}], "train.phases[0].eval_size=18 is not a multiple of the patch size 4"),
        ([{"epoch": 0, "sz": 8}], "train.phases[0] has unknown key 'sz'; use epoch, image_size"),
        ([{"image_size": 8}], "train.phases[0] has no 'epoch'"),
        ([{"epoch": 60}], "train.phases[0].epoch=60 must be in [0, train.epochs=60.0)"),
        ([{"epoch": 0, "global_batch": 100}], "train.phases[0]: global_batch=100 is not a multiple of micro_batch=16"),
        (
            [{"epoch": 0, "crop_scale": (0.5, 2)}],
            "train.phases[0].crop_scale=(0.5, 2) must be (low, high) with 0 < low <= high <= 1, e.g. (0.35, 1.0)",
        ),
        ([{"epoch": 0, "micro_batch": 9, "global_batch": 144}], "Mixup/CutMix need an even micro batch"),
        ([{"epoch": 0, "rect_val": "yes"}], "train.phases[0].rect_val='yes' must be True or False"),
    ],
)
def test_bad_phases_are_one_line_naming_the_key(bad, message):
    c = load_recipe(DEMO)
    c.train.phases = bad
    with pytest.raises(UserError) as e:
        validate(c, "recipe.py")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_dry_run_prints_the_phase_table(capsys):
    from vitlarge.run.dry_run import print_plan

    cfg = load_config(ROOT / "recipes" / "demo_digits_progressive.py")
    print_plan(cfg, make_plan(cfg, 2))
    out = capsys.readouterr().out
    table = out[out.index("phases:") :].splitlines()
    assert "batch = micro x accum x dev" in table[1] and table[5].startswith("  total")
    assert all(line.startswith("  on a GPU add") or line.startswith("    ") for line in table[6:])  # device auto
    assert table[2].split()[:10] == ["0", "0-20", "8", "8", "128", "=", "64", "x", "1", "x"]
    assert table[4].split()[1:9] == ["36-60", "16", "16", "128", "=", "16", "x", "4"]
    assert "of the same images at 16 px" in table[5]
    share = float(table[5].split("=")[1].split("%")[0])
    assert 60 < share < 70  # 20 epochs at 5/17 of the tokens, 16 at 10/17, 24 full
    assert "rectangular" not in out


def test_the_dry_run_names_the_phases_that_validate_rectangular_batches():
    from vitlarge.run.dry_run import eval_schedule

    listed = [{"epoch": 0, "image_size": 8}, {"epoch": 30, "image_size": 12}, {"epoch": 50, "image_size": 16}]
    fastai = demo([*listed[:2], dict(listed[2], rect_val=True)])
    assert eval_schedule(make_plan(fastai, 2, N)) == (
        "every 110 steps (rectangular in phase 2: batches of the aspect-sorted validation split at their own aspect "
        "ratio)"
    )
    everywhere = load_recipe(DEMO)
    everywhere.data.rect_val = True
    assert eval_schedule(make_plan(everywhere, 2, N)).startswith("every 110 steps (rectangular: batches")
    assert eval_schedule(make_plan(demo(listed), 2, N)) == "every 110 steps"


def test_position_embedding_resample_is_timms_as_a_cached_matmul():
    """The phased model resamples pos_embed by a cached matrix (deterministic backward on CUDA, argued from
    PyTorch's source: not run here) instead of timm's bicubic F.interpolate: the same values and gradients
    up to fp32 rounding, on CPU, at grids below, at and above the base grid."""
    from timm.layers import resample_abs_pos_embed
    from timm.models.vision_transformer import VisionTransformer

    from vitlarge.model.vit import build_model, pos_embed_matrix

    c = load_recipe(ROOT / "recipes" / "demo_digits_progressive.py")
    torch.manual_seed(0)
    model = build_model(c)
    assert type(model) is not VisionTransformer and type(model)._pos_embed is not VisionTransformer._pos_embed
    base = model.pos_embed.detach()  # (1, 1 + 4x4, 96)
    for grid in [(2, 2), (3, 3), (4, 4), (5, 5), (3, 5)]:
        pos = base.clone().requires_grad_(True)
        want = resample_abs_pos_embed(pos, new_size=list(grid), old_size=[4, 4], num_prefix_tokens=1)
        up = torch.randn_like(want)
        (g_want,) = torch.autograd.grad((want * up).sum(), pos)
        pos2 = base.clone().requires_grad_(True)
        got = torch.cat([pos2[:, :1], (pos_embed_matrix((4, 4), grid, "cpu") @ pos2[0, 1:]).unsqueeze(0)], dim=1)
        (g_got,) = torch.autograd.grad((got * up).sum(), pos2)
        assert torch.allclose(got, want, atol=1e-6, rtol=0) and torch.allclose(g_got, g_want, atol=1e-6, rtol=0), grid
    # The model's forward equals timm's own (the stock class on the same weights) and caches one matrix per grid.
    ref = VisionTransformer.__new__(VisionTransformer)
    ref.__dict__ = dict(model.__dict__)
    x = torch.randn(2, 3, 12, 12)
    assert torch.allclose(model(x), ref(x), atol=1e-5, rtol=0)
    model(torch.randn(1, 3, 12, 12))
    assert list(model._pos_embed_matrices) == [(3, 3, torch.device("cpu"))]


def test_new_boundaries_before_the_resumed_step_are_named_later_ones_and_removals_are_not():
    """`new_boundaries_before`: a checkpoint at step s written under one list, the run's new list. 11 steps per
    epoch: epoch 0.5 is step 6, epoch 0.25 step 3."""
    from vitlarge.plan.phases import new_boundaries_before

    old = demo([{"epoch": 0, "image_size": 8}, {"epoch": 0.5, "image_size": 16}])
    saved = json.loads(json.dumps(old.to_dict()))  # as meta.json holds it: the phases as dicts
    n = DEMO_TRAIN_EXAMPLES
    same = demo([{"epoch": 0, "image_size": 8}, {"epoch": 0.5, "image_size": 16}, {"epoch": 2, "image_size": 24}])
    assert new_boundaries_before(saved, same, n, 20) is None  # the old boundary kept, one added after step 20
    assert new_boundaries_before(saved, demo(), n, 20) is None  # phases removed: absorbed
    moved = demo([{"epoch": 0, "image_size": 8}, {"epoch": 0.25, "image_size": 16}])
    line = new_boundaries_before(saved, moved, n, 4)
    assert line.startswith("train.phases[1] starts at step 3 (epoch 0.25), before step 4")
    assert new_boundaries_before(saved, moved, n, 3) is None  # a boundary at the resumed step rewrites nothing
    added = demo([{"epoch": 0, "image_size": 8}, {"epoch": 0.5, "image_size": 16}, {"epoch": 1, "image_size": 24}])
    assert "train.phases[2] starts at step 11 (epoch 1)" in new_boundaries_before(saved, added, n, 12)
    assert new_boundaries_before(demo().to_dict(), old, n, 5) is None  # phases added after a plain run's step 5
    assert "starts at step 6" in new_boundaries_before(demo().to_dict(), old, n, 7)


def test_the_images_a_boundary_skips_in_vit_b16_progressive_are_the_documented_ones():
    """docs/PROGRESSIVE.md: within a phase the stream is continuous; a boundary ends it after S x G images
    of whole passes of n, skipping the rest of the last pass: n x (1 - frac(S x G / n))."""
    from vitlarge.constants import IMAGENET_TRAIN_EXAMPLES as n

    cfg = load_recipe(ROOT / "recipes" / "vit_b16_progressive.py")
    plan = make_plan(cfg, 4, n)
    skipped = [(ph.start_epoch, n - (ph.steps * ph.global_batch) % n) for ph in plan.phases[:-1]]
    assert [(epoch, images) for epoch, images in skipped] == [(0.0, 482_250), (150.0, 289_350)]
    doc = (ROOT / "docs" / "PROGRESSIVE.md").read_text()
    assert "482,250 images (38% of a pass) at epoch 150 and 289,350 at\n  epoch 240" in doc
    assert round(482_250 / n, 2) == 0.38


def test_one_phase_type_from_the_recipe_to_the_plan():
    """A recipe's entry, the entry resolved (every key filled in, world-size free: what the fingerprint hashes) and the
    plan's phase for a world size: the first two are one type, `PhaseEntry`; the plan's `Phase` adds what the world
    size decides (micro batch, accumulation, steps) and keeps the entry it planned."""
    from vitlarge.config.schema import PHASE_KEYS, PhaseEntry
    from vitlarge.plan import phases

    c = demo([{"epoch": 0, "image_size": 8}, {"epoch": 30, "image_size": 12, "micro_batch": 8}])
    resolved = phase_list.resolve_phases(c)
    assert all(type(p) is PhaseEntry and p.given == PHASE_KEYS for p in resolved)
    assert all(getattr(p, k) is not None for p in resolved for k in PHASE_KEYS if k != "lr")  # None: the schedule's
    plan = make_plan(c, 4, N)
    assert [ph.entry for ph in plan.phases] == resolved
    assert not hasattr(phase_list, "PhaseSpec") and not hasattr(phases, "stream_seed")


def test_the_mixup_batch_check_is_in_one_place_and_says_what_it_said():
    """The recipe's micro batch and each phase's, one check (`phase_list`): the lines are those the two copies printed,
    each blaming the override that set the batch."""
    sources = [p.read_text() for p in (ROOT / "vitlarge").rglob("*.py")]
    assert sum("Mixup/CutMix need an even" in s for s in sources) == 1
    with pytest.raises(UserError) as e:
        load_config(DEMO, ["augment.mixup_alpha=0.8", "train.global_batch=126", "train.micro_batch=63"])
    assert str(e.value) == (
        "command line: Mixup/CutMix need an even train.micro_batch, got 63; use an even micro batch or set "
        "augment.mixup_alpha=0 augment.cutmix_alpha=0"
    )
    c = load_recipe(DEMO)
    c.train.phases, c.augment.cutmix_alpha = [{"epoch": 0, "micro_batch": 9, "global_batch": 144}], 1.0
    with pytest.raises(UserError) as e:
        validate(c, "recipe.py")
    assert str(e.value) == "recipe.py: train.phases[0].micro_batch=9: Mixup/CutMix need an even micro batch"


def test_seeds_are_the_plans():
    """The data streams' and the RNGs' seeds sit with the plan (`vitlarge.plan.plan`), beside the steps they follow."""
    from vitlarge.plan.plan import PHASE_SEED_STRIDE, rng_seed, stream_seed

    assert stream_seed(7, 2) == 7 + 2 * PHASE_SEED_STRIDE and rng_seed(7, 3) == 10
