"""The fields of a DALI pipeline checkpoint, read and bounded before DALI restores one.

A rank file's loader state carries DALI's checkpoint (``Pipeline.checkpoint()``: a ``dali_proto.Checkpoint``),
and a rank file comes from elsewhere. DALI restores it while the pipeline builds, holding the GIL: the
TFRecord reader's ``age`` (samples returned since its epoch began) is replayed sample by sample, so a crafted
``age`` of 2**31 - 1 spun for about two hours, deaf to SIGTERM; a negative ``current_epoch`` picks a shard
before the first; the pipeline's own ``{"iter", "epoch_idx"}`` is read by DALI's Python side without a check.
Each is bounded here by what one epoch of this rank can produce (`problem`). The random generators' states
(the reader's linear congruential engine, the augmentations' Philox counters) are DALI's to parse: it refuses a
malformed one while building, which the loader reports in one line.

The messages below are those of DALI's ``dali.proto`` (DALI 2.4) that a checkpoint of vitlarge's pipelines
holds, declared with protobuf's own descriptors; ``tests/unit/data/test_files_from_elsewhere.py`` reads a real
checkpoint back to the same bytes, so a DALI that changes them fails there, not at a user's resume.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

RNG_MAX = 2**31 - 2  # std::minstd_rand0 (DALI's default_random_engine) keeps its state in [1, 2**31 - 2]
EPOCH_MAX = 2**31 - 2  # an int32 the reader increments: one below its limit
POSITION_MAX = 2**62  # samples before a position: what an int64 holds with room


@functools.cache
def _messages() -> tuple[Any, Any]:
    """``(Checkpoint, ReaderStateSnapshot)`` message classes of DALI's dali.proto, package ``dali_proto``."""
    F = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="vitlarge_dali_checkpoint.proto", package="dali_proto")

    def message(parent, name: str, *fields: tuple[str, int, int, int, str]):
        m = parent.add(name=name)
        for field, number, kind, label, type_name in fields:
            m.field.add(
                name=field, number=number, type=kind, label=label, **({"type_name": type_name} if type_name else {})
            )
        return m

    one, many = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    checkpoint = message(
        proto.message_type,
        "Checkpoint",
        ("cpts", 1, F.TYPE_MESSAGE, many, ".dali_proto.Checkpoint.OpCheckpoint"),
        ("external_ctx_cpt", 2, F.TYPE_MESSAGE, one, ".dali_proto.Checkpoint.ExternalContextCheckpoint"),
    )
    message(
        checkpoint.nested_type,
        "OpCheckpoint",
        ("operator_name", 1, F.TYPE_STRING, one, ""),
        ("operator_state", 2, F.TYPE_BYTES, one, ""),
    )
    message(
        checkpoint.nested_type,
        "ExternalContextCheckpoint",
        ("pipeline_data", 1, F.TYPE_BYTES, one, ""),
        ("iterator_data", 2, F.TYPE_BYTES, one, ""),
    )
    reader = message(
        proto.message_type,
        "ReaderStateSnapshot",
        ("loader_state", 1, F.TYPE_MESSAGE, one, ".dali_proto.ReaderStateSnapshot.LoaderStateSnapshot"),
    )
    message(
        reader.nested_type,
        "LoaderStateSnapshot",
        ("rng", 1, F.TYPE_BYTES, one, ""),
        ("current_epoch", 2, F.TYPE_INT32, one, ""),
        ("age", 3, F.TYPE_INT32, one, ""),
    )
    pool = descriptor_pool.DescriptorPool()  # its own pool: nothing of another library's protos is touched
    pool.Add(proto)
    checkpoint, snapshot = (
        message_factory.GetMessageClass(pool.FindMessageTypeByName(f"dali_proto.{name}"))
        for name in ("Checkpoint", "ReaderStateSnapshot")
    )
    return checkpoint, snapshot


def parse(blob: bytes):
    """The ``Checkpoint`` message of ``blob``; `google.protobuf.message.DecodeError` if it is not one."""
    checkpoint, _ = _messages()
    return checkpoint.FromString(blob)


def reader_snapshot(state: bytes):
    """The ``ReaderStateSnapshot`` a reader's ``operator_state`` holds; DecodeError if it is not one."""
    _, snapshot = _messages()
    return snapshot.FromString(state)


def problem(blob: bytes, *, reader: str, records_per_epoch: int, batch_size: int) -> str | None:
    """What in DALI checkpoint ``blob`` no pipeline of this loader could have written, or None. ``reader``: the
    reader operator's name; ``records_per_epoch``: the most records one rank's reader returns in an epoch (its
    ``age`` stays below that: it restarts from 0 at each epoch); ``batch_size``: the pipeline's, which turns the
    pipeline's ``iter`` into a position."""
    try:
        checkpoint = parse(blob)
        readers = [reader_snapshot(op.operator_state) for op in checkpoint.cpts if op.operator_name == reader]
    except DecodeError as e:
        return f"not a DALI checkpoint ({e})"
    for snapshot in readers:
        s = snapshot.loader_state
        if not 0 <= s.age <= records_per_epoch:
            return f"reader age {s.age} outside 0..{records_per_epoch}, the records of an epoch on this rank"
        if not 0 <= s.current_epoch <= EPOCH_MAX:
            return f"reader epoch {s.current_epoch} outside 0..{EPOCH_MAX}"
        if not (s.rng.isdigit() and len(s.rng) <= len(str(RNG_MAX)) and 1 <= int(s.rng) <= RNG_MAX):
            return f"reader random state {s.rng[:40]!r} is not a number in 1..{RNG_MAX}"
    try:
        data = json.loads(checkpoint.external_ctx_cpt.pipeline_data)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        data = None
    fields = data if isinstance(data, dict) else {}
    iteration, epoch = fields.get("iter"), fields.get("epoch_idx")
    if set(fields) != {"iter", "epoch_idx"} or type(iteration) is not int or type(epoch) is not int:
        return "pipeline data is not DALI's {'iter': int, 'epoch_idx': int}"
    if not (0 <= iteration <= POSITION_MAX // batch_size and 0 <= epoch <= EPOCH_MAX):
        return (
            f"pipeline position iter {iteration}, epoch {epoch} outside 0..{POSITION_MAX // batch_size}, 0..{EPOCH_MAX}"
        )
    return None
