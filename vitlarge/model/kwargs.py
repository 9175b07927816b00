"""``model.kwargs`` against the types timm's model class declares for its parameters.

The config schema cannot type ``model.kwargs`` (its keys are the chosen class's), so a text where timm
expects an int (``model.kwargs.depth=two``) reached timm's constructor: a TypeError deep inside it, or
worse, a model built with the text taken as true (``qkv_bias=no``). The class's own annotations
(``depth: int``, ``global_pool: Literal['', 'avg', ...]``, ``init_values: Optional[float]``) say what
each key takes; an annotation these checks cannot read (a callable, a layer type) accepts any value.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal


def _fits(value: Any, annotation: Any) -> bool:
    """Whether ``value`` (an override's literal: int, float, bool, text, None, tuple or list) is of ``annotation``;
    True for an annotation that says nothing these checks can read."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None) or annotation is None:
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if origin in (tuple, list):
        if not isinstance(value, (tuple, list)):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:  # Tuple[int, int]: one type per place
            return len(args) == len(value) and all(map(_fits, value, args))
        return all(_fits(v, args[0]) for v in value) if args else True
    return True


def _words(annotation: Any) -> str:
    """What ``annotation`` takes, in the words of an override."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None) or annotation is None:
        return "none"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) if a == "" else str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(dict.fromkeys(_words(a) for a in args))
    if origin in (tuple, list):
        return "numbers separated by commas"
    return {bool: "true or false", int: "an int", float: "a number", str: "a text"}.get(annotation, "a value")


def _text(value: Any) -> str:
    """``value`` as an override writes it."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "none"
    if isinstance(value, (tuple, list)):
        return ",".join(_text(v) for v in value)
    return "''" if value == "" else str(value)


def kwargs_problem(model_cls: type, kwargs: Mapping[str, Any]) -> str | None:
    """The first entry of ``model.kwargs`` whose value is not of the type ``model_cls.__init__`` declares, as one
    line naming the key, what it takes and a setting that works (the class's default); None if all fit."""
    try:
        hints = typing.get_type_hints(model_cls.__init__)
        parameters = inspect.signature(model_cls.__init__).parameters
    except Exception:  # noqa: BLE001 (an annotation that does not resolve: nothing to check against)
        return None
    for key, value in kwargs.items():
        if key in hints and not _fits(value, hints[key]):
            default = parameters[key].default if key in parameters else inspect.Parameter.empty
            example = (
                f"; write it like model.kwargs.{key}={_text(default)}"
                if default is not inspect.Parameter.empty and _fits(default, hints[key])
                else ""
            )
            return f"model.kwargs.{key}={_text(value)[:60]}: {model_cls.__name__} takes {_words(hints[key])} for {key}{example}"
    return None


def class_built(tb: types.TracebackType | None) -> type | None:
    """The model class timm was building when the error of ``tb`` was raised: ``model_cls`` of timm's
    ``build_model_with_cfg`` (every timm model is built through it), else None."""
    from timm.models._builder import build_model_with_cfg  # lazy: keeps timm off a run's pre-flight checks

    while tb is not None:
        if tb.tb_frame.f_code is build_model_with_cfg.__code__:
            cls = tb.tb_frame.f_locals.get("model_cls")
            return cls if isinstance(cls, type) else None
        tb = tb.tb_next
    return None
