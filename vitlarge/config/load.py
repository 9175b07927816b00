"""Loading a recipe, dotted ``key=value`` overrides and validation, all before the world size is known.

``load_config(path, overrides)`` runs the recipe, applies the overrides (type-checked; unknown keys
rejected with the closest match) and validates the result: one line naming the key and a valid
setting for each bad value. ``vitlarge.plan.plan.make_plan`` then derives the step counts for a
world size. This module imports nothing from torch, so recipes load fast and ``--dry-run`` touches no data.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import difflib
import importlib.util
import math
import re
import sys
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from vitlarge.config.schema import PHASE_KEYS, Config, PhaseEntry, Rule, rule_of
from vitlarge.errors import UserError


def _fields(obj) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(obj)}


def all_keys(cfg: Config) -> list[str]:
    keys = []
    for name in _fields(cfg):
        value = getattr(cfg, name)
        if dataclasses.is_dataclass(value):
            keys += [f"{name}.{sub}" for sub in _fields(value)]
        else:
            keys.append(name)
    return keys


def _unknown_key(key: str, cfg: Config, origin: str) -> UserError:
    close = difflib.get_close_matches(key, all_keys(cfg), n=1, cutoff=0.5)
    hint = f"did you mean '{close[0]}'?" if close else "the keys are declared in vitlarge/config/schema.py"
    return UserError(f"{origin}: unknown config key '{key}'; {hint}")


def _article(noun: str) -> str:
    return f"an {noun}" if noun[0] in "aeiou" else f"a {noun}"


def _plain(typ):
    """``X`` of ``X | None`` (and whether None is allowed)."""
    args = typing.get_args(typ)
    if typing.get_origin(typ) in (typing.Union, types.UnionType) and type(None) in args:
        return next(a for a in args if a is not type(None)), True
    return typ, False


def _container(typ):
    """``list`` of ``list[PhaseEntry]`` (what an override's text and a recipe's value are checked against)."""
    origin = typing.get_origin(typ)
    return origin if origin in (list, dict) else typ


# What an override's text must look like, by declared type, in the words of an error message.
_WHAT = {int: "an int", float: "a number", bool: "true or false", tuple: "numbers separated by commas"}


def _example(key: str, typ) -> str:
    """A valid setting of ``key`` for a message: the schema's default, written as an override."""
    try:
        default = _get(Config(), key)
    except AttributeError:
        default = None
    plain, optional = _plain(typ)
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


def _parse_value(text: str, typ, key: str, origin: str):
    """Turns override text into the declared type of ``key``; ``None``/``none`` where Optional."""
    item = f"{key}={text}"
    typ, optional = _plain(typ)
    if optional and text.lower() in ("none", "null"):
        return None
    if typing.get_origin(typ) is Literal:
        choices = typing.get_args(typ)
        value = _on_off(choices, text)
        if value not in choices:
            raise UserError(f"{origin}: '{item}' is not one of {', '.join(choices)}; write it like {key}={choices[0]}")
        return value
    typ = _container(typ)
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
            f"{origin}: '{item}' is not {_WHAT.get(typ, _article(getattr(typ, '__name__', str(typ))))}; "
            f"write it like {_example(key, typ if not optional else typ | None)}"
        ) from None


def _literal(text: str):
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


def _resolve(cfg: Config, key: str, origin: str):
    """``(dataclass, field name, declared type, the rest of the key)``; the rest addresses an entry of a dict
    or list field (``model.kwargs.depth``, ``train.phases.1.image_size``)."""
    parts, target = key.split("."), cfg
    for i, part in enumerate(parts):
        if not dataclasses.is_dataclass(target) or part not in _fields(target):
            raise _unknown_key(key, cfg, origin)
        value, rest = getattr(target, part), parts[i + 1 :]
        if dataclasses.is_dataclass(value) and rest:
            target = value
            continue
        if dataclasses.is_dataclass(value):
            raise UserError(
                f"{origin}: '{key}' is a section; set one of its fields, e.g. {key}.{next(iter(_fields(value)))}=..."
            )
        typ = typing.get_type_hints(type(target))[part]
        if rest and _container(_plain(typ)[0]) not in (dict, list):
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
        _set_entry(target, name, rest, _literal(text), key, item, origin)
    else:
        setattr(target, name, _parse_value(text, typ, key, origin))
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
    plain, _ = _plain(typ)
    if typing.get_origin(plain) is Literal and isinstance(value, bool):  # YAML's on/off are booleans
        value = "on" if value else "off"
    setattr(target, name, value)
    return key


def _check_types(cfg: Config, where: _Where) -> None:
    """Rejects values of the wrong type that a recipe (or an overrides file) assigned directly."""
    for section_name, section in [(n, getattr(cfg, n)) for n in _fields(cfg)]:
        if not dataclasses.is_dataclass(section):
            continue
        hints = typing.get_type_hints(type(section))
        for name in _fields(section):
            key, value, typ = f"{section_name}.{name}", getattr(section, name), hints[name]
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
            typ = _container(typ)
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
                    f"{where(key)}: '{key}' must be {_article(typ.__name__)}, got {value!r}; fix the recipe or override"
                )


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def _get(cfg: Config, key: str):
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def field_rules() -> list[tuple[str, Rule]]:
    """``(dotted key, rule)`` of every field that declares a `Rule` (schema order)."""
    out, defaults = [], Config()
    for name in _fields(defaults):
        section = getattr(defaults, name)
        if dataclasses.is_dataclass(section):
            out += [(f"{name}.{f.name}", rule_of(f)) for f in dataclasses.fields(section) if rule_of(f)]
    return out


def _check_ranges(cfg: Config, where: _Where) -> None:
    """One line per bad value: the key, the rule, the value, and a valid setting (the schema's default)."""
    for key, rule in field_rules():
        value = _get(cfg, key)
        if rule.pair:
            if not (len(value) == 2 and all(map(_finite, value)) and rule.test(*value)):
                example = ",".join(f"{x:g}" for x in _get(Config(), key))
                raise UserError(f"{where(key)}: '{key}' must be {rule.words}, got {value}; set it like {key}={example}")
        elif not (_finite(value) and rule.test(value)):
            raise UserError(
                f"{where(key)}: '{key}' must be {rule.words}, got {value}; set it like {key}={_get(Config(), key)}"
            )


MAX_PROFILE_STEPS = 20
"""The longest ``train.profile_steps`` window: a ViT-L step with accumulation records ~10^5 events per rank,
all held in host memory until the window ends and then written as one JSON file per rank."""


def parse_step_window(text: str) -> tuple[int, int]:
    """``"START-END"`` (``train.profile_steps``) as ``(START, END)``; ValueError unless two non-negative integers
    joined by a dash. Which windows are allowed is `validate`'s (START >= 1, END >= START)."""
    match = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", text)
    if match is None:
        raise ValueError(f"not START-END: {text!r}")
    return int(match[1]), int(match[2])


def _check_profile_window(t, where: _Where) -> None:
    """``train.profile_steps``: a window of optimizer steps inside the run, as far as the config alone tells (the
    plan's own last step is checked with the plan: `vitlarge.train.profile.check_window`)."""
    if t.profile_steps is None:
        return
    item, origin = f"train.profile_steps={t.profile_steps}", where("train.profile_steps")
    try:
        start, end = parse_step_window(t.profile_steps)
    except ValueError:
        raise UserError(
            f"{origin}: {item} is not a window START-END of optimizer steps; write it like "
            "train.profile_steps=100-105 (1-based, both ends included) or train.profile_steps=none"
        ) from None
    if end < start:
        raise UserError(
            f"{origin}: {item} ends before it starts; write the first step first, like train.profile_steps={end}-{start}"
        )
    if start < 1:
        raise UserError(
            f"{origin}: {item} starts at step {start}, but optimizer steps count from 1; write it like "
            f"train.profile_steps=1-{max(1, end)}"
        )
    if end - start + 1 > MAX_PROFILE_STEPS:
        raise UserError(
            f"{origin}: {item} records {end - start + 1} steps; a window holds at most {MAX_PROFILE_STEPS} (every "
            f"event of every rank stays in host memory until the window ends), like "
            f"train.profile_steps={start}-{start + MAX_PROFILE_STEPS - 1}"
        )
    if t.max_steps and end > t.max_steps:
        raise UserError(
            f"{where('train.profile_steps', 'train.max_steps')}: {item} ends after step {t.max_steps}, the run's last "
            f"(train.max_steps={t.max_steps}); end the window by step {t.max_steps} or raise train.max_steps"
        )


class _Where:
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
    where = _Where(origin)
    _check_types(cfg, where)
    _check_ranges(cfg, where)
    for problem in cfg.problems():
        raise UserError(f"{where(*problem.keys)}: {problem.text}")
    if cfg.train.phases:
        from vitlarge.config.phase_list import check

        check(cfg, origin)


def validate(cfg: Config, origin: str = "config", overridden: dict[str, str] | None = None) -> None:
    """Checks everything that can be checked before the world size is known. ``overridden`` maps the keys that
    overrides set to where they came from (``command line``, a file): a message about them names that, not ``origin``."""
    where = _Where(origin, overridden)
    if cfg.train.plugin == "zero":  # removed: it needed CUDA, no test ran it, and it was broken
        raise UserError(
            f"{where('train.plugin')}: train.plugin=zero was removed; use train.plugin=fsdp (sharded weights, "
            "gradients and optimizer states; CPU and CUDA)"
        )
    _check_types(cfg, where)  # also the allowed values of the Literal fields
    _check_ranges(cfg, where)
    for problem in cfg.problems():
        raise UserError(f"{where(*problem.keys)}: {problem.text}")
    t = cfg.train
    _check_profile_window(t, where)
    if t.phases:
        from vitlarge.config.phase_list import check, entries

        check(cfg, where("train.phases", "train.epochs", "data.image_size", "train.global_batch", "train.micro_batch"))
        t.phases = entries(t.phases)
    _check_log(cfg, where)


# The schemes MLflow's stores take (its tracking-URI grammar): a server, a database through SQLAlchemy, Databricks.
MLFLOW_SCHEMES = ("http", "https", "sqlite", "postgresql", "mysql", "mssql", "databricks", "file")
TRACKERS_FIX = "pip install -r requirements/trackers.txt"


def mlflow_uri_problem(uri: str) -> str | None:
    """Why ``uri`` is not an MLflow tracking URI, or None. Checked before the rendezvous: a typo would otherwise
    cost a whole run's metrics (the hook never stops training, so it would only warn)."""
    import os
    import urllib.parse

    if uri == "databricks":
        return None
    try:
        u = urllib.parse.urlsplit(uri)
        _ = u.port  # raises on a port that is not a number or out of range
    except ValueError as e:
        return f"not a URI ({e})"
    scheme = u.scheme.split("+")[0]  # postgresql+psycopg2://
    if not scheme or not uri.startswith(f"{u.scheme}:"):  # host:port parses as scheme "host"
        return "no scheme (http://, sqlite:///...)"
    if scheme not in MLFLOW_SCHEMES:
        return f"scheme '{u.scheme}' is not one of {', '.join(s + '://' for s in MLFLOW_SCHEMES)}"
    if scheme in ("http", "https") and not u.hostname:
        return "an http(s) URI needs a host"
    if scheme == "sqlite" and not u.path.strip("/"):
        return "an sqlite URI needs a file, sqlite:///path/mlflow.db"
    if scheme == "file" and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("true", "1"):
        # MLflow >= 3.13 refuses its file store at runtime (the run would go untracked): refused here instead.
        return "MLflow (>= 3.13) refuses its file store unless MLFLOW_ALLOW_FILE_STORE=true"
    return None


def _importable(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a finder that refuses it; a module left half-imported
        return False


def _check_log(cfg: Config, where: _Where) -> None:
    """Trackers turned on must be installed and reachable by a well-formed URI (one line each; the rendezvous
    has not started, so every rank says the same and none waits)."""
    import os

    log = cfg.log
    for on, name, key in ((log.mlflow, "mlflow", "log.mlflow"), (log.wandb, "wandb", "log.wandb")):
        if on and not _importable(name):
            raise UserError(
                f"{where(key)}: {key}=true but the {name} package is not installed; {TRACKERS_FIX} or set {key}=false"
            )
    if log.mlflow_uri is not None:
        problem = mlflow_uri_problem(log.mlflow_uri)
        if problem:
            raise UserError(
                f"{where('log.mlflow_uri')}: log.mlflow_uri={log.mlflow_uri!r}: {problem}; set it like "
                "log.mlflow_uri=http://127.0.0.1:5000 or sqlite:///runs/mlflow.db (none: <workdir>/mlflow.db)"
            )
    elif log.mlflow and os.environ.get("MLFLOW_TRACKING_URI"):
        problem = mlflow_uri_problem(os.environ["MLFLOW_TRACKING_URI"])
        if problem:
            raise UserError(
                f"MLFLOW_TRACKING_URI={os.environ['MLFLOW_TRACKING_URI']!r} (used by log.mlflow=true): {problem}; "
                "fix the variable, unset it (<workdir>/mlflow.db) or set log.mlflow_uri"
            )


def shipped_recipes() -> Path:
    """The folder of the shipped recipes: the checkout's recipes/, or vitlarge/recipes/ where installed (both
    are the package ``vitlarge.recipes``)."""
    from vitlarge import beside

    return Path(next(iter(beside("recipes").__path__)))


def _no_recipe(given: Path, path: Path) -> UserError:
    """A recipe that is not there: the closest name in its folder (or among the shipped ones), else what exists."""
    bare = given == Path(given.name) and given.suffix == ""
    names = sorted(p.stem for p in path.parent.glob("*.py") if p.stem != "__init__") if path.parent.is_dir() else []
    close = difflib.get_close_matches(path.stem, names, n=1, cutoff=0.6)
    if close:
        guess = close[0] if bare else str(given.with_name(close[0] + ".py"))
        return UserError(f"recipe {given} does not exist; did you mean {guess}?")
    shipped = ", ".join(p.stem for p in sorted(shipped_recipes().glob("*.py")) if p.stem != "__init__")
    if bare:
        return UserError(f"recipe {given}: no shipped recipe has that name ({shipped}); or pass a recipe file's path")
    return UserError(f"recipe {path} does not exist; pass a recipe file's path or a shipped recipe's name ({shipped})")


def _relative_import(path: Path) -> UserError:
    """The fix for a recipe that imports its base relatively (``from .vit_b16 import config``) from outside a
    package, where Python cannot resolve it: a recipe copied out of a package, or one of one's own."""
    line = "it imports relatively"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in node.names)
            line = (
                f"line {node.lineno}, 'from {'.' * node.level}{node.module or ''} import {names}', is a relative import"
            )
            if node.level == 1 and node.module and (shipped_recipes() / f"{node.module}.py").is_file():
                return UserError(
                    f"recipe {path}: {line}, which works only inside recipes/; import the shipped recipe by its "
                    f"full name: from vitlarge.recipes.{node.module} import {names}"
                )
            break
    return UserError(
        f"recipe {path}: {line}, which works only inside a package; import by the full name "
        f"(from vitlarge.recipes.vit_b16 import config), or put an __init__.py in {path.parent}"
    )


def load_recipe(path: str | Path) -> Config:
    """Runs a recipe file and returns its ``config()``; errors name the file. ``path``: a recipe file, or a shipped
    recipe's name (``vit_b16``). A recipe is Python by design: it derives from a shipped one (``from
    vitlarge.recipes.vit_b16 import config as base``) and changes fields, with the editor's and the type
    checker's help on every name; `validate` checks the result as strictly as an override."""
    given = path = Path(path)
    if not path.is_file() and path.suffix == "" and len(path.parts) == 1:  # a shipped recipe's name: vit_b16
        path = shipped_recipes() / f"{path}.py"
    if not path.is_file():
        raise _no_recipe(given, path)
    root, package = path.resolve().parent, []
    while (root / "__init__.py").is_file():  # recipes/ (vitlarge.recipes installed): loaded as that package's
        package.insert(0, root.name)
        root = root.parent
    if not package:  # a recipe of one's own, in the checkout's tree: it may import its base as recipes.<name>
        root = path.resolve().parent.parent
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    if package:
        importlib.import_module(".".join(package))
    name = ".".join([*package, path.stem]) if package else f"_vitlarge_recipe_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:  # not a Python source file
        raise UserError(f"recipe {path} is not a Python file; pass --config recipes/<name>.py")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except UserError:
        raise
    except ImportError as e:
        if "relative import" in str(e):
            raise _relative_import(path) from None
        raise UserError(f"recipe {path} failed to load: {type(e).__name__}: {e}") from None
    except Exception as e:
        raise UserError(f"recipe {path} failed to load: {type(e).__name__}: {e}") from None
    if not callable(getattr(module, "config", None)):
        raise UserError(f"recipe {path} defines no config() function; add 'def config() -> Config'")
    try:
        cfg = module.config()
    except UserError:
        raise
    except Exception as e:
        raise UserError(f"recipe {path}: config() raised {type(e).__name__}: {e}") from None
    if not isinstance(cfg, Config):
        raise UserError(f"recipe {path}: config() returned {type(cfg).__name__}, not vitlarge.config.schema.Config")
    return cfg


OVERRIDES_FILE_MAX_BYTES = 1 << 20


def read_overrides_file(path: str | Path) -> list[tuple[str, object]]:
    """``(dotted key, value)`` pairs of an overrides file (``--overrides FILE``), in file order. A ``.py`` file is
    parsed, never run: each statement is ``dotted.key = literal`` (``train.phases[1]["image_size"] = 192`` too); a
    ``.yaml``/``.yml`` file (needs PyYAML) is a mapping, nested or with dotted keys. Errors name the file (and line)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--overrides {path} does not exist; pass a .py or .yaml file of overrides")
    with open(path, "rb") as f:
        raw = f.read(OVERRIDES_FILE_MAX_BYTES + 1)
    if len(raw) > OVERRIDES_FILE_MAX_BYTES:
        raise UserError(f"{path}: larger than {OVERRIDES_FILE_MAX_BYTES} bytes; an overrides file is a few lines")
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text; an overrides file is a .py or .yaml file") from None
    if path.suffix in (".yaml", ".yml"):
        return _yaml_overrides(path, text)
    if path.suffix != ".py":
        raise UserError(f"{path}: unknown kind of overrides file; name it .py (key = value lines) or .yaml")
    return _python_overrides(path, text)


def _dotted(node: ast.expr) -> str | None:
    """``optim.betas`` / ``train.phases[1]["image_size"]`` as ``train.phases.1.image_size``; None if not that."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr}" if head else None
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        head = _dotted(node.value)
        index = node.slice.value
        return f"{head}.{index}" if head and isinstance(index, (int, str)) and not isinstance(index, bool) else None
    return None


def _python_overrides(path: Path, text: str) -> list[tuple[str, object]]:
    try:
        tree = ast.parse(text, filename=str(path))
    except SyntaxError as e:
        raise UserError(f"{path}:{e.lineno}: not Python ({e.msg}); write one 'dotted.key = value' per line") from None
    except (MemoryError, RecursionError):  # 100,000 unary minus signs; 1+1+... nested past the parser's stack
        raise UserError(
            f"{path}: an expression nested too deeply to parse; write one 'dotted.key = value' per line, each value "
            "a literal"
        ) from None
    pairs = []
    for stmt in tree.body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
            continue  # a docstring
        key = _dotted(stmt.targets[0]) if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else None
        if key is None or not isinstance(stmt, ast.Assign):
            raise UserError(
                f"{path}:{stmt.lineno}: not an assignment 'dotted.key = value' (the file is read, never run), "
                "e.g. optim.betas = (0.9, 0.98)"
            )
        try:
            value = ast.literal_eval(stmt.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise UserError(
                f"{path}:{stmt.lineno}: the value of {key} is not a literal (numbers, strings, True/False/None, "
                "tuples, lists, dicts); write the value itself"
            ) from None
        pairs.append((key, value))
    return pairs


YAML_MAX_DEPTH = 32  # levels of nesting in an overrides file: a phase list's entries sit at level 3
YAML_MAX_NODES = 2_000  # keys, values and items: a 100-entry phase list of five keys each is about 1,100


def _plain_yaml_loader(yaml, path: Path):
    """PyYAML's safe loader without anchors or aliases and with at most `YAML_MAX_DEPTH` levels and
    `YAML_MAX_NODES` nodes, each refused in one line as the composer meets it: aliases let a few lines
    stand for billions of values (``a1: [*a0, *a0]`` doubling) or for a cycle, and a deep nesting reaches
    Python's recursion limit."""

    class PlainLoader(yaml.SafeLoader):
        depth = nodes = 0

        def compose_node(self, parent, index):
            event = self.peek_event()
            line = f"{path}:{event.start_mark.line + 1}"
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                raise UserError(f"{line}: an anchor or alias (&name, *name); an overrides file writes each value out")
            self.nodes += 1
            if self.nodes > YAML_MAX_NODES:
                raise UserError(f"{line}: more than {YAML_MAX_NODES:,} values; an overrides file is a few lines")
            if self.depth >= YAML_MAX_DEPTH:
                raise UserError(
                    f"{line}: nested deeper than {YAML_MAX_DEPTH} levels; an overrides file maps keys to values"
                )
            self.depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def construct_object(self, node, deep=False):
            try:
                return super().construct_object(node, deep)
            except ValueError as e:  # a date past its month, !!int x, an int of more digits than Python converts
                if not isinstance(node, yaml.ScalarNode):
                    raise
                reason = " ".join(str(e).split(";")[0].split())[:120]
                raise UserError(
                    f"{path}:{node.start_mark.line + 1}: {node.value[:40]!r} is not a value YAML reads ({reason}); "
                    "write a number, true/false or a quoted text"
                ) from None

    return PlainLoader


def _yaml_overrides(path: Path, text: str) -> list[tuple[str, object]]:
    try:
        import yaml
    except ImportError:
        raise UserError(
            f"{path}: reading YAML needs PyYAML (pip install pyyaml); or write a .py overrides file"
        ) from None
    try:
        data = yaml.load(text, Loader=_plain_yaml_loader(yaml, path))  # safe_load's loader, narrowed
    except yaml.YAMLError as e:
        raise UserError(f"{path}: not YAML ({' '.join(str(e).split())})") from None
    except (MemoryError, RecursionError):
        raise UserError(f"{path}: too large or too deeply nested to read; an overrides file is a few lines") from None
    if not isinstance(data, dict):
        raise UserError(
            f"{path}: holds {type(data).__name__}, not a mapping of keys to values, e.g. 'optim: {{lr: 0.01}}'"
        )

    def flat(d: dict, prefix: str) -> list[tuple[str, object]]:
        out = []
        for k, v in d.items():
            key = f"{prefix}{k}"
            out += flat(v, key + ".") if isinstance(v, dict) and v else [(key, v)]
        return out

    return flat(data, "")


def load_config(
    path: str | Path, overrides: Sequence[str] = (), override_files: Sequence[str | Path] = (), **direct: str | None
) -> Config:
    """Recipe + direct settings (``data.path``, ``workdir``) + overrides files in order + dotted overrides (the
    command line wins), validated; an error about a key an override set names the override's origin."""
    cfg = load_recipe(path)
    overridden: dict[str, str] = {}
    for key, value in direct.items():
        if value is not None:
            overridden[apply_override(cfg, f"{key.replace('__', '.')}={value}")] = "command line"
    for file in override_files:
        for key, value in read_overrides_file(file):
            overridden[set_value(cfg, key, value, str(file))] = str(file)
    for item in overrides:
        overridden[apply_override(cfg, item)] = "command line"
    if cfg.log.experiment is None:  # the trackers' experiment: the recipe's name unless set
        cfg.log.experiment = Path(path).stem
    validate(cfg, origin=str(path), overridden=overridden)
    return cfg
