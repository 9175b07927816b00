"""vitlarge/checkpoint/store.py + sharded_checkpoint.py across processes: DCP re-sharding, exact, with real gloo
processes on CPU (torch.multiprocessing), the demo recipe's ViT.

* FSDP2 (``fully_shard`` per block and at the root, built here) and DDP with AdamW: fsdp@2 -> fsdp@2,
  fsdp@2 -> fsdp@3, fsdp@2 -> ddp@3, ddp@2 -> fsdp@3. Each loaded run's weights and every optimizer
  state tensor, gathered by torch's own ``get_state_dict(full_state_dict=True)``, equal the saving run's
  bit for bit.
* ``train.plugin=fsdp`` as vitlarge wraps it (`vitlarge.distributed.fsdp.wrap`, ShardedLamb): fsdp@2 -> fsdp@3 and
  -> ddp@3 (LAMB), and a format-2 checkpoint of the same run (``optimizer_rank_*.pt``, the old writer's
  layout) resumed at 3 ranks.
* Every rank writes its own ``__<rank>_0.distcp``; meta.json lists them all with their checksums.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.helpers import ROOT
from tests.helpers.spawn import exit_worker, free_port, spawn


def _cfg(recipe: str | None = None):
    from vitlarge.config.load import load_recipe

    return load_recipe(recipe or ROOT / "recipes" / "demo_digits.py")


def _build(mode: str, seed: int, recipe: str | None = None):
    """(model as the checkpoint code sees it, optimizer) for ``mode``; weights from ``seed`` on every rank."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from vitlarge.config.schema import OptimConfig
    from vitlarge.model.vit import build_model
    from vitlarge.optim.lamb import build_optimizer

    torch.manual_seed(seed)
    model = build_model(_cfg(recipe))
    if mode == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    if mode == "ddp_adamw":
        return DDP(model), torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    if mode == "ddp_lamb":
        return DDP(model), build_optimizer(model, OptimConfig(lr=1e-2, weight_decay=0.1))
    assert mode == "plugin_fsdp"  # as train.py builds it: the Booster plugin shards and re-points the optimizer
    from vitlarge.distributed.fsdp import FSDPPlugin

    return FSDPPlugin("fp32", torch.device("cpu")).configure(
        model, build_optimizer(model, OptimConfig(lr=1e-2, weight_decay=0.1))
    )[:2]


def _train(model, opt, rank: int, world: int, steps: int = 2) -> None:
    """``steps`` steps on a global batch of 12 split over the ranks (the same data at any world size)."""
    for s in range(steps):
        g = torch.Generator().manual_seed(s)
        x, y = torch.randn(12, 3, 16, 16, generator=g), torch.randint(0, 10, (12,), generator=g)
        n = 12 // world
        loss = torch.nn.functional.cross_entropy(model(x[rank * n : (rank + 1) * n]), y[rank * n : (rank + 1) * n])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def _full(model, opt) -> dict:
    """Weights and optimizer state, whole, by torch's own gather (not vitlarge's code)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    root = model.unwrap() if hasattr(model, "unwrap") else model
    m, o = get_state_dict(root, getattr(opt, "optim", opt), options=StateDictOptions(full_state_dict=True))
    return {
        "model": {k: v.clone() for k, v in m.items()},
        "optimizer": {k: {n: torch.as_tensor(t).clone() for n, t in s.items()} for k, s in o["state"].items()},
    }


def _names(model, opt) -> list[str]:
    """Each optimizer parameter's name, in the optimizer's index order (a format-2 file's indices)."""
    root = model.unwrap() if hasattr(model, "unwrap") else getattr(model, "module", model)
    names = {id(p): n for n, p in root.named_parameters()}
    return [names[id(p)] for g in getattr(opt, "optim", opt).param_groups for p in g["params"]]


def _write_format2(folder: Path, model, opt, rank: int, world: int) -> None:
    """A checkpoint as vitlarge wrote them before DCP (format 2): full model.safetensors gathered to rank 0,
    each rank's optimizer pieces as plain tensors, per-rank files, meta.json with records. A collective."""
    from safetensors.torch import save_file

    from vitlarge import fileio
    from vitlarge.checkpoint import sharded
    from vitlarge.checkpoint.state import RngState
    from vitlarge.checkpoint.weights import param_shapes
    from vitlarge.distributed.collective import gather

    tensors = sharded.model_tensors(model, rank)
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"rank_{rank:05d}.pt", f"optimizer_rank_{rank:05d}.pt"]
    torch.save({"rng": RngState().state_dict(), "scaler": {}, "data": None}, folder / names[0])
    from torch.distributed.tensor import DTensor

    state = getattr(
        opt, "optim", opt
    ).state_dict()  # this rank's pieces as plain tensors, as the format-2 writer saved them
    state["state"] = {
        i: {k: v.to_local().clone() if isinstance(v, DTensor) else v for k, v in s.items()}
        for i, s in state["state"].items()
    }
    torch.save(state, folder / names[1])
    if rank == 0:
        save_file(tensors, str(folder / "model.safetensors"))
        names.append("model.safetensors")
    records = gather({n: fileio.sync_and_record(folder / n) for n in names})
    if rank == 0:
        cfg = _cfg()
        meta = {
            "format_version": 2,
            "step": 2,
            "world_size": world,
            "model": cfg.model.name,
            "param_shapes": param_shapes(model),
            "config": cfg.to_dict(),
            "files": {k: v for part in records for k, v in part.items()},
        }
        (folder / "meta.json").write_text(json.dumps(meta))
    dist.barrier()


def _worker(rank: int, world: int, port: int, job: dict, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from vitlarge.checkpoint import store
    from vitlarge.checkpoint.state import RunState

    found = {}
    try:
        for name, (mode, action, workdir) in job.items():
            recipe = None if action == "save" else workdir  # a load's third item: its recipe (None: the demo)
            model, opt = _build(mode, seed=0 if action == "save" else 1, recipe=recipe)
            scaler = torch.amp.GradScaler("cpu", enabled=False)
            if action == "save":
                _train(model, opt, rank, world)
                store.save(workdir, RunState(model, opt, scaler, step=2), _cfg(), keep=2)
                if mode == "plugin_fsdp":
                    _write_format2(Path(workdir) / "format2" / "step_0000002", model, opt, rank, world)
            else:
                state = store.load(action, RunState(model, opt, scaler), _cfg(recipe))
                found[f"{name} step"] = state.step
            full = _full(model, opt)
            if rank == 0:
                found[name] = full
                found[f"{name} names"] = _names(model, opt)
    finally:
        if rank == 0:
            torch.save(found, out)
        dist.destroy_process_group()
    exit_worker()  # only after a clean end: an exception above still reaches spawn


def _spawn(world: int, job: dict, out: Path) -> dict:
    spawn(_worker, world, world, free_port(), job, str(out), what=f"the {world}-rank checkpoint job")
    return torch.load(out, weights_only=True)


def _assert_same(a: dict, b: dict, what: str) -> None:
    assert a["model"].keys() == b["model"].keys() and a["optimizer"].keys() == b["optimizer"].keys(), what
    assert len(a["optimizer"]) == len(a["model"]), what  # every parameter has optimizer state
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), (what, k)
    for k, s in a["optimizer"].items():
        assert s.keys() == b["optimizer"][k].keys(), (what, k)
        for n, t in s.items():
            assert torch.equal(t, b["optimizer"][k][n]), (what, k, n)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, dict]:
    """One 2-rank spawn that trains and saves each kind of run; returns the root and their full states."""
    root = tmp_path_factory.mktemp("dcp")
    job = {m: (m, "save", str(root / m)) for m in ("fsdp2", "ddp_adamw", "plugin_fsdp")}
    return root, _spawn(2, job, root / "saved.pt")


def ckpt(root: Path, mode: str) -> str:
    return str(root / mode / "checkpoints" / "step_0000002")


def test_every_rank_writes_its_shards_and_meta_json_records_them(saved):
    from vitlarge.checkpoint import store
    from vitlarge.checkpoint.trust import layout as ckpt_layout

    root, _ = saved
    for mode in ("fsdp2", "ddp_adamw", "plugin_fsdp"):
        path = Path(ckpt(root, mode))
        assert sorted(p.name for p in path.iterdir()) == [
            ".metadata",
            "__0_0.distcp",
            "__1_0.distcp",
            "meta.json",
            "rank_00000.pt",
            "rank_00001.pt",
        ], mode
        meta = ckpt_layout.read_meta(path)
        assert meta["format_version"] == 3 and meta["world_size"] == 2
        assert sorted(meta["files"]) == sorted(p.name for p in path.iterdir() if p.name != "meta.json")
        assert store.verify(path) is None
        if mode == "fsdp2":  # sharded: both ranks hold a real share of the bytes
            sizes = [meta["files"][f"__{r}_0.distcp"]["bytes"] for r in (0, 1)]
            assert min(sizes) > 0.3 * sum(sizes), sizes


def test_fsdp2_and_ddp_reshard_exactly_at_2_and_3_ranks(saved, tmp_path):
    root, ref = saved
    job3 = {
        "fsdp2->fsdp2@3": ("fsdp2", ckpt(root, "fsdp2"), None),
        "fsdp2->ddp@3": ("ddp_adamw", ckpt(root, "fsdp2"), None),
        "ddp->fsdp2@3": ("fsdp2", ckpt(root, "ddp_adamw"), None),
    }
    found = _spawn(3, job3, tmp_path / "found3.pt")
    for name, (_, source, _) in job3.items():
        _assert_same(found[name], ref[Path(source).parent.parent.name], name)
    found = _spawn(2, {"fsdp2->fsdp2@2": ("fsdp2", ckpt(root, "fsdp2"), None)}, tmp_path / "found2.pt")
    _assert_same(found["fsdp2->fsdp2@2"], ref["fsdp2"], "fsdp2->fsdp2@2")


def test_plugin_fsdp_reshards_exactly_and_a_format_2_checkpoint_still_resumes(saved, tmp_path):
    """vitlarge's fsdp plugin (ShardedLamb) to 3 ranks, fsdp and ddp, from DCP and from the old format."""
    root, ref = saved
    old = str(root / "plugin_fsdp" / "format2" / "step_0000002")
    job = {
        "fsdp->fsdp@3": ("plugin_fsdp", ckpt(root, "plugin_fsdp"), None),
        "fsdp->ddp@3": ("ddp_lamb", ckpt(root, "plugin_fsdp"), None),
        "format2 fsdp->fsdp@3": ("plugin_fsdp", old, None),
        "format2 fsdp->ddp@3": ("ddp_lamb", old, None),
    }
    found = _spawn(3, job, tmp_path / "found.pt")
    for name in job:
        _assert_same(found[name], ref["plugin_fsdp"], name)


def test_format_2_checkpoints_of_torch_2_5_1_resume_exactly_at_3_ranks(tmp_path):
    """The ddp and FSDP1 checkpoints vitlarge 0.2 wrote under torch 2.5.1 (tests/data/torch251), loaded into
    FSDP2 and DDP runs at 3 ranks: weights equal model.safetensors, every LAMB moment equals the saved
    pieces concatenated in rank order (the whole tensor), step 20."""
    from safetensors.torch import load_file

    data = ROOT / "tests" / "data" / "torch251"
    recipe = str(data / "recipe.py")
    job = {
        f"{src}->{mode}@3": (mode, str(data / src / "step_0000020"), recipe)
        for src in ("ddp", "fsdp")
        for mode in ("plugin_fsdp", "ddp_lamb")
    }
    found = _spawn(3, job, tmp_path / "found.pt")
    for name, (_, path, _) in job.items():
        path = Path(path)
        assert found[f"{name} step"] == 20
        weights = load_file(str(path / "model.safetensors"))
        assert found[name]["model"].keys() == weights.keys()
        assert all(torch.equal(found[name]["model"][k], v) for k, v in weights.items()), name
        files = sorted(path.glob("optimizer_rank_*.pt")) or [path / "optimizer.pt"]
        saved = [torch.load(f, weights_only=True)["state"] for f in files]
        names = found[f"{name} names"]
        for i, fqn in enumerate(names):
            for m in ("exp_avg", "exp_avg_sq"):
                whole = torch.cat([s[i][m].reshape(-1) for s in saved if i in s])
                assert torch.equal(found[name]["optimizer"][fqn][m].reshape(-1), whole), (name, fqn, m)
