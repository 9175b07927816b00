"""``--dry-run`` in process: the plan for any ``--world-size``, printed once, naming the recipe's optimizer; a
fine-tuning's missing ``model.init_from`` is a warning there (an error in a run).

Each test runs in an empty folder of its own (`in_an_empty_folder`): a recipe's relative ``data.path`` and
``workdir`` (``data/digits``, ``runs/demo_digits``) resolve there, not in the checkout, where ``make demo`` leaves
its data and run; `dry_run` names an absent ``--data`` where a test gives none (vit_b16's ``/data/...`` is
absolute), so the plan is the recipe's whatever the machine holds."""

from __future__ import annotations

import pytest

from tests.helpers import ROOT
from vitlarge.config.load import load_config
from vitlarge.distributed.launcher import DistEnv
from vitlarge.distributed.threads import NO_THREADS
from vitlarge.errors import UserError
from vitlarge.run import cli
from vitlarge.run.job import init_from_warnings

ONE_PROCESS = DistEnv(rank=0, world_size=1, local_rank=0, master_addr="127.0.0.1", master_port=29500, source="none")


@pytest.fixture(autouse=True)
def in_an_empty_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def dry_run(capsys, *args: str) -> tuple[str, str]:
    data = () if "--data" in args else ("--data", "absent")
    assert cli.plan_or_train(cli.parse_args(["--dry-run", *data, *args]), ONE_PROCESS, NO_THREADS) == 0
    out = capsys.readouterr()
    return out.out, out.err


def test_world_size_plans_for_n_processes_and_the_batch_arithmetic_is_printed_once(capsys):
    out, err = dry_run(capsys, "--config", str(ROOT / "recipes" / "vit_b16.py"), "--world-size", "4")
    assert out.count("32768 = ") == 1, out
    assert "global batch 32768 = 256 (micro) x 32 (accumulation) x 4 (devices)" in out
    assert "train.plugin=ddp, 4 devices" in out and "LAMB states" in out
    assert "resolved config" not in out and out.startswith("plan:"), out[:300]  # the JSON is --show-config's
    assert err == ""


def test_show_config_prints_the_resolved_config_first(capsys):
    out, _ = dry_run(capsys, "--config", str(ROOT / "recipes" / "vit_b16.py"), "--show-config")
    assert out.startswith("resolved config:\n{") and '"global_batch": 32768' in out and "plan:" in out


def test_world_size_goes_with_dry_run():
    for argv in (["--world-size", "8"], ["--dry-run", "--world-size", "0"], ["--show-config"]):
        with pytest.raises(SystemExit) as e:
            cli.parse_args(["--config", str(ROOT / "recipes" / "vit_b16.py"), *argv])
        assert e.value.code == 2


def test_a_fine_tuning_plans_before_its_init_from_exists_and_names_adamw(capsys):
    """deit3_b16_ft224.py fine-tunes runs/deit3_b16/model, which the pretraining writes at its end."""
    out, err = dry_run(
        capsys, "--config", str(ROOT / "recipes" / "deit3_b16_ft224.py"), "model.init_from=/nonexistent/model"
    )
    assert err == (
        "warning: model.init_from=/nonexistent/model does not exist yet; the run needs it (a pretraining's export, "
        "<workdir>/model, or a checkpoint)\n"
    )
    assert "AdamW states" in out and "LAMB" not in out


def test_a_missing_init_from_is_still_an_error_outside_a_dry_run():
    cfg = load_config(ROOT / "recipes" / "deit3_b16_ft224.py", ["model.init_from=/nonexistent/model"])
    with pytest.raises(UserError, match="model.init_from=/nonexistent/model does not exist"):
        init_from_warnings(cfg, resuming=False)
    assert init_from_warnings(cfg, resuming=True) == []  # a resume takes its weights from the checkpoint


def test_the_memory_estimate_adds_the_gpus_own_needs_as_stated_constants(capsys):
    """Issue 31 item 5: the CUDA context, NCCL's buffers and DALI's pool, each with where its number comes from."""
    out, _ = dry_run(capsys, "--config", str(ROOT / "recipes" / "vit_b16.py"), "--world-size", "64")
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  memory per device"))
    assert lines[at].endswith("total 22.7 GiB")
    assert lines[at + 1 : at + 5] == [
        "  on a GPU add (stated constants, vitlarge/run/dry_run.py; not in the memory above): CUDA context and kernels "
        "1.0 GiB, NCCL buffers 1.0 GiB, DALI pool 633.4 MiB; about 25.3 GiB per GPU",
        "    CUDA context and kernels: 527 MiB measured at the first CUDA call on an H200, 767 MiB once the kernels "
        "a ViT uses loaded",
        "    NCCL buffers: 558 MiB measured at world size 1 on an H200 + 512 MiB for peers (2 ring peers x 32 "
        "channels x 2 protocols x NCCL_BUFFSIZE 4 MiB; not measured)",
        "    DALI pool: 2 batches ready x 256 images x (a decoded 469x387 px JPEG + its 224 px crop and fp32 output); "
        "DALI keeps its pool's peak",
    ]
    # One process on synthetic data: NCCL all the same (DDP's all-reduce makes its communicator), no DALI pool;
    # a CPU run: no GPU line at all.
    from vitlarge.plan.plan import make_plan
    from vitlarge.run.dry_run import gpu_overheads, print_gpu_overheads
    from vitlarge.train.settings import plan_settings

    cfg = load_config(ROOT / "recipes" / "vit_b16.py", ["data.source=synthetic"])
    assert [what for what, _, _ in gpu_overheads(cfg, make_plan(cfg, 1))] == [
        "CUDA context and kernels",
        "NCCL buffers",
    ]
    cfg = load_config(ROOT / "recipes" / "vit_b16.py", ["train.device=cpu"])
    print_gpu_overheads(cfg, make_plan(cfg, 4), plan_settings(cfg, "cpu"), 0.0)
    assert capsys.readouterr().out == ""


def test_a_profile_window_after_the_plans_last_step_stops_the_dry_run_as_it_would_the_run(capsys, tmp_path):
    recipe, data = str(ROOT / "recipes" / "demo_digits.py"), str(tmp_path / "absent")
    argv = ["--dry-run", "--config", recipe, "--data", data, "train.profile_steps=655-665"]
    with pytest.raises(UserError, match=r"^train.profile_steps=655-665 ends after step 660, the run's last"):
        cli.plan_or_train(cli.parse_args(argv), ONE_PROCESS, NO_THREADS)
    out, _ = dry_run(capsys, "--config", recipe, "--data", data, "train.profile_steps=655-660")
    assert out.startswith("plan:")


def test_the_plan_names_its_device_and_the_precision_a_run_there_resolves(capsys):
    """Issue 34 item 3: the dry run resolves ``auto`` for the device it plans for, a CUDA plan on a machine without
    a GPU included, and says which; the memory estimate follows (fp32 activations take twice bf16's)."""
    import torch

    from vitlarge.model.precision import choose_precision

    demo = str(ROOT / "recipes" / "demo_digits.py")  # train.precision=auto, train.device=auto
    out, _ = dry_run(capsys, "--config", demo)
    device = next(line for line in out.splitlines() if line.startswith("  device "))
    assert device.startswith(
        "  device cuda (train.device=auto: the GPUs a launch takes; --device cpu plans for the CPU)"
    )
    if not torch.cuda.is_available():
        assert device.endswith(
            "precision bf16 (precision auto -> bf16: assumed a GPU with bf16 tensor cores (compute capability 8.0+: "
            "A100, H100, H200); none is visible here)"
        )
    out_cpu, _ = dry_run(capsys, "--config", demo, "--device", "cpu")
    on_cpu = choose_precision("auto", torch.device("cpu"))[0]
    assert f"  device cpu (--device), precision {on_cpu} (precision auto -> {on_cpu}: " in out_cpu
    memory = [next(x for x in o.splitlines() if x.startswith("  memory per device")) for o in (out, out_cpu)]
    assert (memory[0] == memory[1]) == (on_cpu != "fp32")
    assert "on a GPU add" in out and "on a GPU add" not in out_cpu
    out, _ = dry_run(capsys, "--config", str(ROOT / "recipes" / "vit_b16.py"))  # the recipe's own fp16: no reason
    assert (
        "  device cuda (train.device=auto: the GPUs a launch takes; --device cpu plans for the CPU), precision fp16\n"
        in out
    )
    with pytest.raises(SystemExit):
        cli.parse_args(["--config", demo, "--device", "cpu"])


def _data_set(tmp_path, train: int, classes: int) -> str:
    """A data folder whose dataset.json lists ``train`` training and 36 validation records in ``classes`` classes
    (the dry run reads dataset.json alone: no shard is written)."""
    from vitlarge.data.manifest import ClassInfo, Manifest, ShardInfo, write_manifest

    shard = lambda split, n: [ShardInfo(f"{split}-00000-of-00001", f"{split}-00000-of-00001.idx", n, 100 * n)]  # noqa: E731
    write_manifest(
        Manifest(
            num_classes=classes,
            label_offset=0,
            classes=[ClassInfo(i, f"c{i}") for i in range(classes)],
            splits={"train": shard("train", train), "validation": shard("validation", 36)},
        ),
        str(tmp_path),
    )
    return str(tmp_path)


def test_with_data_it_plans_from_dataset_json_as_the_run_does(capsys, tmp_path):
    """The recipe says 1,437 training images (11 steps per epoch at 128); the data holds 600 (4 per epoch): the plan
    is the run's, and says where its counts come from."""
    data = _data_set(tmp_path, 600, 10)
    out, _ = dry_run(capsys, "--config", str(ROOT / "recipes" / "demo_digits.py"), "--data", data)
    assert out.startswith(f"data: {data}/dataset.json: 600 training images, 10 classes (the plan's counts)\n"), out
    assert "4 steps/epoch, 240 steps, 20 warmup steps" in out and "over 600 images" in out


def test_with_data_a_class_count_that_does_not_match_is_the_runs_one_line(capsys, tmp_path):
    data = _data_set(tmp_path, 600, 10)
    with pytest.raises(UserError) as e:
        dry_run(capsys, "--config", str(ROOT / "recipes" / "demo_digits.py"), "--data", data, "data.num_classes=12")
    assert str(e.value) == f"{data}/dataset.json has 10 classes but data.num_classes=12; set data.num_classes=10"


def test_without_the_data_here_it_plans_from_the_recipe(capsys, tmp_path):
    out, _ = dry_run(capsys, "--config", str(ROOT / "recipes" / "demo_digits.py"), "--data", str(tmp_path / "none"))
    assert out.startswith("plan:") and "11 steps/epoch, 660 steps" in out


def test_a_fine_tuning_says_what_init_from_does_to_the_head_and_position_embedding(capsys, tmp_path):
    """Issue 55 item 6: the plan names what the run will do with ``model.init_from`` (read from the source's shapes:
    `vitlarge.checkpoint.init_from.plan_notes`); a resume does not read it."""
    from vitlarge.checkpoint.export import export
    from vitlarge.model.vit import build_model

    demo = load_config(ROOT / "recipes" / "demo_digits.py")
    source = export(tmp_path / "src", build_model(demo, "cpu"), demo, [str(i) for i in range(10)])
    ft = str(ROOT / "recipes" / "demo_digits_ft24.py")
    out, err = dry_run(capsys, "--config", ft, f"model.init_from={source}", "data.num_classes=5")
    assert (
        err == ""
        and (
            f"  model.init_from {source}: classifier re-initialised: 10 classes in the source, 5 here; position "
            "embedding resampled from a 4x4 to a 6x6 token grid\n"
        )
        in out
    )
    out, _ = dry_run(capsys, "--config", ft, f"model.init_from={source}", "data.image_size=16")
    assert (
        f"  model.init_from {source}: classifier kept: 10 classes, as in the source; position embedding kept: a 4x4 "
        "token grid, as in the source\n"
    ) in out
    out, _ = dry_run(capsys, "--config", ft, f"model.init_from={source}", "--resume", str(tmp_path / "step_0000007"))
    assert (
        f"  model.init_from {source}: not read: the run resumes from its checkpoint, which holds the weights\n" in out
    )


def test_with_data_an_index_folder_of_a_tfds_folder_plans_from_its_counts(capsys, tmp_path):
    """``--dry-run --data <index folder>`` (``make_index <tfds folder> --out``): the plan's counts are the TFDS
    folder's, checked against dataset_info.json; rectangular validation passes (its sizes from the JPEG headers)."""
    from data_tools import make_index
    from tests.helpers.data_fixtures import small_tfds

    src = small_tfds(tmp_path / "tinynet" / "1.0.0")
    index = str(tmp_path / "index")
    make_index.make_index(src, out=index, workers=1)
    capsys.readouterr()
    out, _ = dry_run(
        capsys,
        *("--config", str(ROOT / "recipes" / "demo_digits.py"), "--data", index, "data.num_classes=3"),
        *("data.rect_val=true", "train.global_batch=4", "train.micro_batch=2"),
    )
    assert out.startswith(f"data: {index}/dataset.json: 6 training images, 3 classes (the plan's counts)\n"), out
