"""The schema's keys with their docstrings, for ``train.py --help``: each field's docstring as declared under it in
vitlarge/config/schema.py (read from the source, which Python keeps no copy of at run time), with the schema's
default written as an override. Imports nothing from torch, so ``--help`` is as fast as argparse."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import typing
from typing import Literal

from vitlarge.config import schema


def attribute_docs(cls: type) -> dict[str, str]:
    """``{field: docstring}`` of a dataclass: the string literal right below each annotated field."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
    assert isinstance(body, ast.ClassDef)
    docs: dict[str, str] = {}
    for stmt, after in zip(body.body, body.body[1:]):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[stmt.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _default(value) -> str:
    """A default as an override writes it (``optim.betas=0.9,0.999``, ``none``, ``true``)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return ",".join(f"{x:g}" for x in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value) if value not in ("", [], {}) else repr(value)


def keys_help(width: int = 100) -> str:
    """Every section of the schema with its docstring, then its keys, each ``key = default`` (and the choices of a
    key that takes one of a few words) and its docstring."""
    lines = ["config keys (set as key=value after the flags; the schema's defaults, which a recipe changes):"]
    defaults, sections = schema.Config(), attribute_docs(schema.Config)
    wrap = textwrap.TextWrapper(width=width, initial_indent=" " * 6, subsequent_indent=" " * 6)
    for f in dataclasses.fields(schema.Config):
        section = getattr(defaults, f.name)
        if not dataclasses.is_dataclass(section):
            lines += ["", f"  {f.name} = {_default(section)}", *wrap.wrap(_plain_text(sections.get(f.name, "")))]
            continue
        lines += ["", f"{f.name}: {_plain_text(sections.get(f.name, ''))}"]
        docs, hints = attribute_docs(type(section)), typing.get_type_hints(type(section))
        for sub in dataclasses.fields(section):
            choices = typing.get_args(hints[sub.name]) if typing.get_origin(hints[sub.name]) is Literal else ()
            one_of = f"  (one of {', '.join(choices)})" if choices else ""
            lines.append(f"  {f.name}.{sub.name} = {_default(getattr(section, sub.name))}{one_of}")
            lines += wrap.wrap(_plain_text(docs.get(sub.name, "")))
    return "\n".join(lines) + "\n"


def _plain_text(doc: str) -> str:
    """A docstring as one paragraph of plain text (reST's double backticks dropped)."""
    return " ".join(doc.replace("``", "").split())
