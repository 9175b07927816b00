"""The readers of ``--overrides FILE``: a ``.py`` file parsed (never run) or a ``.yaml`` file read with a narrowed
safe loader, as ``(dotted key, value)`` pairs in file order; errors name the file and line."""

from __future__ import annotations

import ast
from pathlib import Path

from vitlarge.config.checks import huge_int, too_large
from vitlarge.errors import UserError

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
        pairs = _yaml_overrides(path, text)
    elif path.suffix == ".py":
        pairs = _python_overrides(path, text)
    else:
        raise UserError(f"{path}: unknown kind of overrides file; name it .py (key = value lines) or .yaml")
    for key, value in pairs:
        if (v := huge_int(value)) is not None:
            raise UserError(f"{path}: {key} holds {too_large(v)}; no setting is that large")
    return pairs


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
        at = f"{path}:{e.lineno}" if e.lineno else str(path)  # a null byte: no line
        raise UserError(f"{at}: not Python ({e.msg}); write one 'dotted.key = value' per line") from None
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
        import yaml  # lazy: PyYAML off the start of every run, for the runs given a .yaml overrides file
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
