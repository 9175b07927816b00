"""Override text as the schema's declared types: one line naming the key and a valid setting for a value of the
wrong type (``optim.lr=abc``); a recipe's values are checked against the same types by
`vitlarge.config.checks.check_types` (``train.epochs = "90"``).

Written out rather than through pydantic's ``TypeAdapter``: pydantic agrees on plain ints, floats and booleans, but
the override forms that need no shell quoting are not its grammar (``optim.betas=0.9,0.98``, a dict entry, ``none``
for an Optional, ``true`` for a Literal's ``on``, ``1.5e3`` for an int), it reads ``t``/``y`` as booleans, its
messages are three lines with a link, and importing it with its adapters costs more than loading the config itself
on every start and ``--dry-run`` (~0.85 s against ~0.4 s; nothing else on the start-up path imports it)."""

from __future__ import annotations

import ast
import dataclasses
import types
import typing
from typing import Literal

from vitlarge.config.schema import Config
from vitlarge.errors import UserError


def fields_of(obj) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(obj)}


def get_key(cfg: Config, key: str):
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def article(noun: str) -> str:
    return f"an {noun}" if noun[0] in "aeiou" else f"a {noun}"


def unwrap_optional(typ):
    """``X`` of ``X | None`` (and whether None is allowed)."""
    args = typing.get_args(typ)
    if typing.get_origin(typ) in (typing.Union, types.UnionType) and type(None) in args:
        return next(a for a in args if a is not type(None)), True
    return typ, False


def container_of(typ):
    """``list`` of ``list[PhaseEntry]`` (what an override's text and a recipe's value are checked against)."""
    origin = typing.get_origin(typ)
    return origin if origin in (list, dict) else typ


# What an override's text must look like, by declared type, in the words of an error message.
_WHAT = {int: "an int", float: "a number", bool: "true or false", tuple: "numbers separated by commas"}


def _example(key: str, typ) -> str:
    """A valid setting of ``key`` for a message: the schema's default, written as an override."""
    try:
        default = get_key(Config(), key)
    except AttributeError:
        default = None
    plain, optional = unwrap_optional(typ)
    if isinstance(default, bool):
        text = str(default).lower()
    elif isinstance(default, tuple):
        text = ",".join(f"{x:g}" for x in default)
    elif isinstance(default, float):
        text = f"{default:g}"
    elif default is not None and not isinstance(default, (dict, list)):
        text = str(default)
    else:
        text = {int: "1", float: "0.5", bool: "true", str: "text"}.get(plain, "...")
    return f"{key}={text}" + (" or none" if optional and default is None else "")


def _on_off(args: tuple, text: str) -> str:
    """``true``/``false`` (and their kin) mean ``on``/``off`` for the keys whose choices include both."""
    if "on" in args and "off" in args:
        if text.lower() in ("true", "yes", "1"):
            return "on"
        if text.lower() in ("false", "no", "0"):
            return "off"
    return text


def parse_value(text: str, typ, key: str, origin: str):
    """Turns override text into the declared type of ``key``; ``None``/``none`` where Optional."""
    item = f"{key}={text if len(text) <= 80 else text[:60] + f'... ({len(text):,} characters)'}"
    typ, optional = unwrap_optional(typ)
    if optional and text.lower() in ("none", "null"):
        return None
    if typing.get_origin(typ) is Literal:
        choices = typing.get_args(typ)
        value = _on_off(choices, text)
        if value not in choices:
            raise UserError(f"{origin}: '{item}' is not one of {', '.join(choices)}; write it like {key}={choices[0]}")
        return value
    typ = container_of(typ)
    try:
        if typ is bool:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if typ is int:
            try:
                return int(text)  # exact: float() would round 9007199254740993 to ...992
            except ValueError:
                return int(float(text)) if float(text).is_integer() else int(text)  # 1.5e3, 1e4
        if typ is float:
            return float(text)
        if typ is tuple:
            return tuple(float(x) for x in text.strip("()[] ").split(",") if x.strip())
        if typ in (dict, list):
            value = ast.literal_eval(text)
            if isinstance(value, tuple) and typ is list:
                value = list(value)
            if not isinstance(value, typ):
                raise ValueError
            return value
        return text
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        if typ is dict:
            # depth=2, or depth:2 (what `colossalai run`'s shell leaves of "{'depth': 2}"): the entry it meant
            name, _, value = text.replace(":", "=", 1).partition("=")
            name = name.strip().strip("'\"{")
            entry = (
                f"{key}.{name}={value.strip().rstrip('}')}"
                if value and name.isidentifier()
                else f"{key}.<name>=<value>"
            )
            raise UserError(
                f"{origin}: '{item}' is not a dict; set one entry as {entry}, or give --overrides FILE"
            ) from None
        if typ is list:
            raise UserError(
                f"{origin}: '{item}' is not a list; set one entry's key as {key}.0.<key>=<value>, or give --overrides FILE"
            ) from None
        raise UserError(
            f"{origin}: '{item}' is not {_WHAT.get(typ, article(getattr(typ, '__name__', str(typ))))}; "
            f"write it like {_example(key, typ if not optional else typ | None)}"
        ) from None


def parse_literal(text: str):
    """A dict entry's or a phase key's value: a Python literal (``2``, ``0.5,1``, ``'avg'``), ``true``/``false``/
    ``none``, else the text itself (``avg``)."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return text
