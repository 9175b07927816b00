"""The checks of a loaded config, in one place: ``validate`` before a run (a recipe with its overrides) and
``check_read_back`` for a config read back from elsewhere (a checkpoint's meta.json).

Each bad value is one `UserError` line naming the key and a valid setting, blaming the override that set the
key (its origin: ``command line`` or an overrides file) or else the recipe. The order is the walk a reader
follows: every field's type (`check_types`, here), every number's range (`vitlarge.config.schema.check_ranges`,
beside the rules), what fields allow only together (`Config.problems`), the profile window
(`vitlarge.config.profile_window`), the phase list (`vitlarge.config.phase_list.check`) and the trackers
(`vitlarge.config.trackers`). Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from typing import Literal

from vitlarge.config.coerce import article, container_of, fields_of
from vitlarge.config.phase_list import check as check_phases
from vitlarge.config.phase_list import entries
from vitlarge.config.profile_window import check_profile_window
from vitlarge.config.renamed import RENAMED, renamed_line
from vitlarge.config.schema import Config, check_ranges
from vitlarge.config.trackers import check_log
from vitlarge.errors import UserError


class Where:
    """Whom a message blames: the override (its origin: ``command line`` or the overrides file) that set one of
    the keys involved, else the recipe."""

    def __init__(self, recipe: str, overridden: dict[str, str] | None = None):
        self.recipe, self.overridden = recipe, overridden or {}

    def __call__(self, *keys: str) -> str:
        return next((self.overridden[k] for k in keys if k in self.overridden), self.recipe)


def check_read_back(cfg: Config, origin: str) -> None:
    """The schema's rules for a config read back from elsewhere (a checkpoint's meta.json), one `UserError` naming
    ``origin``: every field's type (and Literal choice) and range, what fields allow only together, and the phase
    list. Its values reach plans and models as a recipe's do. Not `validate`'s checks of the run about to start
    (trackers installed, the profile window)."""
    where = Where(origin)
    check_types(cfg, where)
    check_ranges(cfg, where)
    for problem in cfg.problems():
        raise UserError(f"{where(*problem.keys)}: {problem.text}")
    check_phases(cfg, where)


def validate(cfg: Config, origin: str = "config", overridden: dict[str, str] | None = None) -> None:
    """Checks everything that can be checked before the world size is known. ``overridden`` maps the keys that
    overrides set to where they came from (``command line``, a file): a message about them names that, not ``origin``."""
    where = Where(origin, overridden)
    if cfg.train.plugin == "zero":  # removed: it needed CUDA, no test ran it, and it was broken
        raise UserError(
            f"{where('train.plugin')}: train.plugin=zero was removed; use train.plugin=fsdp (sharded weights, "
            "gradients and optimizer states; CPU and CUDA)"
        )
    check_types(cfg, where)  # also the allowed values of the Literal fields
    check_ranges(cfg, where)
    for problem in cfg.problems():
        raise UserError(f"{where(*problem.keys)}: {problem.text}")
    t = cfg.train
    check_profile_window(t, where)
    check_phases(cfg, where)
    if t.phases:
        t.phases = entries(t.phases)
    check_log(cfg, where)


INT_LIMIT = 2**63
"""No setting is an integer beyond this; a larger one (a hex literal escapes Python's 4,300-digit limit, JSON
carries 4,300 digits) would overflow ``float()`` or the digit limit in a message instead of failing its check."""


def huge_int(value: object) -> int | None:
    """The first integer in ``value`` (through lists, tuples, dicts and dataclasses) beyond `INT_LIMIT`, or None."""
    stack, seen = [value], 0
    while stack and seen < 100_000:
        v, seen = stack.pop(), seen + 1
        if type(v) is int and not -INT_LIMIT <= v <= INT_LIMIT:
            return v
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        elif dataclasses.is_dataclass(v) and not isinstance(v, type):
            stack.extend(getattr(v, f.name) for f in dataclasses.fields(v))
    return None


def too_large(value: int) -> str:
    """How a `huge_int` reads in a message: its sign and length, never its digits."""
    return f"an integer of {value.bit_length():,} bits (more than {INT_LIMIT.bit_length() - 1})"


def check_types(cfg: Config, where: Callable[..., str]) -> None:
    """Rejects values of the wrong type that a recipe (or an overrides file) assigned directly, and a renamed key a
    recipe assigned (a dataclass takes any attribute: ``c.model.grad_checkpointing = True`` would do nothing)."""
    for section_name, section in [(n, getattr(cfg, n)) for n in fields_of(cfg)]:
        if not dataclasses.is_dataclass(section):
            continue
        for old in (f"{section_name}.{name}" for name in vars(section)):
            if old in RENAMED:
                raise UserError(renamed_line(where(old), old))
        hints = typing.get_type_hints(type(section))
        for name in fields_of(section):
            key, value, typ = f"{section_name}.{name}", getattr(section, name), hints[name]
            if (big := huge_int(value)) is not None:
                raise UserError(f"{where(key)}: '{key}' holds {too_large(big)}; fix the recipe or override")
            args = typing.get_args(typ)
            if typing.get_origin(typ) is Literal:  # allowed values are declared with the field
                if isinstance(value, bool) and "on" in args and "off" in args:
                    setattr(section, name, "on" if value else "off")
                elif value not in args:
                    raise UserError(f"{where(key)}: '{key}' is '{value}'; choose one of {', '.join(args)}")
                continue
            if typing.get_origin(typ) in (typing.Union, types.UnionType):  # Optional[X] or X | None
                if value is None and type(None) in args:
                    continue
                typ = next(a for a in args if a is not type(None))
            typ = container_of(typ)
            ok = isinstance(value, typ) and not (typ is int and isinstance(value, bool))
            if typ is float and isinstance(value, int) and not isinstance(value, bool):
                setattr(section, name, float(value))
                ok = True
            if typ is tuple and isinstance(value, list):
                setattr(section, name, tuple(value))
                ok = True
            if typ is list and isinstance(value, tuple):
                setattr(section, name, list(value))
                ok = True
            if not ok:
                raise UserError(
                    f"{where(key)}: '{key}' must be {article(typ.__name__)}, got {value!r}; fix the recipe or override"
                )
