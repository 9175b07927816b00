"""The converter, killed mid-shard: a test-only entry point that wraps the shard writer, nothing else.

    python -m tests.helpers.kill_convert SHARD:RECORD[:int] data_tools.imagenet_to_tfrecord-arguments...

Before record ``RECORD`` (0-based) of shard ``SHARD`` is written, flushes what the shard holds and
sends itself SIGKILL, as a ``kill -9`` or an OOM kill would; with ``:int``, sends SIGINT to its
process group instead, as Ctrl-C in a terminal does (the shard writer may run in a worker process).
Used by tests/unit/data_tools/test_convert.py.
"""

from __future__ import annotations

import os
import signal
import sys

from data_tools import imagenet_to_tfrecord, tfrecord_io


def kill_at(shard: str, record: int, ctrl_c: bool = False) -> None:
    """Patches `tfrecord_io.ShardWriter.write` in this process (and the workers it forks) to SIGKILL it
    at ``shard:record``, or with ``ctrl_c`` to send SIGINT to the process group once."""
    real = tfrecord_io.ShardWriter.write
    written: dict[str, int] = {}  # by path: a finished writer's id() can be reused by the next shard's

    def write(self, payload: bytes) -> None:
        n = written.get(self.path, 0)
        if os.path.basename(self.path) == shard and n == record:
            self.flush()
            if ctrl_c:
                os.killpg(os.getpgid(0), signal.SIGINT)
            else:
                os.kill(os.getpid(), signal.SIGKILL)
        written[self.path] = n + 1
        real(self, payload)

    tfrecord_io.ShardWriter.write = write


def main(argv: list[str]) -> int:
    where, ctrl_c = (argv[0][: -len(":int")], True) if argv[0].endswith(":int") else (argv[0], False)
    shard, _, record = where.rpartition(":")
    kill_at(shard, int(record), ctrl_c)
    return imagenet_to_tfrecord.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
