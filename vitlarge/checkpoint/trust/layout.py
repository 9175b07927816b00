"""Where checkpoints live in a workdir, their names, and the one error a checkpoint that fails its check raises.

``<workdir>/checkpoints/step_0000100/`` holds one checkpoint (vitlarge/checkpoint/store.py describes its files);
``.step_*.tmp`` folders are saves in progress and ``abandoned_*`` folders checkpoints a resume moved aside.
"""

from __future__ import annotations

from pathlib import Path

from vitlarge.checkpoint.trust import meta as meta_json
from vitlarge.checkpoint.trust.meta import STEP_DIR
from vitlarge.errors import UserError

CHECKPOINTS_DIR = "checkpoints"
"""The folder under the workdir that holds one ``step_NNNNNNN`` folder per checkpoint."""


def step_name(step: int) -> str:
    """The one spelling of a checkpoint folder's name (``STEP_DIR`` reads it back)."""
    return f"step_{step:07d}"


def step_of(path: Path) -> int:
    match = STEP_DIR.match(path.name)
    assert match is not None, path  # only called on names `step_dirs` matched
    return int(match.group(1))


def step_dirs(root: Path, links: bool = True) -> list[Path]:
    """The ``step_*`` folders in ``root``, oldest first, and (``links``) the ``step_*`` symbolic links (to anything),
    listed so that a resume names them and moves them aside (`vitlarge.checkpoint.trust.folder.verify` refuses them),
    never followed. Without ``links``: the folders alone, what counts as a checkpoint (a resume, ``keep``, a hint)."""
    if not root.is_dir():
        return []
    return sorted(
        (p for p in root.iterdir() if STEP_DIR.match(p.name) and (links if p.is_symlink() else p.is_dir())),
        key=step_of,
    )


def list_checkpoints(workdir: str | Path, links: bool = True) -> list[Path]:
    """Published checkpoint folders (``step_*``) of the workdir, oldest first, checked or not (see ``store.verify``);
    ``links``: see `step_dirs`."""
    return step_dirs(Path(workdir) / CHECKPOINTS_DIR, links)


def exists(workdir: str | Path, step: int) -> bool:
    """Whether the workdir holds a published checkpoint of ``step`` (a folder, not a link, and its meta.json; no
    checksums)."""
    folder = Path(workdir) / CHECKPOINTS_DIR / step_name(step)
    return not folder.is_symlink() and (folder / "meta.json").is_file()


def beside(path: Path) -> str:
    """``"; <folder> holds step_0000400, step_0000500"``: the checkpoints in the folder of a ``path`` that does not
    exist (a pruned one, a mistyped step), the newest five; "" where there are none."""
    found = [p.name for p in step_dirs(path.parent, links=False)]
    if not found:
        return ""
    shown = ", ".join(found[-5:])
    return f"; {path.parent} holds {'..., ' if len(found) > 5 else ''}{shown}"


def missing(path: Path) -> UserError:
    """The line for a ``--checkpoint`` (of `vitlarge.evaluate`) that does not exist, with the checkpoints beside it."""
    return UserError(
        f"checkpoint {path} does not exist{beside(path)}; pass a checkpoints/step_* folder or an exported model folder"
    )


class Unusable(UserError):
    """A checkpoint that fails its check; ``problem`` says why in a few words ("no meta.json")."""

    def __init__(self, path: str | Path, problem: str):
        path = Path(path)
        if problem == "does not exist":
            message = (
                f"checkpoint {path} does not exist{beside(path)}; check --resume, or omit it to resume from the workdir"
            )
        elif problem == "no meta.json":
            found = step_dirs(path / CHECKPOINTS_DIR, links=False) or step_dirs(path, links=False)
            example = f", e.g. {found[-1]}" if found else ""
            message = (
                f"{path} is not a complete vitlarge checkpoint (no meta.json); "
                f"pass a checkpoints/step_* folder{example}"
            )
        else:
            message = (
                f"checkpoint {path} fails its check ({problem}); --resume an older checkpoints/step_* "
                "folder, or omit --resume to take the newest one that passes"
            )
        super().__init__(message)
        self.problem = problem


def read_meta(path: str | Path) -> dict:
    """meta.json of a checkpoint folder; a one-line ``UserError`` if there is none or it is unreadable."""
    found = meta_json.read(Path(path))
    if found.meta is None:
        raise Unusable(path, found.problem or "no meta.json")
    return found.meta
