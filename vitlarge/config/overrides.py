"""Dotted ``key=value`` overrides: a key resolved against the schema (unknown keys rejected with the closest
match), a dict's entry or a phase's key set by its path, and the value typed (`vitlarge.config.coerce`)."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import typing
from typing import Any, Literal

from vitlarge.config.coerce import container_of, fields_of, parse_literal, parse_value, unwrap_optional
from vitlarge.config.renamed import RENAMED, renamed_line
from vitlarge.config.schema import PHASE_KEYS, Config, PhaseEntry
from vitlarge.errors import UserError


def all_keys(cfg: Config) -> list[str]:
    keys = []
    for name in fields_of(cfg):
        value = getattr(cfg, name)
        if dataclasses.is_dataclass(value):
            keys += [f"{name}.{sub}" for sub in fields_of(value)]
        else:
            keys.append(name)
    return keys


def _unknown_key(key: str, cfg: Config, origin: str) -> UserError:
    if key in RENAMED:
        return UserError(renamed_line(origin, key))
    close = difflib.get_close_matches(key, all_keys(cfg), n=1, cutoff=0.5)
    hint = f"did you mean '{close[0]}'?" if close else "the keys are declared in vitlarge/config/schema.py"
    return UserError(f"{origin}: unknown config key '{key}'; {hint}")


def _resolve(cfg: Config, key: str, origin: str):
    """``(dataclass, field name, declared type, the rest of the key)``; the rest addresses an entry of a dict
    or list field (``model.kwargs.depth``, ``train.phases.1.image_size``)."""
    parts, target = key.split("."), cfg
    for i, part in enumerate(parts):
        if not dataclasses.is_dataclass(target) or part not in fields_of(target):
            raise _unknown_key(key, cfg, origin)
        value, rest = getattr(target, part), parts[i + 1 :]
        if dataclasses.is_dataclass(value) and rest:
            target = value
            continue
        if dataclasses.is_dataclass(value):
            raise UserError(
                f"{origin}: '{key}' is a section; set one of its fields, e.g. {key}.{next(iter(fields_of(value)))}=..."
            )
        typ = typing.get_type_hints(type(target))[part]
        if rest and container_of(unwrap_optional(typ)[0]) not in (dict, list):
            raise _unknown_key(key, cfg, origin)
        return target, part, typ, rest
    raise _unknown_key(key, cfg, origin)


def _set_entry(target, name: str, rest: list[str], value, key: str, item: str, origin: str) -> None:
    """Sets one entry of the dict or list field ``name`` (on a copy, so a refused override changes nothing);
    in a list, the index equal to its length adds an entry (a new phase)."""
    field_key = key[: len(key) - len(".".join(rest)) - 1]
    root: Any = copy.deepcopy(getattr(target, name))
    if field_key == "train.phases":  # typed entries are edited in their dict form, typed again by `validate`
        root = [p.to_dict() if isinstance(p, PhaseEntry) else p for p in root]
    node, path = root, field_key
    index: Any  # a list's position or a dict's key
    for depth, part in enumerate(rest):
        last = depth == len(rest) - 1
        if isinstance(node, list):
            if not part.isdigit():
                raise UserError(
                    f"{origin}: '{item}': '{part}' is not an index of {path}; write it like {path}.0.<key>=<value>"
                )
            index = int(part)
            if index > len(node):
                raise UserError(
                    f"{origin}: '{item}': {path} has {len(node)} entries; "
                    f"use an index from 0 to {len(node)} ({len(node)} adds one)"
                )
            if index == len(node):
                node.append(value if last else {})
            elif last:
                node[index] = value
        elif isinstance(node, dict):
            if field_key == "train.phases" and path != field_key and part not in PHASE_KEYS:
                close = difflib.get_close_matches(part, PHASE_KEYS, n=1, cutoff=0.5)
                hint = f"did you mean '{close[0]}'?" if close else f"use one of {', '.join(PHASE_KEYS)}"
                raise UserError(f"{origin}: unknown phase key '{part}' in '{key}'; {hint}")
            if last:
                node[part] = value
            else:
                node.setdefault(part, {})
            index = part
        else:
            raise UserError(f"{origin}: '{item}': {path} is {node!r}, not a dict or a list; set {path} itself")
        if not last:
            node, path = node[index], f"{path}.{part}"
            if not isinstance(node, (dict, list)):
                raise UserError(f"{origin}: '{item}': {path} is {node!r}, not a dict; set {path} itself")
    setattr(target, name, root)


def apply_override(cfg: Config, item: str, origin: str = "command line") -> str:
    """Applies one ``dotted.key=value`` override in place; returns the key of the field it set (``model.kwargs``
    for ``model.kwargs.depth=2``). No form needs shell metacharacters: tuples as ``optim.betas=0.9,0.98``, a dict's
    entry as ``model.kwargs.depth=2``, a phase's key as ``train.phases.1.image_size=192``."""
    if "=" not in item:
        raise UserError(f"{origin}: override '{item}' has no '='; write it as key=value, e.g. optim.lr=0.01")
    key, text = item.split("=", 1)
    key, text = key.strip(), text.strip()
    target, name, typ, rest = _resolve(cfg, key, origin)
    if rest:
        _set_entry(target, name, rest, parse_literal(text), key, item, origin)
    else:
        setattr(target, name, parse_value(text, typ, key, origin))
    return key[: len(key) - len(".".join(rest)) - 1] if rest else key


def set_value(cfg: Config, key: str, value, origin: str) -> str:
    """Sets ``key`` to a value read from an overrides file (text is parsed as on the command line; other
    values are type-checked by `validate`). Returns the field's key, as `apply_override` does."""
    if isinstance(value, str):
        return apply_override(cfg, f"{key}={value}", origin)
    target, name, typ, rest = _resolve(cfg, key, origin)
    if rest:
        _set_entry(target, name, rest, value, key, f"{key}={value!r}", origin)
        return key[: len(key) - len(".".join(rest)) - 1]
    plain, _ = unwrap_optional(typ)
    if typing.get_origin(plain) is Literal and isinstance(value, bool):  # YAML's on/off are booleans
        value = "on" if value else "off"
    setattr(target, name, value)
    return key
