"""Checkpoints that resume exactly: save, find and load; atomic and never unpickling objects.

Layout of ``<workdir>/checkpoints/step_0000100/``:

* ``model.safetensors``   weights (rank 0; DDP replicas are identical)
* ``optimizer.pt``        optimizer state: tensors and numbers only, loaded with ``weights_only=True``
* ``rank_00000.pt`` ...   per rank: RNG states (torch, CUDA, numpy, python), loss scaler, data-loader state
* ``meta.json``           format version, step, world size, model name and parameter shapes, config

Every rank writes into ``.step_0000100.tmp/``; once all ranks report success, rank 0 writes
``meta.json`` and renames the folder to its final name, so a folder named ``step_*`` is complete by
construction and a run killed mid-write leaves only a ``.tmp`` folder, which is never chosen and is
removed by the next save. Then rank 0 keeps the newest ``keep`` checkpoints.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from vitlarge.config import Config
from vitlarge.errors import UserError

FORMAT_VERSION = 1
STEP_DIR = re.compile(r"^step_(\d{7,})$")


def _world() -> tuple[int, int]:
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _all_ok(ok: bool) -> bool:
    """True on every rank only if every rank says ok; doubles as the barrier between write phases."""
    if not dist.is_initialized():
        return ok
    flag = torch.tensor([0.0 if ok else 1.0])
    if dist.get_backend() == "nccl":
        flag = flag.cuda()
    dist.all_reduce(flag)
    return flag.item() == 0


def rng_state() -> dict:
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "python": random.getstate()[1],
        "python_gauss": random.getstate()[2],  # random.gauss() caches its second value
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    random.setstate((3, tuple(state["python"]), state.get("python_gauss")))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def param_shapes(model: torch.nn.Module) -> dict[str, list[int]]:
    return {k: list(v.shape) for k, v in model.state_dict().items()}


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.unwrap() if hasattr(model, "unwrap") else model


def save(workdir: str | Path, step: int, model, optimizer, scaler, data_state: str | None, cfg: Config,
         keep: int, extra_meta: dict | None = None) -> Path:
    """Collective: every rank calls it at the same optimizer-step boundary. Returns the final path."""
    rank, world = _world()
    root = Path(workdir) / "checkpoints"
    final = root / f"step_{step:07d}"
    tmp = root / f".step_{step:07d}.tmp"
    raw = _unwrap(model)

    def prepare():
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".step_*.tmp"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()

    def write():
        if rank == 0:
            tensors = {k: v.detach().contiguous().cpu() for k, v in raw.state_dict().items()}
            save_file(tensors, str(tmp / "model.safetensors"))
            _torch_save(getattr(optimizer, "optim", optimizer).state_dict(), tmp / "optimizer.pt")
        _torch_save({"rng": rng_state(), "scaler": scaler.state_dict(), "data": data_state},
                    tmp / f"rank_{rank:05d}.pt")

    def finish():
        meta = {"format_version": FORMAT_VERSION, "step": step, "world_size": world, "model": cfg.model.name,
                "param_shapes": param_shapes(raw), "config": cfg.to_dict(), **(extra_meta or {})}
        _write_json_atomic(tmp / "meta.json", meta)
        os.replace(tmp, final)
        _fsync_dir(root)
        for old in list_checkpoints(workdir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)

    for phase, who in ((prepare, "main"), (write, "all"), (finish, "main")):
        error = None
        if who == "all" or rank == 0:
            try:
                phase()
            # A full disk surfaces as SafetensorError (safetensors) or RuntimeError (torch.save), not
            # only OSError; every failure must reach _all_ok, or the other ranks would wait there forever.
            except (OSError, RuntimeError, SafetensorError) as e:
                error = e
        if not _all_ok(error is None):
            if rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            reason = _reason(error) if error else "another rank failed to write its part"
            raise UserError(
                f"writing checkpoint {final} failed ({reason}); free space in {root} or point --workdir "
                "elsewhere; earlier checkpoints are intact"
            )
    return final


def _torch_save(obj, path: Path) -> None:
    # Through a Python file, so a full disk's OSError is kept as the context of torch's RuntimeError
    # (whose own message, "unexpected pos ...", does not say why).
    with open(path, "wb") as f:
        torch.save(obj, f)


def _reason(error: BaseException) -> str:
    """The OSError behind ``error`` if there is one ("No space left on device"), else its first line."""
    cause = error
    while cause is not None:
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror
        cause = cause.__cause__ or cause.__context__
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _write_json_atomic(path: Path, obj) -> None:
    tmp = path.with_suffix(".json.tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_checkpoints(workdir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = Path(workdir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if STEP_DIR.match(p.name) and (p / "meta.json").is_file()]
    return sorted(found, key=lambda p: int(STEP_DIR.match(p.name).group(1)))


def latest(workdir: str | Path) -> Path | None:
    found = list_checkpoints(workdir)
    return found[-1] if found else None


def read_meta(path: str | Path) -> dict:
    path = Path(path)
    meta_file = path / "meta.json"
    if not path.exists():
        raise UserError(f"checkpoint {path} does not exist; check --resume, or omit it to resume from the workdir")
    if not meta_file.is_file():
        raise UserError(f"{path} is not a complete vitlarge checkpoint (no meta.json); pass a checkpoints/step_* folder")
    try:
        meta = json.loads(meta_file.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{meta_file} is corrupt ({e}); resume from an older checkpoint with --resume") from None
    if meta.get("format_version") != FORMAT_VERSION:
        raise UserError(f"{path} has checkpoint format {meta.get('format_version')}, this vitlarge reads {FORMAT_VERSION}")
    return meta


def check_compatible(meta: dict, path: Path, model: torch.nn.Module, cfg: Config) -> None:
    shapes = param_shapes(_unwrap(model))
    if meta["model"] != cfg.model.name or meta["param_shapes"] != shapes:
        diff = next((k for k in shapes if meta["param_shapes"].get(k) != shapes[k]), None)
        detail = f"first difference at '{diff}'" if diff else "different parameter set"
        raise UserError(
            f"checkpoint {path} holds model {meta['model']} that does not match the recipe's {cfg.model.name} "
            f"({detail}); use another --workdir or --resume a checkpoint of this recipe"
        )


def load(path: str | Path, model, optimizer, scaler, cfg: Config) -> dict:
    """Restores weights, optimizer, scaler and RNG; returns meta plus ``data`` (this rank's loader state or None)."""
    path = Path(path)
    meta = read_meta(path)
    check_compatible(meta, path, model, cfg)
    rank, world = _world()
    _unwrap(model).load_state_dict(load_file(str(path / "model.safetensors"), device="cpu"))
    opt = getattr(optimizer, "optim", optimizer)
    opt.load_state_dict(torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True))
    rank_file = path / f"rank_{rank:05d}.pt"
    same_world = meta["world_size"] == world and rank_file.is_file()
    # With another world size the per-rank loader and RNG states do not map onto the new ranks:
    # we keep weights, optimizer and step, and start the loaders afresh (documented; not bitwise).
    state = torch.load(rank_file if same_world else path / "rank_00000.pt", map_location="cpu", weights_only=True)
    scaler.load_state_dict(state["scaler"])
    if same_world:
        set_rng_state(state["rng"])
    return {**meta, "data": state["data"] if same_world else None, "same_world": same_world}


def load_model_weights(path: str | Path, model: torch.nn.Module, cfg: Config) -> None:
    """Weights only, from a checkpoint folder, an export folder (`vitlarge.export`) or a ``model.safetensors``."""
    given = path = Path(path)
    if path.is_dir() and (path / "config.json").is_file() and not (path / "meta.json").exists():
        path = path / "model.safetensors"  # an export: timm's config.json beside the weights
    elif path.is_dir():
        check_compatible(read_meta(path), path, model, cfg)
        path = path / "model.safetensors"
    if not path.is_file():
        raise UserError(f"checkpoint {path} does not exist; pass a checkpoints/step_* folder or an exported model folder")
    try:
        _unwrap(model).load_state_dict(load_file(str(path), device="cpu"))
    except RuntimeError as e:
        raise UserError(f"{given} does not fit model {cfg.model.name}: {str(e).splitlines()[0]}") from None
