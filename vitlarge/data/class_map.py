"""Which of a model's classes a data set's labels are, by name: what `vitlarge.evaluate` scores.

A model's classes are an export's ``label_names`` (config.json, in index order; `vitlarge.checkpoint.export`) or a
checkpoint's meta.json ``classes`` (its run's data set's names; a checkpoint written before records only their count,
scored by index when the counts agree and said in one line). A data set's are dataset.json's ``classes`` (`vitlarge.data.manifest`: the
class folder names in label order). Names are compared, never indices: a data set holding 4 of a model's 5
classes labels them 0..3, which are not the model's 0..3 when the missing class sorts before another, and
its folders may sort in another order than the model's training set did (timm's reader sorts them naturally,
``1, 2, 10``; the converter as text, ``1, 10, 2``: docs/DATA.md). Scored by index, such a set gave a wrong
top-1 with exit 0.

`match` says how each data class is scored: ``model_index[j]`` is the model's output for the data's class ``j``,
and the evaluation takes the model's logits at those indices (a subset, or the same classes in another order),
so top-1 is correct by name. Names the model does not know, class counts that differ with no names on
one side to map them by, and a set of one of the model's classes (scored over itself, always right) are a
`UserError`: such a set has no correct figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vitlarge.data.manifest import Manifest
from vitlarge.errors import UserError


@dataclass(frozen=True)
class ClassMap:
    """How a data set's classes are scored: the model's output index of each data class (None: the same classes
    in the same order, scored as they are) and the one line that says so (None where nothing is remapped)."""

    model_index: tuple[int, ...] | None
    line: str | None

    @property
    def scored(self) -> int | None:
        """How many classes the logits are reduced to (None: all of the model's)."""
        return None if self.model_index is None else len(self.model_index)


def data_names(manifest: Manifest) -> list[str] | None:
    """dataset.json's class names in label order (index ``label - label_offset``), or None where it does not name
    every class once (make_index's data set of synsets too long to hold: ``classes`` empty)."""
    by_index: dict[int, str] = {c.label - manifest.label_offset: c.synset for c in manifest.classes}
    if sorted(by_index) != list(range(manifest.num_classes)) or not all(by_index.values()):
        return None
    names = [by_index[i] for i in range(manifest.num_classes)]
    return names if len(set(names)) == len(names) else None


def _some(names: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(repr(n)[1:-1][:60] for n in names[:limit])  # escaped: names are data
    return shown + (f" and {len(names) - limit:,} more" if len(names) > limit else "")


def match(
    model_names: Sequence[str] | None,
    model_count: int,
    names: Sequence[str] | None,
    count: int,
    *,
    model_where: str,
    data_where: str,
) -> ClassMap:
    """`ClassMap` of a data set of ``count`` classes (``names`` in label order, or None) scored by a model of
    ``model_count`` outputs (``model_names`` in index order, or None). ``model_where`` and ``data_where`` name the
    files the names come from, for the lines. A `UserError` where the data set holds classes the model does not
    know, where the counts differ and one side has no names to map them by, or where it holds one of the model's
    several classes (scored over itself: always right)."""
    if model_names is None or names is None:
        unnamed = model_where if model_names is None else data_where
        if count == model_count:  # an older checkpoint, a data set of unnamed classes: as before, never silently
            return ClassMap(None, f"classes matched by index: {unnamed} records no class names")
        export = "its run's export (<workdir>/model: its config.json names the classes), or " if names else ""
        raise UserError(
            f"the model has {model_count:,} classes, {data_where} {count:,}, and {unnamed} records no class names to "
            f"map them by: no correct top-1 can be computed; evaluate {export}on a data set of the model's "
            f"{model_count:,} classes"
        )
    index = {n: i for i, n in enumerate(model_names)}
    unknown = [n for n in names if n not in index]
    if unknown:
        raise UserError(
            f"{data_where}: {len(unknown):,} of its {count:,} classes ({_some(unknown)}) are not among the model's "
            f"{model_count:,} ({model_names and _some(model_names)}; {model_where}); evaluate on a data set of the "
            "model's classes"
        )
    if list(names) == list(model_names):
        return ClassMap(None, None)
    if count == 1:  # the logits taken at one index: its softmax is 1, the top-1 right and the loss 0 for any model
        raise UserError(
            f"{data_where} holds one of the model's {model_count:,} classes ({_some(names)}): scored over its own "
            "classes every image is right whatever the model (top-1 100%, loss 0); evaluate on a data set of 2 or "
            "more of the model's classes"
        )
    order = tuple(index[n] for n in names)
    if count == model_count:
        line = f"scoring the model's {model_count:,} classes by name: {data_where} lists them in another order"
    else:
        missing = [n for n in model_names if n not in set(names)]
        line = (
            f"scoring {count:,} of the model's {model_count:,} classes by name: {_some(names)} "
            f"({data_where} has no {_some(missing)})"
        )
    return ClassMap(order, line)
