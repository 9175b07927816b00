"""vitlarge/config/load.py: recipes load, overrides are typed and strict, values are range-checked.

Every override has a form without shell metacharacters (``colossalai run`` re-parses arguments through
an unquoted ``bash -c``): tuples as ``a,b``, dict entries and phases by dotted key, or a file.

The plan derived from a config is in tests/unit/plan/test_plan.py; train.py's own handling of a
bad override in tests/e2e/test_train_cli.py."""

import importlib.util
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT
from vitlarge.config.load import load_config, load_recipe, validate
from vitlarge.config.overrides import apply_override
from vitlarge.config.profile_window import parse_step_window
from vitlarge.config.schema import Config, PhaseEntry, field_rules
from vitlarge.errors import UserError

RECIPES = ROOT / "recipes"
ALL_RECIPES = [
    "vit_b16",
    "vit_b32",
    "vit_l32",
    "vit_l16",
    "vit_h14",
    "demo_digits",
    "demo_digits_progressive",
    "demo_digits_ft24",
    "demo_transfer",
    "demo_aspect",
    "vit_b16_progressive",
    "vit_b16_ft384",
    "deit3_b16",
    "deit3_b16_ft224",
    "deit3_b16_32k",
]


def recipe(name: str) -> Path:
    return RECIPES / f"{name}.py"


def flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and k != "kwargs":
            out.update(flat(v, key + "."))
        else:
            out[key] = v
    return out


def changed(a: Config, b: Config) -> set[str]:
    fa, fb = flat(a.to_dict()), flat(b.to_dict())
    assert fa.keys() == fb.keys()
    return {k for k in fa if fa[k] != fb[k]}


@pytest.mark.parametrize("name", ALL_RECIPES)
def test_every_recipe_loads_and_validates(name):
    cfg = load_config(recipe(name))
    assert isinstance(cfg, Config)
    assert cfg.workdir == f"runs/{name}"
    assert cfg.train.global_batch % cfg.train.micro_batch == 0


def test_recipe_files_are_all_covered():
    on_disk = {p.stem for p in RECIPES.glob("*.py") if p.stem != "__init__"}
    assert on_disk == set(ALL_RECIPES)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("vit_b32", {"model.name", "workdir"}),
        ("vit_l32", {"model.name", "workdir"}),
        ("vit_l16", {"model.name", "train.activation_checkpointing", "train.micro_batch", "workdir"}),
        (
            "vit_h14",
            {
                "model.name",
                "train.activation_checkpointing",
                "train.micro_batch",
                "train.precision",
                "train.plugin",
                "train.fsdp_accumulation",
                "workdir",
            },
        ),
    ],
)
def test_derived_recipes_change_only_what_they_say(name, expected):
    assert changed(load_recipe(recipe("vit_b16")), load_recipe(recipe(name))) == expected


def test_vit_b32_is_b16_with_32_pixel_patches():
    b16, b32 = load_recipe(recipe("vit_b16")), load_recipe(recipe("vit_b32"))
    assert b32.model.name == "vit_base_patch32_224"
    b32.model.name, b32.workdir = b16.model.name, b16.workdir
    assert b32.to_dict() == b16.to_dict()


def test_overrides_of_every_type_apply():
    cfg = load_config(
        recipe("vit_b16"),
        [
            "train.micro_batch=128",  # int
            "train.global_batch=4.096e3",  # int written as a float literal
            "optim.lr=0.005",  # float
            "schedule.warmup_epochs=10",  # float from an int literal
            "data.hflip=false",  # bool
            "data.rect_val=yes",  # bool
            "optim.betas=(0.8, 0.95)",  # tuple
            "data.crop_scale=[0.5,1]",  # tuple from list syntax
            "data.randaugment=rand-m9-n2",  # Optional[str], a value
            "data.label_offset=1",  # Optional[int]
            "model.kwargs={'depth': 2, 'embed_dim': 64}",  # dict
            "workdir=runs/elsewhere",  # top-level str
        ],
    )
    assert cfg.train.micro_batch == 128 and type(cfg.train.micro_batch) is int
    assert cfg.train.global_batch == 4096 and type(cfg.train.global_batch) is int
    assert cfg.optim.lr == 0.005
    assert cfg.schedule.warmup_epochs == 10.0 and type(cfg.schedule.warmup_epochs) is float
    assert cfg.data.hflip is False
    assert cfg.data.rect_val is True
    assert cfg.optim.betas == (0.8, 0.95)
    assert cfg.data.crop_scale == (0.5, 1.0)
    assert cfg.data.randaugment == "rand-m9-n2"
    assert cfg.data.label_offset == 1
    assert cfg.model.kwargs == {"depth": 2, "embed_dim": 64}
    assert cfg.workdir == "runs/elsewhere"

    apply_override(cfg, "data.randaugment=None")  # Optional[str] back to None
    apply_override(cfg, "data.label_offset=none")
    assert cfg.data.randaugment is None and cfg.data.label_offset is None


def test_direct_settings_are_overrides_too():
    cfg = load_config(recipe("demo_digits"), [], data__path="/tmp/digits", workdir=None)
    assert cfg.data.path == "/tmp/digits"
    assert cfg.workdir == "runs/demo_digits"  # None means "not given"


@pytest.mark.parametrize(
    "item, suggestion",
    [
        ("optim.lrr=0.1", "optim.lr"),
        ("train.micro_bacth=64", "train.micro_batch"),
        ("trian.epochs=10", "train.epochs"),
        ("optim.lr.x=1", "optim.lr"),
    ],
)
def test_unknown_key_names_it_and_suggests(item, suggestion):
    cfg = load_recipe(recipe("vit_b16"))
    with pytest.raises(UserError) as e:
        apply_override(cfg, item)
    msg = str(e.value)
    assert f"'{item.split('=')[0]}'" in msg
    assert f"did you mean '{suggestion}'" in msg


def test_unknown_key_without_close_match_points_to_schema():
    with pytest.raises(UserError, match="unknown config key 'zzzz'.*vitlarge/config/schema.py"):
        apply_override(Config(), "zzzz=1")


@pytest.mark.parametrize(
    "item, key",
    [
        ("train.micro_batch=abc", "train.micro_batch"),
        ("train.micro_batch=2.5", "train.micro_batch"),
        ("optim.lr=fast", "optim.lr"),
        ("data.hflip=maybe", "data.hflip"),
        ("optim.betas=(0.9,x)", "optim.betas"),
        ("model.kwargs=[1, 2]", "model.kwargs"),
        ("data.label_offset=one", "data.label_offset"),
    ],
)
def test_wrong_type_names_the_key(item, key):
    cfg = Config()
    before = cfg.to_dict()
    with pytest.raises(UserError, match=f"'{key}="):
        apply_override(cfg, item)
    assert cfg.to_dict() == before


def test_section_cannot_be_assigned():
    with pytest.raises(UserError, match="'train' is a section.*train.global_batch"):
        apply_override(Config(), "train=5")


def test_override_without_equals_sign():
    with pytest.raises(UserError, match="has no '='"):
        apply_override(Config(), "optim.lr")


def test_missing_recipe_names_the_file(tmp_path):
    missing = tmp_path / "nope.py"
    with pytest.raises(UserError, match="nope.py does not exist"):
        load_config(missing)


def test_recipe_without_config_function(tmp_path):
    f = tmp_path / "empty_recipe.py"
    f.write_text("x = 1\n")
    with pytest.raises(UserError, match=r"empty_recipe.py defines no config\(\)"):
        load_recipe(f)


def test_recipe_failing_at_import(tmp_path):
    f = tmp_path / "broken_recipe.py"
    f.write_text("import does_not_exist_anywhere\n")
    with pytest.raises(UserError, match="broken_recipe.py failed to load: ModuleNotFoundError"):
        load_recipe(f)


def test_recipe_whose_config_raises(tmp_path):
    f = tmp_path / "raising_recipe.py"
    f.write_text("def config():\n    raise KeyError('oops')\n")
    with pytest.raises(UserError, match="raising_recipe.py.*KeyError"):
        load_recipe(f)


def test_recipe_returning_something_else(tmp_path):
    f = tmp_path / "dict_recipe.py"
    f.write_text("def config():\n    return {}\n")
    with pytest.raises(UserError, match="dict_recipe.py.*returned dict"):
        load_recipe(f)


def test_wrong_type_assigned_in_a_recipe(tmp_path):
    f = tmp_path / "typo_recipe.py"
    f.write_text(
        "from recipes.vit_b16 import config as base\n"
        "def config():\n"
        "    c = base()\n"
        "    c.train.micro_batch = '64'\n"
        "    return c\n"
    )
    # tmp_path is not under the repo, so the base import relies on the repo root being importable.
    with pytest.raises(UserError) as e:
        load_config(f)
    msg = str(e.value)
    assert "typo_recipe.py" in msg and "'train.micro_batch' must be a" in msg


def test_recipe_ints_become_floats_and_lists_tuples(tmp_path):
    f = tmp_path / "loose_recipe.py"
    f.write_text(
        "from vitlarge.config.load import Config\n"
        "def config():\n"
        "    c = Config()\n"
        "    c.optim.lr = 1\n"
        "    c.optim.betas = [0.9, 0.99]\n"
        "    return c\n"
    )
    cfg = load_config(f)
    assert type(cfg.optim.lr) is float and cfg.optim.betas == (0.9, 0.99)


def test_bool_is_not_an_int_in_a_recipe():
    cfg = Config()
    cfg.train.micro_batch = True
    with pytest.raises(UserError, match="'train.micro_batch' must be a"):
        validate(cfg)


def test_choices_are_listed():
    cfg = Config()
    cfg.train.precision = "fp8"
    with pytest.raises(UserError, match="'train.precision' is 'fp8'; choose one of fp16, bf16, fp32"):
        validate(cfg)


@pytest.mark.parametrize(
    "item, match",
    [
        ("train.micro_batch=0", "'train.micro_batch' must be positive"),
        ("train.micro_batch=300", "not a multiple of train.micro_batch=300"),
        ("schedule.warmup_epochs=301", "warmup_epochs=301.0 exceeds train.epochs=300"),
        ("data.val_crop_pct=1.5", "val_crop_pct must be in"),
        ("schedule.decay=step", "'schedule.decay=step' is not one of linear, cosine, constant"),
        ("data.crop=center", "^command line: 'data.crop=center' is not one of rrc, src"),
    ],
)
def test_cross_field_validation(item, match):
    with pytest.raises(UserError, match=match):
        load_config(recipe("vit_b16"), [item])


@pytest.mark.parametrize(
    "items, first",
    [
        (["train.global_batch=0", "model.drop_path_rate=2"], "model.drop_path_rate"),
        (["train.micro_batch=0", "data.crop_scale=0.5,0.2"], "data.crop_scale"),
        (["train.seed=-1", "augment.label_smoothing=1"], "augment.label_smoothing"),
    ],
)
def test_several_bad_values_report_the_first_in_the_schemas_order(items, first):
    """One line for the first problem, the sections in the schema's order (model, data, augment, optim, schedule,
    train) and each section's fields in theirs: the checks live beside their fields (before issue 34 the order was
    a table's, and these pairs named the other key)."""
    for order in (items, items[::-1]):
        with pytest.raises(UserError, match=rf"\b{first}\b"):
            load_config(recipe("vit_b16"), order)


def test_deit3_augmentation_loads_and_excludes_randaugment():
    cfg = load_config(recipe("demo_digits"), ["data.three_augment=true", "data.crop=src", "data.color_jitter=0.3"])
    assert (cfg.data.three_augment, cfg.data.crop, cfg.data.color_jitter) == (True, "src", 0.3)
    with pytest.raises(UserError) as e:
        load_config(recipe("demo_digits"), ["data.three_augment=true", "data.randaugment=rand-m9-n2"])
    message = str(e.value)
    assert "data.three_augment=true" in message and "data.randaugment=none" in message and "\n" not in message


def _bad_value(rule: str) -> str:
    return "0" if rule == "positive" else "1.5" if rule.startswith("in [0, 1") else "-1"


@pytest.mark.parametrize("key, rule", [(k, rule.words) for k, rule in field_rules() if rule.items == 1])
def test_every_duration_count_and_rate_is_range_checked_with_the_fix(key, rule):
    """One line: the key, its rule (and what 0 means where 0 means something), the value, a valid setting."""
    bad = _bad_value(rule)
    with pytest.raises(UserError) as e:
        load_config(recipe("demo_digits"), [f"{key}={bad}"])
    message = str(e.value)
    assert f"'{key}' must be {rule}, got " in message and f"; set it like {key}=" in message and "\n" not in message
    fix = message.rsplit("set it like ", 1)[1]
    load_config(recipe("vit_b16"), [fix])  # the suggested setting is valid (in the recipe closest to the defaults)


@pytest.mark.parametrize(
    "item",
    [
        "train.epochs=nan",
        "optim.lr=inf",
        "optim.betas=0.9,1.0",
        "optim.betas=0.9",
        "data.crop_scale=0.5,0.2",
        "data.crop_ratio=0,1",
    ],
)
def test_non_finite_and_malformed_pairs_are_rejected(item):
    key = item.split("=")[0]
    with pytest.raises(UserError, match=f"'{key}' must be .*; set it like {key}="):
        load_config(recipe("demo_digits"), [item])


@pytest.mark.parametrize(
    "item",
    [
        "train.checkpoint_every_steps=0",
        "train.eval_every_epochs=0",
        "train.max_steps=0",
        "optim.clip_grad_norm=0",
        "schedule.warmup_epochs=0",
    ],
)
def test_zero_means_never_or_off_where_documented(item):
    load_config(recipe("demo_digits"), [item])


def test_mixup_needs_an_even_micro_batch():
    with pytest.raises(UserError, match="even train.micro_batch"):
        load_config(recipe("demo_digits"), ["train.global_batch=126", "train.micro_batch=63"])


def test_loss_and_layer_decay_keys_apply():
    cfg = load_config(
        recipe("demo_digits"),
        ["augment.loss=bce", "augment.bce_target_thresh=0.0", "optim.layer_decay=0.75"],
    )
    assert (cfg.augment.loss, cfg.augment.bce_target_thresh, cfg.optim.layer_decay) == ("bce", 0.0, 0.75)
    cfg = load_config(recipe("demo_digits"), ["augment.loss=bce", "augment.bce_target_thresh=none"])
    assert cfg.augment.bce_target_thresh is None
    default = load_config(recipe("demo_digits"))
    assert (default.augment.loss, default.augment.bce_target_thresh, default.optim.layer_decay) == ("ce", None, 1.0)


@pytest.mark.parametrize(
    "items, match",
    [
        (["augment.loss=nll"], "'augment.loss=nll' is not one of ce, bce"),
        (["augment.loss=bce", "augment.bce_target_thresh=1.0"], "'augment.bce_target_thresh' must be in \\[0, 1\\)"),
        (["augment.loss=bce", "augment.bce_target_thresh=-0.1"], "'augment.bce_target_thresh' must be in \\[0, 1\\)"),
        (["augment.bce_target_thresh=0.0"], "augment.bce_target_thresh=0.0 applies to augment.loss=bce only"),
        (["optim.layer_decay=0"], "'optim.layer_decay' must be in \\(0, 1\\]"),
        (["optim.layer_decay=1.5"], "'optim.layer_decay' must be in \\(0, 1\\]"),
        (["train.ema_decay=1.0"], "'train.ema_decay' must be in \\[0, 1\\) \\(0: no model EMA"),
        (["train.ema_decay=-0.1"], "'train.ema_decay' must be in \\[0, 1\\)"),
        (["train.export_ema=true"], "train.export_ema=true needs a model EMA, but train.ema_decay=0"),
        (["train.ema_warmup=true"], "train.ema_warmup=true needs a model EMA, but train.ema_decay=0"),
    ],
)
def test_bad_loss_and_layer_decay_values_are_one_line_naming_the_key(items, match):
    with pytest.raises(UserError, match=match) as e:
        load_config(recipe("demo_digits"), items)
    assert "\n" not in str(e.value)


def test_repeats_and_random_erase_prob_load_and_are_checked_in_one_line():
    cfg = load_config(recipe("demo_digits"), ["data.repeats=3", "augment.random_erase_prob=0.25"])
    assert (cfg.data.repeats, cfg.augment.random_erase_prob) == (3, 0.25)
    for item, key in (
        ("data.repeats=0", "data.repeats"),
        ("data.repeats=2.5", "data.repeats"),
        ("augment.random_erase_prob=1.5", "augment.random_erase_prob"),
        ("augment.random_erase_prob=-0.1", "augment.random_erase_prob"),
    ):
        with pytest.raises(UserError) as e:
            load_config(recipe("demo_digits"), [item])
        assert key in str(e.value) and "\n" not in str(e.value), item


def test_the_deit3_recipes_are_deit_iiis_and_their_dry_runs_plan():
    """recipes/deit3_b16*.py: the README_revenge settings, and each plans at 8 GPUs (the 32K one also at 128)."""
    from vitlarge.plan.plan import make_plan

    pre, ft, big = (load_config(recipe(n)) for n in ("deit3_b16", "deit3_b16_ft224", "deit3_b16_32k"))
    assert (pre.model.name, pre.data.image_size, pre.train.global_batch, pre.train.epochs) == (
        "deit3_base_patch16_224",
        192,
        2048,
        800,
    )
    assert (pre.augment.loss, pre.augment.bce_target_thresh, pre.data.repeats, pre.data.three_augment) == (
        "bce",
        0.0,
        3,
        True,
    )
    assert (pre.data.crop, pre.data.color_jitter, pre.augment.mixup_alpha, pre.augment.cutmix_alpha) == (
        "rrc",  # DeiT III's ImageNet-1k commands: no --src (that is its ImageNet-21k recipe)
        0.3,
        0.8,
        1.0,
    )
    assert (pre.model.kwargs, pre.optim.clip_grad_norm, ft.optim.clip_grad_norm) == ({"init_values": 1e-4}, 1.0, 0.0)
    assert (pre.optim.name, pre.optim.lr, pre.optim.weight_decay, pre.model.drop_path_rate) == ("lamb", 3e-3, 0.05, 0.2)
    assert (ft.data.image_size, ft.optim.name, ft.optim.lr, ft.train.epochs, ft.data.repeats) == (
        224,
        "adamw",
        1e-5,
        20,
        1,
    )
    assert (ft.augment.loss, ft.augment.label_smoothing, ft.data.randaugment) == ("ce", 0.1, "rand-m9-mstd0.5-inc1")
    assert (big.train.global_batch, big.optim.lr, big.schedule.warmup_epochs) == (32768, 1.2e-2, 20)
    # DeiT's code beyond its README: 0.2 drop path in every block, bicubic crops, min_lr 1e-5 (= the fine-tune's lr)
    assert (pre.model.drop_path_schedule, pre.data.train_interpolation) == ("uniform", "bicubic")
    assert [c.optim.lr * c.schedule.min_lr_ratio for c in (pre, ft, big)] == pytest.approx([1e-5] * 3)
    n = 1_281_167
    assert make_plan(pre, 8, n).phases[0].accum_steps == 1 and make_plan(ft, 8, n).phases[0].accum_steps == 1
    assert [make_plan(big, w, n).phases[0].accum_steps for w in (8, 128)] == [16, 1]


def test_a_bce_threshold_below_the_smoothed_value_is_refused():
    """Smoothing puts label_smoothing / num_classes on every class: a threshold below it makes every target 1."""
    with pytest.raises(UserError, match=r"augment.bce_target_thresh=0.0 is below what augment.label_smoothing=0.1"):
        load_config(
            recipe("demo_digits"), ["augment.loss=bce", "augment.bce_target_thresh=0.0", "augment.label_smoothing=0.1"]
        )
    cfg = load_config(
        recipe("demo_digits"), ["augment.loss=bce", "augment.bce_target_thresh=0.2", "augment.label_smoothing=0.1"]
    )
    assert cfg.augment.bce_target_thresh == 0.2


# Forms without shell metacharacters: what survives `colossalai run`'s unquoted `bash -c` (tested
# through the real launcher in tests/e2e/test_launchers.py).


def test_tuples_and_lists_are_written_with_commas_only():
    cfg = load_config(recipe("demo_digits"), ["optim.betas=0.9,0.98", "data.mean=0.5,0.5,0.5", "data.crop_scale=0.5,1"])
    assert cfg.optim.betas == (0.9, 0.98) and cfg.data.mean == (0.5, 0.5, 0.5) and cfg.data.crop_scale == (0.5, 1.0)


def test_dict_entries_are_set_by_dotted_key_and_keep_the_others():
    cfg = load_config(
        recipe("demo_digits"),
        [
            "model.kwargs.depth=2",
            "model.kwargs.embed_dim=48",
            "model.kwargs.class_token=false",
            "model.kwargs.global_pool=avg",
        ],
    )
    assert cfg.model.kwargs == dict(
        patch_size=4, embed_dim=48, depth=2, num_heads=3, class_token=False, global_pool="avg"
    )
    assert type(cfg.model.kwargs["depth"]) is int
    assert load_recipe(recipe("demo_digits")).model.kwargs["depth"] == 4  # the recipe's own dict is not edited


def test_phases_are_set_by_indexed_keys():
    cfg = load_config(
        recipe("demo_digits_progressive"),
        [
            "train.phases.1.image_size=8",
            "train.phases.2.crop_scale=0.5,1",
            "train.phases.3.epoch=50",
            "train.phases.3.micro_batch=8",
        ],
    )
    listed = cfg.to_dict()["train"]["phases"]  # the entries' keys as set (meta.json's form)
    assert listed[1] == {"epoch": 20, "image_size": 8, "micro_batch": 32}
    assert cfg.train.phases[2].crop_scale == (0.5, 1)
    assert listed[3] == {"epoch": 50, "micro_batch": 8}  # index == length adds a phase
    built = load_config(
        recipe("demo_digits"),
        [
            "train.phases.0.epoch=0",
            "train.phases.0.image_size=8",
            "train.phases.1.epoch=30",
            "train.phases.1.image_size=16",
        ],
    )
    assert built.to_dict()["train"]["phases"] == [{"epoch": 0, "image_size": 8}, {"epoch": 30, "image_size": 16}]


def test_phases_are_typed_entries_that_keep_the_dict_form_a_checkpoint_saved():
    """After validation ``train.phases`` holds `PhaseEntry`s (None where a phase inherits); `Config.to_dict` (meta.json)
    writes the keys each entry set, as the recipe wrote them, so an old checkpoint's config compares equal; dotted
    overrides edit a validated config's entries as they edit a recipe's dicts."""
    written = load_recipe(recipe("demo_digits_progressive")).to_dict()["train"]["phases"]
    cfg = load_config(recipe("demo_digits_progressive"))
    assert all(isinstance(p, PhaseEntry) for p in cfg.train.phases)
    assert cfg.train.phases[0].global_batch is None and cfg.train.phases[2].crop_scale == (0.8, 1.0)
    assert (
        cfg.to_dict()["train"]["phases"]
        == written
        == [
            {"epoch": 0, "image_size": 8, "micro_batch": 64},
            {"epoch": 20, "image_size": 12, "micro_batch": 32},
            {"epoch": 36, "image_size": 16, "micro_batch": 16, "crop_scale": (0.8, 1.0)},
        ]
    )
    # An explicit None is a key the recipe set: kept (a dict list kept it).
    listed = [{"epoch": 0, "image_size": 8, "lr": None}, {"epoch": 30.5, "lr": (1e-3, 1e-4)}]
    cfg = load_config(recipe("demo_digits"), [f"train.phases={listed}"])
    assert cfg.to_dict()["train"]["phases"] == listed and cfg.train.phases[1].lr == (1e-3, 1e-4)
    apply_override(cfg, "train.phases.1.image_size=16")
    validate(cfg)
    assert cfg.to_dict()["train"]["phases"][1] == {"epoch": 30.5, "lr": (1e-3, 1e-4), "image_size": 16}
    assert isinstance(cfg.train.phases[1], PhaseEntry) and cfg.train.phases[1].image_size == 16


@pytest.mark.parametrize(
    "item, match",
    [
        (
            "train.phases.5.epoch=3",
            r"^command line: 'train.phases.5.epoch=3': train.phases has 3 entries; "
            r"use an index from 0 to 3 \(3 adds one\)$",
        ),
        ("train.phases.x.epoch=3", r"^command line: 'train.phases.x.epoch=3': 'x' is not an index"),
        (
            "train.phases.1.imagesize=8",
            r"^command line: unknown phase key 'imagesize' in 'train.phases.1.imagesize'; "
            r"did you mean 'image_size'\?",
        ),
        ("model.kwargs.depth.x=1", r"^command line: 'model.kwargs.depth.x=1': model.kwargs.depth is 4, not a dict"),
    ],
)
def test_bad_indexed_keys_are_one_line(item, match):
    cfg = load_recipe(recipe("demo_digits_progressive"))
    before = cfg.to_dict()
    with pytest.raises(UserError, match=match) as e:
        apply_override(cfg, item)
    assert "\n" not in str(e.value) and cfg.to_dict() == before


def test_an_overrides_file_in_python_is_read_as_data(tmp_path):
    f = tmp_path / "small.py"
    f.write_text(
        '"""Tiny model, two phases: assignments of literals, read, never run."""\n'
        "optim.betas = (0.9, 0.98)\n"
        "model.kwargs = {'patch_size': 4, 'embed_dim': 32, 'depth': 2, 'num_heads': 2}\n"
        "train.phases = [{'epoch': 0, 'image_size': 8}, {'epoch': 30, 'image_size': 16}]\n"
        "train.phases[1]['micro_batch'] = 8\n"
        "train.compile = 'off'\n"
        "workdir = 'runs/small'\n"
    )
    cfg = load_config(recipe("demo_digits"), ["optim.lr=0.01"], override_files=[f])
    assert cfg.optim.betas == (0.9, 0.98) and cfg.model.kwargs["depth"] == 2 and cfg.workdir == "runs/small"
    assert cfg.to_dict()["train"]["phases"] == [
        {"epoch": 0, "image_size": 8},
        {"epoch": 30, "image_size": 16, "micro_batch": 8},
    ]
    assert cfg.optim.lr == 0.01
    # The command line wins over the file.
    assert load_config(recipe("demo_digits"), ["workdir=runs/cli"], override_files=[f]).workdir == "runs/cli"


@pytest.mark.parametrize(
    "text, match",
    [
        ("import os\n", r"small.py:1: not an assignment 'dotted.key = value'"),
        ("optim.lr = 0.001 * 2\n", r"small.py:1: the value of optim.lr is not a literal"),
        ("optim.lrr = 0.1\n", r"small.py: unknown config key 'optim.lrr'; did you mean 'optim.lr'\?"),
        ("train.micro_batch = 'x'\n", r"small.py: 'train.micro_batch=x' is not an int"),
        ("train.micro_batch = 0\n", r"small.py: 'train.micro_batch' must be positive"),
        ("optim.lr = (\n", r"small.py:1: not Python"),
    ],
)
def test_a_bad_overrides_file_is_one_line_naming_it(tmp_path, text, match):
    f = tmp_path / "small.py"
    f.write_text(text)
    with pytest.raises(UserError, match=match) as e:
        load_config(recipe("demo_digits"), override_files=[f])
    assert "\n" not in str(e.value)


def test_an_overrides_file_in_yaml(tmp_path):
    pytest.importorskip("yaml")
    f = tmp_path / "small.yaml"
    f.write_text(
        "optim:\n  betas: [0.9, 0.98]\n  lr: 1e-3\n"
        "model.kwargs: {depth: 2}\n"
        "train:\n  compile: off\n  phases:\n    - {epoch: 0, image_size: 8}\n    - {epoch: 30, image_size: 16}\n"
    )
    cfg = load_config(recipe("demo_digits"), override_files=[f])
    assert cfg.optim.betas == (0.9, 0.98) and cfg.optim.lr == 1e-3 and cfg.model.kwargs["depth"] == 2
    assert cfg.train.compile == "off" and cfg.train.phases[1].to_dict() == {"epoch": 30, "image_size": 16}


def _doubling(lines: int) -> str:
    """YAML aliases that double at each line: 40 lines (under 1 kB) stand for 2**40 values."""
    rows = ["model:", "  kwargs:", "    a0: &a0 [x, x]"]
    return "\n".join(rows + [f"    a{i}: &a{i} [*a{i - 1}, *a{i - 1}]" for i in range(1, lines)]) + "\n"


@pytest.mark.parametrize(
    "name, text, match",
    [
        ("bomb.yaml", _doubling(40), r"bomb.yaml:3: an anchor or alias \(&name, \*name\); an overrides file writes"),
        ("cycle.yaml", "optim: &a {lr: 0.1, x: *a}\n", r"cycle.yaml:1: an anchor or alias"),
        ("merge.yaml", "base: &b {lr: 0.1}\noptim:\n  <<: *b\n", r"merge.yaml:1: an anchor or alias"),
        ("deep.yaml", "optim: " + "[" * 100 + "]" * 100 + "\n", r"deep.yaml:1: nested deeper than 32 levels"),
        ("wide.yaml", "model:\n  kwargs:\n    x: [" + "1, " * 2_000 + "]\n", r"wide.yaml:3: more than 2,000 values"),
        ("minus.py", "optim.lr = " + "-" * 100_000 + "1\n", r"minus.py: an expression nested too deeply to parse"),
        ("sum.py", "optim.lr = " + "1+" * 3_000 + "1\n", r"sum.py: an expression nested too deeply to parse"),
    ],
)
def test_an_overrides_file_that_would_flood_memory_or_the_stack_is_one_line(tmp_path, name, text, match):
    """Aliases (a doubling bomb, a cycle, a merge key), nesting past Python's stack, too many values: refused as
    the reader meets them, before any value is built (the bomb took 2.9 GiB at 23 lines and a MemoryError at 40;
    the cycle, the deep list and 1+1+... a RecursionError; the minus signs a MemoryError: tracebacks)."""
    f = tmp_path / name
    f.write_text(text)
    with pytest.raises(UserError, match=match) as e:
        load_config(recipe("demo_digits"), override_files=[f])
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "text, match",
    [
        (
            "optim:\n  lr: " + "1" * 5_000 + "\n",
            r"digits.yaml:2: '1{40}' is not a value YAML reads \(Exceeds the limit \(4300 digits\) for integer string "
            r"conversion: value has 5000 digits\); write a number, true/false or a quoted text$",
        ),
        ("optim:\n  lr: 2001-13-45\n", r"digits.yaml:2: '2001-13-45' is not a value YAML reads \(month must be in"),
        ("optim: {lr: !!int x}\n", r"digits.yaml:1: 'x' is not a value YAML reads \(invalid literal for int\(\)"),
    ],
)
def test_a_yaml_value_python_cannot_convert_is_one_line_naming_its_line(tmp_path, text, match):
    """Scalars YAML resolves to an int or a date that Python refuses to build (more than 4,300 digits, a 13th
    month, an explicit tag): a ValueError traceback from inside PyYAML otherwise."""
    pytest.importorskip("yaml")
    f = tmp_path / "digits.yaml"
    f.write_text(text)
    with pytest.raises(UserError, match=match) as e:
        load_config(recipe("demo_digits"), override_files=[f])
    assert "\n" not in str(e.value)


def test_a_missing_overrides_file_is_one_line(tmp_path):
    with pytest.raises(UserError, match=r"--overrides .*nothing.py does not exist"):
        load_config(recipe("demo_digits"), override_files=[tmp_path / "nothing.py"])


# Messages (issue 36, item 6): one line naming the override, not the recipe, and the form that works.


def test_a_dict_written_as_one_entry_is_one_line_with_both_forms():
    with pytest.raises(UserError) as e:
        apply_override(Config(), "model.kwargs=depth=2")
    assert str(e.value) == (
        "command line: 'model.kwargs=depth=2' is not a dict; set one entry as model.kwargs.depth=2, "
        "or give --overrides FILE"
    )


@pytest.mark.parametrize("text, value", [("true", "on"), ("false", "off"), ("on", "on"), ("auto", "auto")])
def test_on_off_keys_take_true_and_false(text, value):
    cfg = load_config(recipe("demo_digits"), [f"train.compile={text}", f"model.fused_attn={text}"])
    assert (cfg.train.compile, cfg.model.fused_attn) == (value, value)


def test_a_bad_choice_on_the_command_line_names_the_override_not_the_recipe():
    with pytest.raises(UserError) as e:
        load_config(recipe("demo_digits"), ["train.compile=maybe"])
    assert (
        str(e.value)
        == "command line: 'train.compile=maybe' is not one of auto, on, off; write it like train.compile=auto"
    )


def test_the_speed_settings_take_their_choices_and_name_them_when_wrong():
    cfg = load_config(
        recipe("demo_digits"),
        ["train.compile_scope=blocks", "train.activation_checkpointing=selective", "optim.implementation=foreach"],
    )
    assert (cfg.train.compile_scope, cfg.train.activation_checkpointing, cfg.optim.implementation) == (
        "blocks",
        "selective",
        "foreach",
    )
    with pytest.raises(UserError) as e:
        load_config(recipe("demo_digits"), ["train.activation_checkpointing=some"])
    assert str(e.value) == (
        "command line: 'train.activation_checkpointing=some' is not one of off, full, selective; write it like "
        "train.activation_checkpointing=off"
    )


def test_range_and_cross_field_errors_of_overrides_name_the_command_line():
    with pytest.raises(UserError, match=r"^command line: 'train.micro_batch' must be positive"):
        load_config(recipe("demo_digits"), ["train.micro_batch=0"])
    with pytest.raises(
        UserError, match=r"^command line: train.global_batch=128 is not a multiple of train.micro_batch=48"
    ):
        load_config(recipe("demo_digits"), ["train.micro_batch=48"])
    with pytest.raises(UserError, match=r"^command line: train.phases\[2\].epoch=36 is not after"):
        load_config(recipe("demo_digits_progressive"), ["train.phases.1.epoch=40"])


@pytest.mark.parametrize(
    "item, message",
    [
        ("train.micro_batch=abc", "'train.micro_batch=abc' is not an int; write it like train.micro_batch=256"),
        ("optim.lr=fast", "'optim.lr=fast' is not a number; write it like optim.lr=0.018"),
        ("data.hflip=maybe", "'data.hflip=maybe' is not true or false; write it like data.hflip=true"),
        (
            "optim.betas=0.9,x",
            "'optim.betas=0.9,x' is not numbers separated by commas; write it like optim.betas=0.9,0.999",
        ),
        ("data.label_offset=one", "'data.label_offset=one' is not an int; write it like data.label_offset=1 or none"),
    ],
)
def test_type_errors_read_as_english(item, message):
    with pytest.raises(UserError) as e:
        apply_override(Config(), item)
    assert str(e.value) == f"command line: {message}"


def test_a_shipped_recipe_loads_by_name_and_derived_ones_import_their_base_as_vitlarge_recipes():
    """``--config deit3_b16_32k``: the shipped recipes are the package ``vitlarge.recipes`` in a checkout and
    installed, and a derived one imports its base by that name (tests/e2e/test_install.py: installed)."""
    import vitlarge.recipes.vit_b16

    assert Path(vitlarge.recipes.vit_b16.__file__) == RECIPES / "vit_b16.py"
    assert load_recipe("deit3_b16_32k") == load_recipe(recipe("deit3_b16_32k"))
    assert load_recipe("deit3_b16_32k").train.global_batch == 32768


@pytest.mark.parametrize(
    "given, message",
    [
        ("vit_b61", "recipe vit_b61 does not exist; did you mean vit_b16?"),
        ("demo_digit", "recipe demo_digit does not exist; did you mean demo_digits?"),
        ("recipes/vit_l61.py", "recipe recipes/vit_l61.py does not exist; did you mean recipes/vit_l16.py?"),
        (
            "no_such_recipe",
            "recipe no_such_recipe: no shipped recipe has that name ("
            + ", ".join(sorted(p.stem for p in (ROOT / "recipes").glob("[!_]*.py")))
            + "); or pass a recipe file's path",
        ),
    ],
)
def test_a_mistyped_recipe_is_one_line_with_the_closest_name(given, message, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(UserError) as e:
        load_recipe(given)
    assert str(e.value) == message


def test_a_copy_of_any_shipped_recipe_loads_outside_recipes(tmp_path):
    """A user's recipe starts as a copy of a shipped one, in a folder of their own (not a package)."""
    for name in ALL_RECIPES:
        copy = tmp_path / f"my_{name}.py"
        copy.write_text((RECIPES / f"{name}.py").read_text())
        assert load_recipe(copy) == load_recipe(recipe(name)), name


def test_a_recipe_of_ones_own_derives_from_a_shipped_one_with_one_import(tmp_path):
    mine = tmp_path / "flowers.py"
    mine.write_text(
        "from vitlarge.recipes.demo_digits import config as base\n\n\n"
        "def config():\n    c = base()\n    c.data.num_classes = 5\n    c.workdir = 'runs/flowers'\n    return c\n"
    )
    cfg = load_config(mine)
    assert (cfg.data.num_classes, cfg.workdir, cfg.model.kwargs) == (
        5,
        "runs/flowers",
        load_recipe(recipe("demo_digits")).model.kwargs,
    )


def test_a_relative_import_outside_a_package_is_one_line_with_the_import_that_works(tmp_path):
    old_copy = tmp_path / "mine.py"
    old_copy.write_text("from .demo_digits import config as base\n\n\ndef config():\n    return base()\n")
    with pytest.raises(UserError) as e:
        load_recipe(old_copy)
    assert str(e.value) == (
        f"recipe {old_copy}: line 1, 'from .demo_digits import config as base', is a relative import, which works "
        "only inside recipes/; import the shipped recipe by its full name: from vitlarge.recipes.demo_digits "
        "import config as base"
    )
    own = tmp_path / "own.py"
    own.write_text("import os\nfrom .common import config\n")
    with pytest.raises(UserError) as e:
        load_recipe(own)
    assert str(e.value) == (
        f"recipe {own}: line 2, 'from .common import config', is a relative import, which works only inside a "
        f"package; import by the full name (from vitlarge.recipes.vit_b16 import config), or put an __init__.py "
        f"in {tmp_path}"
    )


def test_a_profile_window_is_a_start_end_pair_of_optimizer_steps():
    assert Config().train.profile_steps is None  # off by default
    assert load_config(recipe("demo_digits"), ["train.profile_steps=100-105"]).train.profile_steps == "100-105"
    assert parse_step_window("100-105") == (100, 105) and parse_step_window(" 7 - 7 ") == (7, 7)
    assert load_config(recipe("demo_digits"), ["train.profile_steps=none"]).train.profile_steps is None
    assert load_config(recipe("demo_digits"), ["train.max_steps=10", "train.profile_steps=5-10"]).train.max_steps == 10


@pytest.mark.parametrize(
    "items, message",
    [
        (
            ["train.profile_steps=100"],
            "train.profile_steps=100 is not a window START-END of optimizer steps; write it like "
            "train.profile_steps=100-105 (1-based, both ends included) or train.profile_steps=none",
        ),
        (
            ["train.profile_steps=a-b"],
            "train.profile_steps=a-b is not a window START-END of optimizer steps; write it like "
            "train.profile_steps=100-105 (1-based, both ends included) or train.profile_steps=none",
        ),
        (
            ["train.profile_steps=-3-5"],
            "train.profile_steps=-3-5 is not a window START-END of optimizer steps; write it like "
            "train.profile_steps=100-105 (1-based, both ends included) or train.profile_steps=none",
        ),
        (
            ["train.profile_steps=105-100"],
            "train.profile_steps=105-100 ends before it starts; write the first step first, like "
            "train.profile_steps=100-105",
        ),
        (
            ["train.profile_steps=0-5"],
            "train.profile_steps=0-5 starts at step 0, but optimizer steps count from 1; write it like "
            "train.profile_steps=1-5",
        ),
        (
            ["train.profile_steps=100-200"],
            "train.profile_steps=100-200 records 101 steps; a window holds at most 20 (every event of every rank "
            "stays in host memory until the window ends), like train.profile_steps=100-119",
        ),
        (
            ["train.max_steps=10", "train.profile_steps=8-12"],
            "train.profile_steps=8-12 ends after step 10, the run's last (train.max_steps=10); end the window "
            "by step 10 or raise train.max_steps",
        ),
    ],
)
def test_a_bad_profile_window_is_one_line_naming_the_key_and_the_fix(items, message):
    with pytest.raises(UserError) as e:
        load_config(recipe("demo_digits"), items)
    assert str(e.value) == f"command line: {message}"


def test_a_recipes_bad_profile_window_names_the_recipe(tmp_path):
    path = tmp_path / "r.py"
    path.write_text(
        "from recipes.demo_digits import config as base\n\n\n"
        "def config():\n    c = base()\n    c.train.profile_steps = '5'\n    return c\n"
    )
    with pytest.raises(UserError, match=rf"^{path}: train.profile_steps=5 is not a window START-END"):
        load_config(path)


# Experiment trackers (issue 33): refused before the rendezvous in one line naming the key and the fix.


@pytest.mark.parametrize(
    "uri, why",
    [
        ("htp://127.0.0.1:5000", "scheme 'htp'"),
        ("127.0.0.1:5000", "no scheme"),
        ("http://127.0.0.1:50x0", "not a URI"),
        ("http:///path", "needs a host"),
        ("sqlite://", "needs a file"),
    ],
)
def test_a_malformed_mlflow_uri_is_one_line_naming_the_key_and_the_fix(uri, why):
    with pytest.raises(UserError) as e:
        load_config(recipe("demo_digits"), ["log.mlflow=true", f"log.mlflow_uri={uri}"])
    line = str(e.value)
    assert "\n" not in line and line.startswith("command line: log.mlflow_uri=") and why in line, line
    assert "log.mlflow_uri=http://127.0.0.1:5000" in line  # the fix


@pytest.mark.parametrize(
    "uri",
    [
        "http://127.0.0.1:5000",
        "https://mlflow.example.org/x",
        "sqlite:///runs/m.db",
        "postgresql+psycopg2://u@h/db",
        "databricks",
    ],
)
def test_well_formed_mlflow_uris_pass(uri):
    assert load_config(recipe("demo_digits"), ["log.mlflow=true", f"log.mlflow_uri={uri}"]).log.mlflow_uri == uri


def test_mlflows_file_store_is_refused_unless_mlflow_allows_it(monkeypatch):
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with pytest.raises(UserError) as e:  # MLflow >= 3.13 refuses it at runtime: the run would be untracked
        load_config(recipe("demo_digits"), ["log.mlflow=true", "log.mlflow_uri=file:///runs/mlruns"])
    line = str(e.value)
    assert "\n" not in line and line.startswith("command line: log.mlflow_uri='file:///runs/mlruns': "), line
    assert "MLFLOW_ALLOW_FILE_STORE=true" in line and "sqlite:///" in line, line
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    cfg = load_config(recipe("demo_digits"), ["log.mlflow=true", "log.mlflow_uri=file:///runs/mlruns"])
    assert cfg.log.mlflow_uri == "file:///runs/mlruns"


def test_a_malformed_mlflow_tracking_uri_variable_is_named_when_mlflow_is_on(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "localhost:5000")
    assert not load_config(recipe("demo_digits")).log.mlflow  # off: the variable is not ours to check
    with pytest.raises(UserError, match=r"^MLFLOW_TRACKING_URI='localhost:5000' \(used by log.mlflow=true\)"):
        load_config(recipe("demo_digits"), ["log.mlflow=true"])


@pytest.mark.parametrize("package, key", [("mlflow", "log.mlflow"), ("wandb", "log.wandb")])
def test_a_tracker_that_is_not_installed_is_one_line_naming_the_key_and_the_requirements(monkeypatch, package, key):
    from tests.helpers.block_imports import Blocker

    monkeypatch.delitem(sys.modules, package, raising=False)  # find_spec answers from sys.modules first
    monkeypatch.setattr(sys, "meta_path", [Blocker([package]), *sys.meta_path])
    load_config(recipe("demo_digits"), [f"{key}=false"])  # off: not needed
    with pytest.raises(UserError) as e:
        load_config(recipe("demo_digits"), [f"{key}=true"])
    assert str(e.value) == (
        f"command line: {key}=true but the {package} package is not installed; "
        f"pip install -r requirements/trackers.txt or set {key}=false"
    )


def test_the_experiment_is_the_recipes_name_unless_set():
    assert load_config(recipe("demo_digits")).log.experiment == "demo_digits"
    assert load_config(recipe("demo_digits"), ["log.experiment=pretrain-b16"]).log.experiment == "pretrain-b16"


@pytest.mark.parametrize(
    "name, text, key",
    [
        ("hex.py", "optim.lr = 0x" + "f" * 5000 + "\n", "optim.lr"),  # a hex literal escapes the 4,300-digit limit
        ("hex.yaml", "train: {epochs: 0x" + "f" * 5000 + "}\n", "train.epochs"),
        ("phase.py", 'train.phases = [{"epoch": 0, "image_size": 0x' + "f" * 5000 + "}]\n", "train.phases"),
    ],
)
def test_an_integer_no_setting_could_hold_is_one_short_line(tmp_path, name, text, key):
    """Before: OverflowError in float() or the digit limit's ValueError in a message, a traceback each."""
    f = tmp_path / name
    f.write_text(text)
    with pytest.raises(UserError) as e:
        load_config(RECIPES / "demo_digits.py", override_files=[f])
    assert str(e.value) == f"{f}: {key} holds an integer of 20,000 bits (more than 63); no setting is that large"


def test_a_read_back_config_with_a_huge_integer_is_one_line_and_a_long_override_is_shown_short(tmp_path):
    from vitlarge.config.checks import check_read_back

    cfg = load_recipe(RECIPES / "demo_digits.py")
    cfg.train.epochs = 10**4000  # JSON carries 4,000 digits into a checkpoint's meta.json
    with pytest.raises(UserError) as e:
        check_read_back(cfg, "meta.json's config")
    assert (
        str(e.value)
        == "meta.json's config: 'train.epochs' holds an integer of 13,288 bits (more than 63); fix the recipe or override"
    )
    with pytest.raises(UserError) as e:
        load_config(RECIPES / "demo_digits.py", ["optim.lr=0x" + "f" * 5000])
    assert str(e.value) == (
        "command line: 'optim.lr=0x"
        + "f" * 58
        + "... (5,002 characters)' is not a number; write it like optim.lr=0.018"
    )
    nul = tmp_path / "nul.py"
    nul.write_bytes(b"optim.lr = 1\x00\n")
    with pytest.raises(UserError) as e:
        load_config(RECIPES / "demo_digits.py", override_files=[nul])
    assert str(e.value).startswith(f"{nul}: not Python (")  # no ':None' where the parser has no line


@pytest.mark.parametrize(
    "item, expect",
    [
        ("data.std=0,0,0", "'data.std' must be three numbers in [0.01, 10] (pixels are 0..1), got (0.0, 0.0, 0.0)"),
        ("data.std=1e-30,1e-30,1e-30", "'data.std' must be three numbers in [0.01, 10]"),  # "top-1 9.72%, loss nan"
        ("data.std=0.5,0.5", "'data.std' must be three numbers in [0.01, 10]"),
        ("data.mean=2,0,0", "'data.mean' must be three numbers in [0, 1] (pixels are 0..1)"),
        ("data.image_size=4096", "'data.image_size' must be positive and at most 1,024, got 4096"),
    ],
)
def test_normalisation_and_image_sizes_are_held_to_the_schemas_bounds(item, expect):
    """The bounds every file from elsewhere is checked against too (a checkpoint's meta.json, an export's
    config.json: issue 56); the recipe's own check refuses a std that divides the pixels into nan."""
    with pytest.raises(UserError) as e:
        load_config(recipe("demo_digits"), [item])
    assert expect in str(e.value) and "\n" not in str(e.value)


def test_phase_sizes_and_the_phase_count_are_held_to_the_schemas_bounds():
    from vitlarge.config.schema import MAX_PHASES

    with pytest.raises(UserError, match=r"train.phases\[1\].eval_size=16384 must be positive and at most 1,024"):
        load_config(recipe("demo_digits_progressive"), ["train.phases.1.eval_size=16384"])
    cfg = load_config(recipe("demo_digits"))
    cfg.train.phases = [{"epoch": i / 1000} for i in range(MAX_PHASES + 1)]
    with pytest.raises(UserError, match=r"train.phases holds 1,025 entries, more than 1,024; a phase list names"):
        validate(cfg)
    cfg.train.phases = cfg.train.phases[:MAX_PHASES]
    validate(cfg)  # the cap itself is a phase list


@pytest.mark.parametrize(
    "phases",
    [
        [{"epoch": 0, "image_size": 96, "eval_size": 224}, {"epoch": 150, "image_size": 176, "eval_size": 224}],
        [{"epoch": 0, "image_size": 112, "eval_size": 288}, {"epoch": 200, "image_size": 224, "eval_size": 288}],
        "progressive(c, initial_scale=0.25)",  # the docs' helper, every phase evaluated at 224
    ],
    ids=["96 evaluated at 224", "112 evaluated at 288", "progressive at a quarter"],
)
def test_a_phase_evaluates_at_any_size_within_the_cap_and_plans(phases):
    """Progressive training validates its small phases at the final size (fast.ai: 128 px evaluated at 224):
    a phase's eval_size is bounded by `MAX_IMAGE_SIZE` alone, not by a ratio to its image_size."""
    from vitlarge.config.phase_list import progressive
    from vitlarge.plan.plan import make_plan

    cfg = load_config(recipe("vit_b16"))
    if isinstance(phases, str):
        phases = [{**p, "eval_size": 224} for p in progressive(cfg, initial_scale=0.25)]
    cfg.train.phases = phases
    validate(cfg)
    plan = make_plan(cfg, 8)
    assert plan.phases[0].image_size < 128 and plan.phases[0].eval_size >= 224


def test_a_recipes_folder_never_goes_on_the_import_path(tmp_path, monkeypatch):
    """``--config D/myrecipes/mine.py`` put D first on ``sys.path``, so a ``D/timm.py`` (any name imported later)
    ran instead of the package. A recipe of one's own is loaded from its file alone; one in a folder with an
    ``__init__.py`` imports its siblings relatively (``from .common import ...``), and neither folder is searched for
    any other import."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    planted = "_vitlarge_planted_by_a_recipe_folder"
    for d in (tmp_path, tmp_path / "myrecipes", tmp_path / "pkg"):
        d.mkdir(exist_ok=True)
        (d / f"{planted}.py").write_text("raise SystemExit('planted module ran')\n")
    mine = tmp_path / "myrecipes" / "mine.py"
    mine.write_text("from vitlarge.recipes.demo_digits import config as base\n\n\ndef config():\n    return base()\n")
    assert load_recipe(mine) == load_recipe(recipe("demo_digits"))
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "common.py").write_text("EPOCHS = 7\n")
    (tmp_path / "pkg" / "mine.py").write_text(
        "from vitlarge.recipes.demo_digits import config as base\n\nfrom .common import EPOCHS\n\n\n"
        "def config():\n    c = base()\n    c.schedule.total_epochs = EPOCHS\n    return c\n"
    )
    assert load_recipe(tmp_path / "pkg" / "mine.py").schedule.total_epochs == 7
    assert not {str(tmp_path), str(tmp_path / "myrecipes"), str(tmp_path / "pkg")} & set(sys.path)
    assert importlib.util.find_spec(planted) is None


@pytest.mark.parametrize("statement", ["from myrecipes.common import EPOCHS", "from common import EPOCHS"])
def test_a_recipe_importing_a_sibling_through_its_folder_is_told_the_fix(tmp_path, monkeypatch, statement):
    """``from myrecipes.common import ...`` (or ``from common import ...``) in ``D/myrecipes/mine.py`` resolved while
    the loader put the folder on ``sys.path``; it no longer does (a planted module there ran), so the one line says
    how such a recipe imports its sibling now, and the sibling (and any planted module) stays off the path."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    folder = tmp_path / "myrecipes"
    folder.mkdir()
    (folder / "common.py").write_text("EPOCHS = 7\n")
    (folder / "mine.py").write_text(f"{statement}\n\n\ndef config():\n    return None\n")
    with pytest.raises(UserError) as e:
        load_recipe(folder / "mine.py")
    assert str(e.value) == (
        f"recipe {folder / 'mine.py'} failed to load: ModuleNotFoundError: No module named "
        f"'{statement.split()[1].split('.')[0]}'; add an __init__.py to {folder} and import it as "
        "`from .common import ...` (vitlarge puts no recipe folder on sys.path; docs/RECIPES.md)"
    )
    assert importlib.util.find_spec("common") is None and str(folder) not in sys.path
    (folder / "__init__.py").write_text("")
    (folder / "mine.py").write_text(
        "from vitlarge.recipes.demo_digits import config as base\n\nfrom .common import EPOCHS\n\n\n"
        "def config():\n    c = base()\n    c.schedule.total_epochs = EPOCHS\n    return c\n"
    )
    assert load_recipe(folder / "mine.py").schedule.total_epochs == 7, "the fix the line gives works"


def test_a_recipe_missing_another_module_gets_no_sibling_hint(tmp_path):
    f = tmp_path / "mine.py"
    f.write_text("import does_not_exist_anywhere\n")
    with pytest.raises(UserError) as e:
        load_recipe(f)
    assert "__init__" not in str(e.value) and "does_not_exist_anywhere" in str(e.value)
