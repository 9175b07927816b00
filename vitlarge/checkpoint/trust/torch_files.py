"""A checkpoint's torch and safetensors files, read as data from elsewhere.

Nothing is unpickled beyond tensors and numbers (``torch.load(weights_only=True)``, after a check that the zip
archive is one ``torch.save`` writes and that its pickle makes objects in proportion to its size,
`vitlarge.checkpoint.trust.index.archive_problem`); a rank file is capped at `RANK_FILE_MAX_BYTES` and checked key by
key (`rank_state_problem`) before any of it is applied; a format-1/2 optimizer file is checked for the shape
``Optimizer.state_dict()`` gives (`optimizer_state_problem`) before its indices are used. Where only shapes are
needed (the dry run's ``model.init_from`` notes, ``vitlarge.evaluate``'s check of an export), a safetensors header
is read alone, capped (`header_shapes`).
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import cast

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from vitlarge import fileio
from vitlarge.checkpoint.files import NOT_DATA
from vitlarge.checkpoint.trust.index import archive_problem
from vitlarge.checkpoint.trust.layout import Unusable
from vitlarge.checkpoint.trust.meta import is_number
from vitlarge.errors import UserError

RANK_FILE_MAX_BYTES = 256 << 20
"""A rank file's cap: RNG and scaler states and the loader's position (a few KB to a few MB)."""
HEADER_MAX_BYTES = 4 << 20
"""The largest safetensors header read for its shapes alone: a ViT-H's is ~50 KB (safetensors' own reader
takes 100 MB, whose JSON of empty tensors took 13 s and 1.7 GB to parse)."""
HEADER_MAX_TENSORS = 1 << 16
"""The most tensors a header may list for its shapes: a ViT-H has ~400, a ViT-22B ~1,000."""


def torch_load(folder: Path, name: str):
    """``folder/name`` through ``torch.load(weights_only=True)``; a file that is not one, or holds objects
    other than tensors and numbers, is `Unusable` in one line (never torch's advice to unpickle it anyway)."""
    try:
        with fileio.open_regular(folder / name, follow=False) as f:
            size = os.fstat(f.fileno()).st_size
            if name.startswith("rank_") and size > RANK_FILE_MAX_BYTES:
                raise Unusable(folder, f"{name} has {size:,} bytes, more than a rank file's {RANK_FILE_MAX_BYTES:,}")
            problem = archive_problem(f, size)
            if problem:
                raise Unusable(folder, f"{name} {problem}")
            f.seek(0)
            return torch.load(f, map_location="cpu", weights_only=True)
    except Unusable:
        raise
    except OSError as e:
        raise Unusable(folder, f"{name} cannot be read ({e.strerror})") from None
    except pickle.UnpicklingError as e:
        # torch's message advises unpickling it anyway (weights_only=False): never passed on
        if "Unsupported global" in str(e):
            raise Unusable(folder, f"{name} {NOT_DATA}") from None
        raise Unusable(folder, f"{name} is not a readable torch file (UnpicklingError)") from None
    except Exception as e:  # noqa: BLE001 - torch.load raises many types on a damaged file
        raise Unusable(folder, f"{name} is not a readable torch file ({type(e).__name__})") from None


def safetensors_file(folder: Path, name: str) -> dict[str, torch.Tensor]:
    """``folder/name`` as safetensors; a damaged or foreign file is `Unusable` in one line."""
    try:
        return load_file(str(folder / name), device="cpu")
    except (SafetensorError, OSError, ValueError) as e:
        reason = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
        raise Unusable(folder, f"{name} is not a safetensors file ({reason})") from None


def rank_state_problem(state) -> str | None:
    """Why ``state`` (a ``rank_NNNNN.pt``'s contents) is not what `store.save` writes (`RunState.rank_state`): RNG
    states, the loss scaler's state and the loader's state string. None when it is."""
    if not isinstance(state, dict) or not {"rng", "scaler", "data"} <= set(state):
        return "lacks rng, scaler or data"
    rng, data, scaler = state["rng"], state["data"], state["scaler"]
    if data is not None and not isinstance(data, str):
        return "holds a data state that is not a string"
    if not isinstance(scaler, dict):
        return "holds a loss-scaler state that is not a map"
    if scaler:  # {} is a disabled scaler's (bf16, fp32)
        problem = scaler_problem(scaler)
        if problem:
            return problem
    if not isinstance(rng, dict) or not isinstance(rng.get("torch"), torch.Tensor):
        return "holds no torch RNG state"
    if rng["torch"].dtype != torch.uint8 or rng["torch"].shape != torch.get_rng_state().shape:
        return "holds a torch RNG state of another kind"
    if "cuda" in rng and not (isinstance(rng["cuda"], torch.Tensor) and rng["cuda"].dtype == torch.uint8):
        return "holds a CUDA RNG state that is not bytes"
    n = rng.get("numpy")
    if not (
        isinstance(n, dict)
        and isinstance(n.get("keys"), torch.Tensor)
        and n["keys"].shape == (624,)
        and n["keys"].dtype == torch.int64
        and isinstance(n.get("pos"), int)
        and 0 <= n["pos"] <= 624
        and isinstance(n.get("has_gauss"), int)
        and n["has_gauss"] in (0, 1)  # numpy raises OverflowError on others (found by the fuzz)
        and isinstance(n.get("cached_gaussian"), float)
    ):
        return "holds a malformed numpy RNG state"
    python = rng.get("python")
    if not (
        isinstance(python, (list, tuple))
        and len(python) == 625
        and all(isinstance(x, int) and 0 <= x < 1 << 32 for x in python)
        and python[-1] <= 624
    ):
        return "holds a malformed Python RNG state"
    if rng.get("python_gauss") is not None and not isinstance(rng["python_gauss"], float):
        return "holds a malformed Python RNG state"
    return None


SCALER_MAX_GROWTH_INTERVAL = 2**31
"""The longest loss-scaler growth interval a rank file may state (torch keeps it as an int32 on the device)."""


def scaler_problem(scaler: dict) -> str | None:
    """Why ``scaler`` (an enabled ``GradScaler.state_dict()`` from a rank file) is not one a run can continue, or None:
    its scale and growth and backoff factors finite and > 0, its growth interval from 1 to
    `SCALER_MAX_GROWTH_INTERVAL`. A scale of nan resumed and skipped every step, exit 0; 10**400 a traceback."""
    for key in ("scale", "growth_factor", "backoff_factor"):
        value = scaler.get(key)
        if not (is_number(value) and value > 0):
            return f"holds a loss-scaler {key} of {str(value)[:40]}, not a finite number > 0"
    interval = scaler.get("growth_interval")
    if not (type(interval) is int and 1 <= interval <= SCALER_MAX_GROWTH_INTERVAL):
        return (
            f"holds a loss-scaler growth_interval of {str(interval)[:40]}, not from 1 to {SCALER_MAX_GROWTH_INTERVAL:,}"
        )
    if type(scaler.get("_growth_tracker")) is not int:
        return "holds a malformed loss-scaler state"
    return None


def optimizer_state_problem(state: object, params: int | None = None) -> str | None:
    """Why ``state`` (a file's unpickled data) is not an optimizer state dict as ``Optimizer.state_dict()`` gives
    it: ``state``, per-parameter dicts by parameter index, and ``param_groups``, dicts whose ``params`` are
    indices (below ``params`` where given); None when it is one."""
    if not (isinstance(state, dict) and isinstance(state.get("state"), dict)):
        return "is not an optimizer state (a dict with 'state' and 'param_groups')"
    groups = state.get("param_groups")
    if not (
        isinstance(groups, list) and all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups)
    ):
        return "holds no 'param_groups' of dicts with 'params' lists"
    indices = [i for g in groups for i in g["params"]] + list(state["state"])
    if not all(type(i) is int and i >= 0 and (params is None or i < params) for i in indices):
        return "names parameters by something other than their indices in the model"
    if not all(isinstance(s, dict) for s in state["state"].values()):
        return "holds per-parameter state that is not a dict"
    return None


def header_shapes(f: Path, lead: str, *, follow: bool = True) -> dict[str, torch.Tensor]:
    """Meta tensors of the shapes a safetensors file's header records, no weight read: a regular file (``follow``
    False: not a link either), a header of at most `HEADER_MAX_BYTES` listing at most `HEADER_MAX_TENSORS`
    tensors, each a shape of whole numbers, its bytes within the file; else one line, ``lead`` then the file."""

    def refused(why: str) -> UserError:
        return UserError(f"{lead}: {f} {why}; pass a model.safetensors or a torch checkpoint of a timm model")

    try:
        with fileio.open_regular(f, follow=follow) as fh:
            size, head = os.fstat(fh.fileno()).st_size, fh.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else 0
            if n > HEADER_MAX_BYTES:
                raise refused(f"has a header of {n:,} bytes, more than the {HEADER_MAX_BYTES:,} a model's takes")
            if not 2 <= n <= size - 8:
                raise refused("is not a safetensors file (no header)")
            doc = json.loads(fh.read(n))
    except fileio.UnsafeFile as e:
        raise refused(e.strerror or "is not a regular file") from None
    except OSError as e:
        raise refused(f"cannot be read ({e.strerror})") from None
    except (ValueError, RecursionError):
        raise refused("is not a safetensors file (its header is not JSON)") from None
    if not isinstance(doc, dict):
        raise refused("is not a safetensors file (its header is not a JSON object)")
    tensors = {k: v for k, v in doc.items() if k != "__metadata__"}
    if len(tensors) > HEADER_MAX_TENSORS:
        raise refused(f"lists {len(tensors):,} tensors, more than the {HEADER_MAX_TENSORS:,} a model has")
    out = {}
    for k, v in tensors.items():
        shape, ends = (v.get("shape"), v.get("data_offsets")) if isinstance(v, dict) else (None, None)
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            shape = None
        if shape is None or not (isinstance(ends, list) and len(ends) == 2 and all(isinstance(e, int) for e in ends)):
            raise refused(f"is not a safetensors file (its tensor {k[:80]!r} has no shape and offsets)")
        if not 0 <= ends[0] <= ends[1] <= size - 8 - n:
            raise refused(f"is cut short (its tensor {k[:80]!r} ends past the file)")
        out[k] = torch.empty(cast(list[int], shape), device="meta")
    return out
