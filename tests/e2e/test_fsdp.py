"""train.plugin=fsdp end to end (vitlarge/distributed/fsdp.py, sharded_optim.py, sharded_checkpoint.py): real
processes (forked ranks, tests/helpers/forked.py) with gloo, real DALI, the demo recipe. (In one process: tests/unit/distributed/test_fsdp.py.)

Parity: 20 fp32 optimizer steps of the demo ViT with ``fsdp`` equal ``ddp`` to 1e-5 relative per
tensor at world size 2 and 3 (3 splits every tensor's rows unevenly, so some tensors are cut between
ranks and some ranks hold none of a tensor), and so do the clipped global gradient norms of every
step. Global batch 96 = 16 x 3 x 2 = 16 x 2 x 3, clipping at 1.0 active (norms ~2).
Resume: a kill -9 of the 2-rank fsdp run after a checkpoint, then the same command, ends bitwise
equal to the uninterrupted run (which is also the parity run: one run, several assertions).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from hooks.jsonl import read_metrics
from tests.helpers import launcher
from tests.helpers.fsdp import batches, built, recipe
from tests.helpers.launcher import assert_bitwise_equal, final_weights
from tests.helpers.runs import RECIPE, demo_args, metrics_has_step
from tests.helpers.spawn import exit_worker, free_port, spawn

STEPS = 20
RTOL = 1e-5


def train_args(data: str, workdir, *extra: str) -> list[str]:
    return demo_args(
        data,
        workdir,
        "train.precision=fp32",
        "train.global_batch=96",
        f"train.max_steps={STEPS}",
        "train.checkpoint_every_steps=8",
        "train.eval_every_epochs=0",
        *extra,
    )


@pytest.fixture(scope="module")
def runs(demo_data, tmp_path_factory) -> dict:
    """Workdirs of the four runs ``(plugin, world)``, one after the other."""
    out = {}
    for world in (2, 3):
        for plugin in ("ddp", "fsdp"):
            workdir = tmp_path_factory.mktemp(f"{plugin}{world}")
            r = launcher.run(train_args(demo_data, workdir, f"train.plugin={plugin}"), nproc=world)
            assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
            out[plugin, world] = workdir
    return out


def train_records(workdir) -> list[dict]:
    return [x for x in read_metrics(str(workdir / "metrics.jsonl")) if x["event"] == "train"]


@pytest.mark.parametrize("world", [2, 3])
def test_fsdp_equals_ddp_per_tensor_and_in_the_clipped_global_norm(runs, world):
    ddp, fsdp = final_weights(runs["ddp", world]), final_weights(runs["fsdp", world])
    assert ddp.keys() == fsdp.keys()
    worst = 0.0
    for k in ddp:
        rel = float((fsdp[k] - ddp[k]).norm() / ddp[k].norm().clamp_min(1e-12))
        worst = max(worst, rel)
        assert rel < RTOL, f"{k}: relative difference {rel:.2e} at world size {world}"
    print(f"world {world}: worst per-tensor relative difference {worst:.2e}")
    a, b = train_records(runs["ddp", world]), train_records(runs["fsdp", world])
    assert [x["step"] for x in b] == list(range(1, STEPS + 1))
    for x, y in zip(a, b):
        assert y["grad_norm"] == pytest.approx(x["grad_norm"], rel=RTOL), (x, y)
    assert sum(x["grad_norm"] > 1.0 for x in a) > STEPS // 2  # clipping (at 1.0) was active


def test_kill_9_then_the_same_command_ends_bitwise_equal(runs, demo_data, tmp_path):
    args = train_args(demo_data, tmp_path, "train.plugin=fsdp")
    proc = launcher.start(args, nproc=2, launcher="fork", log=tmp_path / "killed.log")
    try:
        assert launcher.wait_for(metrics_has_step(tmp_path, 11), 600, proc), (tmp_path / "killed.log").read_text()[
            -3000:
        ]
    finally:
        launcher.kill_tree(proc)  # SIGKILL, both ranks
        proc.wait(timeout=60)
    r = launcher.run(args, nproc=2)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "resumed from" in r.stdout + r.stderr and "step_0000008" in r.stdout + r.stderr
    assert_bitwise_equal(final_weights(tmp_path), final_weights(runs["fsdp", 2]))


def test_sharded_checkpoint_holds_one_shard_file_per_rank_and_a_timm_loadable_export(runs):
    import timm

    ckpt = runs["fsdp", 3] / "checkpoints" / f"step_{STEPS:07d}"
    shards = sorted(p.name for p in ckpt.glob("__*_0.distcp"))  # DCP: each rank's weights and LAMB states
    assert shards == [f"__{r}_0.distcp" for r in range(3)]
    assert not (ckpt / "optimizer.pt").exists() and not (ckpt / "model.safetensors").exists()
    sizes = [(ckpt / s).stat().st_size for s in shards]
    assert max(sizes) < 0.5 * sum(sizes)  # each rank holds about a third
    model = timm.create_model(f"local-dir:{runs['fsdp', 3] / 'model'}", pretrained=True)
    assert_bitwise_equal({k: v for k, v in model.state_dict().items()}, final_weights(runs["fsdp", 3]))


def _reshard_probe(rank: int, world: int, port: int, ckpts: dict, out: str) -> None:
    """One of ``world`` gloo processes: loads each checkpoint into a freshly built model (the same
    code as train.py's resume) and gathers what it holds, with torch's own gather (not our code)."""
    from vitlarge.checkpoint import store
    from vitlarge.checkpoint.sharded import model_tensors, param_names
    from vitlarge.checkpoint.state import RunState
    from vitlarge.distributed.launcher import DistEnv
    from vitlarge.distributed.process import init_distributed

    init_distributed(DistEnv(rank, world, rank, "127.0.0.1", port, "spawn"), "gloo")
    found = {}
    for name, (plugin, path) in ckpts.items():
        parts = built("fp32", world, plugin=plugin, global_batch=96)
        store.load(path, RunState(parts.model, parts.optimizer, parts.precision.scaler), recipe("fp32", plugin=plugin))
        opt = parts.engine.torch_optimizer
        names = param_names(parts.model, opt)  # in the optimizer's index order
        pieces = [None] * world  # every rank's local optimizer state, as it would save it
        state = {
            i: {k: v.to_local() if isinstance(v, DTensor) else v for k, v in s.items()}
            for i, s in opt.state_dict()["state"].items()
        }
        dist.all_gather_object(pieces, state)
        found[name] = (model_tensors(parts.model, rank), pieces if plugin == "fsdp" else pieces[:1], names)
    # One step (2 micro-steps) of a fresh model each, the same batches on every rank: no_sync accumulation
    # (the default), then with activation checkpointing (full, selective), then reduce-scattering every micro-step.
    # bf16 (accumulation auto, then no_sync): which gradient tensors FSDP holds between the two micro-steps.
    for name, setting in {
        "plain": {},
        "checkpointing": {"checkpointing": True},
        "selective": {"activation_checkpointing": "selective"},
        "reduce_scatter": {"fsdp_accumulation": "reduce_scatter"},
        "bf16": {},
        "bf16_no_sync": {"fsdp_accumulation": "no_sync"},
    }.items():
        parts = built("bf16" if name.startswith("bf16") else "fp32", world, global_batch=96, **setting)
        assert parts.model.unwrap().grad_checkpointing == (name == "checkpointing")
        source, held = batches(), set()

        def next_batch():
            if not held:  # first call: before micro-step 0; later: between micro-steps
                held.add(("start", None))
            else:
                held.update(accumulators(parts.model.unwrap()))
            return source()

        stepped = parts.engine.step(0, next_batch)
        found[name] = (stepped.grad_norm, model_tensors(parts.model, rank), sorted(held - {("start", None)}))
    if rank == 0:
        torch.save(found, out)
    dist.destroy_process_group()
    exit_worker()


def accumulators(root) -> set[tuple[str, str]]:
    """(kind, dtype) of the gradient tensors FSDP2 holds for every parameter: the unsharded gradient kept
    under ``set_requires_gradient_sync(False)`` (``unsharded_accumulated_grad`` when upcast to the reduce
    dtype, else the unsharded parameter's ``grad``) and the sharded DTensor ``grad`` (torch 2.10's names)."""
    from torch.distributed.fsdp import FSDPModule

    out = set()
    for m in root.modules():
        group = m._get_fsdp_state()._fsdp_param_group if isinstance(m, FSDPModule) else None
        for fp in group.fsdp_params if group else ():
            unsharded = getattr(fp, "_unsharded_param", None)
            for kind, t in (
                ("unsharded", fp.unsharded_accumulated_grad),
                ("unsharded", None if unsharded is None else unsharded.grad),
                ("sharded", fp.sharded_param.grad),
            ):
                if t is not None:
                    out.add((kind, str(t.dtype)))
    return out


def whole_optimizer_state(shards: list[dict], names: list[str], shapes: dict) -> dict:
    """FQN -> whole LAMB state from optimizer state dicts' ``state`` (one whole, or every rank's shard
    in rank order), concatenated by hand: FSDP2 shards dim 0, so the flattened pieces lie in rank order."""
    out = {}
    for i, name in enumerate(names):
        held = [s[i] for s in shards if i in s]
        out[name] = {
            "step": held[0]["step"],
            **{k: torch.cat([h[k].flatten() for h in held]).reshape(shapes[name]) for k in ("exp_avg", "exp_avg_sq")},
        }
    return out


def saved_optimizer_state(ckpt, names: list[str]) -> dict:
    """FQN -> whole LAMB state, read from the checkpoint's DCP files on this process."""
    import warnings

    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    from vitlarge.checkpoint.sharded import Reader

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "assuming the intent is to load in a single process"
        state = _load_state_dict_from_keys(storage_reader=Reader(ckpt))["optimizer"]["state"]
    return {n: state[n] for n in names}


@pytest.fixture(scope="module")
def probe3(runs, tmp_path_factory) -> tuple[dict, dict]:
    """One spawn of 3 gloo processes (`_reshard_probe`): the checkpoints it loads, and what it found."""
    fsdp2, ddp2 = (runs[p, 2] / "checkpoints" / "step_0000016" for p in ("fsdp", "ddp"))
    ckpts = {"fsdp2->fsdp3": ("fsdp", fsdp2), "ddp2->fsdp3": ("fsdp", ddp2), "fsdp2->ddp3": ("ddp", fsdp2)}
    out = tmp_path_factory.mktemp("probe3") / "found.pt"
    spawn(_reshard_probe, 3, 3, free_port(), ckpts, str(out), what="the 3-rank reshard probe")
    return ckpts, torch.load(out, weights_only=True)


@pytest.mark.parametrize("setting", ["checkpointing", "selective", "reduce_scatter"])
def test_activation_checkpointing_and_per_micro_step_reduce_scatter_leave_a_3_rank_step_unchanged(probe3, setting):
    """Against the plain step (no_sync accumulation, no recompute), 2 micro-steps, world size 3. ``checkpointing``
    is full recompute (``train.activation_checkpointing=full``), ``selective`` keeps the matmul outputs
    (``train.activation_checkpointing=selective``): both inside FSDP2's per-block gathers."""
    (norm_a, a, held_a), (norm_b, b, held_b) = probe3[1]["plain"], probe3[1][setting]
    assert held_a == [("unsharded", "torch.float32")]  # fp32 default: no_sync
    if setting == "reduce_scatter":
        assert held_b == [("sharded", "torch.float32")]
    assert norm_b == pytest.approx(norm_a, rel=1e-6)
    assert a.keys() == b.keys() and len(a) > 0
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-6, atol=1e-7)
    assert norm_a > 0


def test_bf16_accumulates_the_micro_steps_in_fp32(probe3):
    """Under bf16 the default (``auto``) reduce-scatters every micro-step into fp32 shards; ``no_sync``
    keeps an unsharded fp32 accumulator (FSDP2 upcasts to ``reduce_dtype``), never bf16 sums."""
    norm, _, held = probe3[1]["bf16"]
    assert held == [("sharded", "torch.float32")] and norm > 0
    norm_no_sync, _, held_no_sync = probe3[1]["bf16_no_sync"]
    assert held_no_sync == [("unsharded", "torch.float32")]
    assert norm_no_sync == pytest.approx(norm, rel=1e-3)  # the same bf16 gradients, summed in another order


def test_resume_at_world_size_3_reshards_exactly_and_continues_the_schedule(runs, probe3, demo_data, tmp_path):
    """fsdp at 2 -> fsdp at 3 (and ddp at 2 -> fsdp at 3, fsdp at 2 -> ddp at 3): weights and every
    LAMB moment loaded bit for bit; then train.py continues with the same global batch and lr schedule."""
    from vitlarge.checkpoint import weights as ckpt_weights
    from vitlarge.checkpoint.trust import layout
    from vitlarge.config.load import load_recipe
    from vitlarge.plan.schedule import lr_at

    ckpts, found = probe3
    fsdp2 = ckpts["fsdp2->fsdp3"][1]
    for name, (_, ckpt) in ckpts.items():
        weights, pieces, names = found[name]
        assert_bitwise_equal(weights, ckpt_weights.weights_of(ckpt, layout.read_meta(ckpt)))
        state = whole_optimizer_state(pieces, names, {k: v.shape for k, v in weights.items()})
        saved = saved_optimizer_state(ckpt, names)
        assert state.keys() == saved.keys() and len(state) == len(weights), name  # every parameter has a state
        for k in saved:
            for m in ("step", "exp_avg", "exp_avg_sq"):
                assert torch.equal(state[k][m], saved[k][m]), (name, k, m)

    r = launcher.run(train_args(demo_data, tmp_path / "w3", "train.plugin=fsdp") + ["--resume", str(fsdp2)], nproc=3)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    lines = [x for x in out.splitlines() if "was written by 2 processes, this run has 3" in x]
    assert len(lines) == 1 and "data stream restarts" in lines[0], out[-3000:]  # rank 0 only
    start = [x for x in read_metrics(str(tmp_path / "w3" / "metrics.jsonl")) if x["event"] == "start"][-1]
    assert (start["world_size"], start["global_batch"], start["accum_steps"], start["step"]) == (3, 96, 2, 16)
    resumed, before = train_records(tmp_path / "w3"), train_records(runs["fsdp", 2])
    assert [x["step"] for x in resumed] == [17, 18, 19, 20]
    s = load_recipe(RECIPE).schedule
    first = [x for x in read_metrics(str(runs["fsdp", 2] / "metrics.jsonl")) if x["event"] == "start"][0]
    assert (first["total_steps"], first["warmup_steps"]) == (start["total_steps"], start["warmup_steps"])
    for x, y in zip(resumed, before[16:]):
        expected = lr_at(
            x["step"] - 1,
            peak_lr=start["config"]["optim"]["lr"],
            total_steps=start["total_steps"],
            warmup_steps=start["warmup_steps"],
            decay=s.decay,
            min_lr_ratio=s.min_lr_ratio,
        )
        assert x["lr"] == pytest.approx(expected, rel=1e-12) and x["lr"] == pytest.approx(y["lr"], rel=1e-12)


def test_a_sharded_checkpoint_missing_a_rank_shard_or_of_another_model_is_refused(runs, tmp_path):
    import shutil

    from vitlarge.checkpoint import store
    from vitlarge.checkpoint import weights as ckpt_weights
    from vitlarge.checkpoint.trust import layout
    from vitlarge.config.load import load_recipe
    from vitlarge.errors import UserError
    from vitlarge.model.vit import build_model

    ckpt = tmp_path / f"step_{STEPS:07d}"
    shutil.copytree(runs["fsdp", 3] / "checkpoints" / ckpt.name, ckpt)
    assert store.verify(ckpt) is None
    other = load_recipe(RECIPE)
    other.model.kwargs = dict(other.model.kwargs, embed_dim=48)
    with pytest.raises(UserError, match="does not match the recipe's"):
        ckpt_weights.check_compatible(layout.read_meta(ckpt), ckpt, build_model(other), other)
    same = load_recipe(RECIPE)  # weights only (python -m vitlarge.evaluate --checkpoint): a plain model reads it
    plain = build_model(same)
    ckpt_weights.load_model_weights(ckpt, plain, same)
    assert_bitwise_equal(plain.state_dict(), final_weights(runs["fsdp", 3]))
    (ckpt / "__1_0.distcp").unlink()
    assert "__1_0.distcp" in store.verify(ckpt)  # resume passes it over / --resume refuses it
