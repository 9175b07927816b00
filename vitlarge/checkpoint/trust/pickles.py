"""Pickles from elsewhere cost memory in proportion to their size: a budget charged opcode by opcode.

A pickle builds objects far larger than its bytes: ``MARK`` then one ``EMPTY_SET`` byte after another makes a
216-byte set per byte, so a 20 MB ``.metadata`` of them makes 5.3 GiB of objects before anything can look at
them. Every opcode is charged here an upper bound of what it allocates (`cost`: the object it pushes, on CPython
3.10-3.13 64-bit, and what holding it in a list, dict, set or the memo adds), and a pickle is refused in one line
when its charge passes `Budget`'s limit, `FLOOR` plus `PER_BYTE` bytes for each byte of the pickle, and never more
than `CEILING`: a crafted file then takes at most about as much memory as a real one three times its size
(`PER_BYTE`), and no file more than the largest real one. The charge is
cumulative (what a real file makes and drops again counts too), so it overstates a real file's peak about twice.

Two ways in, one price list: `charge_dispatch` wraps an unpickler's opcode table (the restricted ``.metadata``
unpickler: charged as it builds), and `scan` walks a pickle's opcodes without building anything
(``pickletools.genops``) ahead of an unpickler that has no table to wrap (torch's ``weights_only``).
"""

from __future__ import annotations

import pickle
import pickletools
import sys
from collections.abc import Callable
from typing import IO, Any

FLOOR = 4 << 20
"""Bytes any pickle may take, whatever its size (a small real file's objects, the unpickler's own)."""
PER_BYTE = 64
"""Bytes a pickle may take per byte of its own, beyond `FLOOR`. A real DCP index is charged 30-41 a byte (the
demo's; ViT-B's index of 1, 16 and 128 FSDP ranks) and takes 18-20 (its peak under ``tracemalloc``), a rank
file's ``data.pkl`` 9: a crafted pickle takes at most about 3x what a real index of its size takes."""

CEILING = 16 << 30
"""Bytes no pickle may take, whatever its size: the largest real index vitlarge writes (a 1024-rank FSDP ViT-H
index, ~0.3 GB, charged up to 41 a byte: ~12 GB) fits under it, and a crafted file at ``.metadata``'s size cap
(`vitlarge.checkpoint.trust.index.INDEX_MAX_BYTES`, 1 GiB) is held to it instead of the 64 GiB its size buys."""

SLOT = 8  # a reference on the unpickler's stack, or in a list
_OBJECT = {
    # The object the opcode makes (sys.getsizeof, rounded up); its references to what it holds are per item below.
    "MARK": 56 + SLOT,  # a new list for the items after the mark, its old one kept on the metastack
    "EMPTY_LIST": 56,
    "LIST": 56,
    "EMPTY_DICT": 64,
    "DICT": 64,
    "EMPTY_SET": 216,
    "FROZENSET": 216,
    "TUPLE": 40,
    "TUPLE1": 48,
    "TUPLE2": 56,
    "TUPLE3": 64,
    "INT": 32,
    "BININT": 32,
    "BINFLOAT": 24,
    "FLOAT": 24,
    "SETITEM": 128,  # one pair into a dict (its entry, and a resize)
    "APPEND": 16,
    # The memo: a dict entry (about 50 bytes in a large memo) and an int key.
    "MEMOIZE": 80,
    "PUT": 80,
    "BINPUT": 80,
    "LONG_BINPUT": 80,
    # What an allowed global makes: a DCP metadata instance (56 bytes) and, by BUILD, its field dict (88-96); by
    # REDUCE a torch.Size, a path or a tensor over a storage the archive holds (its bytes are the archive's own).
    "NEWOBJ": 64,
    "BUILD": 128,
    "REDUCE": 384,
    "BINPERSID": 384,
    "PERSID": 384,
}
_PER_ITEM = {
    # Each item an opcode takes from the stack since the last MARK into a container: a list's reference (with its
    # over-allocation), a dict's or a set's entry and its share of a resize.
    "APPENDS": 16,
    "LIST": 16,
    "TUPLE": SLOT,
    "DICT": 64,
    "SETITEMS": 64,
    "ADDITEMS": 64,
    "FROZENSET": 64,
}
_PAYLOAD = {
    # Opcodes that push an object made from their argument: charged its own size (sys.getsizeof).
    "STRING", "BINSTRING", "SHORT_BINSTRING", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8",
    "UNICODE", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "LONG", "LONG1", "LONG4",
}  # fmt: skip


def cost(name: str, items: int = 0, made: Any = None) -> int:
    """Bytes opcode ``name`` may allocate: what it makes, ``items`` taken since the last MARK into a container,
    ``made`` (the object an opcode of `_PAYLOAD` pushed, measured), and a stack slot."""
    own = sys.getsizeof(made) if name in _PAYLOAD else _OBJECT.get(name, 0)
    return SLOT + own + _PER_ITEM.get(name, 0) * items


class Budget:
    """What a pickle of ``size`` bytes named ``what`` may allocate (`FLOOR` + `PER_BYTE` x ``size``); `charge`
    raises ``pickle.UnpicklingError`` in one line once it is spent."""

    def __init__(self, size: int, what: str):
        self.size = max(0, size)
        self.limit = min(CEILING, FLOOR + PER_BYTE * self.size)
        self.left = self.limit
        self.what = what

    def charge(self, name: str, items: int = 0, made: Any = None) -> None:
        self.left -= cost(name, items, made)
        if self.left < 0:
            raise pickle.UnpicklingError(
                f"{self.what} makes more than {self.limit:,} bytes of objects from its {self.size:,} bytes "
                "(refused: a real one makes far fewer)"
            )


def scan(f: IO[bytes], size: int, what: str) -> None:
    """Charges each opcode of the pickle in ``f`` (``size`` bytes) to a `Budget`, building nothing; raises
    ``pickle.UnpicklingError`` when it is spent (a damaged pickle raises what ``pickletools.genops`` raises, a
    ``ValueError``: the unpickler after it says what it makes of it)."""
    budget = Budget(size, what)
    frames = [0]  # items on the stack since each MARK still open (the first: below any mark)
    for op, arg, _ in pickletools.genops(f):
        before = op.stack_before
        items = 0
        if pickletools.stackslice in before:  # takes every item since the last MARK, and the mark
            items = frames.pop() if len(frames) > 1 else 0
            taken = len(before) - 2
        else:
            taken = len(before)
        frames[-1] = max(0, frames[-1] - taken)
        if op.name == "MARK":
            frames.append(0)
        else:
            frames[-1] += len(op.stack_after)
        budget.charge(op.name, items, arg)


def charge_dispatch(dispatch: dict[int, Callable[[Any], None]]) -> dict[int, Callable[[Any], None]]:
    """``dispatch`` (pickle's pure-Python opcode table, opcode byte -> method) with each method charging its
    opcode to the unpickler's ``budget`` (a `Budget`) after it ran. The items a MARK-taking opcode uses are the
    unpickler's ``stack`` before it runs: Python's unpickler keeps the items since the last MARK there."""
    names = {op.code.encode("latin-1")[0]: op.name for op in pickletools.opcodes}

    def charged(name: str, run: Callable[[Any], None]) -> Callable[[Any], None]:
        takes_items, pushes_payload = name in _PER_ITEM, name in _PAYLOAD

        def op(self) -> None:
            items = len(self.stack) if takes_items else 0
            run(self)
            self.budget.charge(name, items, self.stack[-1] if pushes_payload else None)

        return op

    return {code: charged(names.get(code, "?"), run) for code, run in dispatch.items()}
