"""The converter, killed mid-shard: a test-only entry point that wraps the shard writer, nothing else.

    python -m tests.helpers.kill_convert SHARD:RECORD data_tools.imagenet_to_tfrecord-arguments...

Before record ``RECORD`` (0-based) of shard ``SHARD`` is written, flushes what the shard holds and
sends itself SIGKILL, as a ``kill -9`` or an OOM kill would. Used by tests/unit/data_tools/test_convert.py.
"""

from __future__ import annotations

import os
import signal
import sys

from data_tools import imagenet_to_tfrecord, tfrecord_io


def kill_at(shard: str, record: int) -> None:
    """Patches `tfrecord_io.ShardWriter.write` in this process to SIGKILL it at ``shard:record``."""
    real = tfrecord_io.ShardWriter.write
    written: dict[str, int] = {}  # by path: a finished writer's id() can be reused by the next shard's

    def write(self, payload: bytes) -> None:
        n = written.get(self.path, 0)
        if os.path.basename(self.path) == shard and n == record:
            self.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        written[self.path] = n + 1
        real(self, payload)

    tfrecord_io.ShardWriter.write = write


def main(argv: list[str]) -> int:
    shard, _, record = argv[0].rpartition(":")
    kill_at(shard, int(record))
    return imagenet_to_tfrecord.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
