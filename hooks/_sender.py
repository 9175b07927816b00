"""A tracker's records sent off the training thread: one daemon thread, a bounded queue, never an exception back.

Contract (shared by `hooks.mlflow` and `hooks.wandb`):

* `Sender.put` never blocks and never raises: when the queue is full the record is dropped and counted.
* The thread hands records to ``send(batch)`` in order, up to `BATCH` at a time. The first failure (a server
  down, slow past its timeout, refusing writes) is one warning line; the records of a failed batch are dropped
  and counted, and while sends keep failing one line every `REPORT_EVERY_S` seconds says how many were dropped.
  Later batches are tried again, so a server that comes back gets the rest of the run.
* Nothing a send raises ends the thread (`BaseException` but `KeyboardInterrupt`, counted as a failure).
* `Sender.close` waits for the queue to drain while batches keep being delivered: it gives up when none was for
  ``timeout`` seconds, or after ``cap`` seconds in all (the process then leaves with ``os._exit``, which would lose
  the rest), then says in one line what was not sent (records queued, in flight or dropped).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from vitlarge.text import plural

log = logging.getLogger("vitlarge")

QUEUE_SIZE = 10_000
"""Records held while the tracker is slow: one per optimizer step and per evaluation, so about 10,000 steps."""
BATCH = 200
REPORT_EVERY_S = 300.0
FLUSH_TIMEOUT_S = 10.0
"""How long the end of a run waits for a batch to be delivered before it gives up on the records still queued."""
FLUSH_CAP_S = 60.0
"""The most the end of a run waits in all, however steadily batches are delivered."""

_STOP = object()


class Sender:
    """``send(batch)`` called on a daemon thread named ``name`` for the records given to `put`."""

    def __init__(
        self,
        name: str,
        send: Callable[[list], None],
        maxsize: int = QUEUE_SIZE,
        report_every_s: float = REPORT_EVERY_S,
        what: str = "",
    ):
        self.name, self._send, self.what = name, send, what
        self._queue: queue.Queue = queue.Queue(maxsize)
        self._lock = threading.Lock()
        self.dropped = 0
        """Records not sent: the queue was full, or their batch failed."""
        self.failures = 0
        self._reported_at = 0.0
        self._report_every_s = report_every_s
        self._dropped_reported = 0
        self._in_flight = 0  # records of the batch being sent
        self._delivered_at = 0.0  # time.monotonic() when the last batch was done with (sent or failed)
        self._stop_taken = False
        self._thread = threading.Thread(target=self._loop, name=f"vitlarge-{name}", daemon=True)
        self._thread.start()

    def put(self, record: tuple) -> None:
        """Queues ``record``; drops (and counts) it when the queue is full. Never blocks."""
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self._count_dropped(1)

    def _count_dropped(self, n: int) -> None:
        with self._lock:
            self.dropped += n

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            batch, stop = [], first is _STOP
            if not stop:
                batch.append(first)
                while len(batch) < BATCH:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if item is _STOP:
                        stop = True
                        break
                    batch.append(item)
            self._stop_taken = stop
            if batch:
                self._deliver(batch)
            if stop:
                return

    def _deliver(self, batch: list) -> None:
        self._in_flight = len(batch)
        try:
            self._send(batch)
        except BaseException as e:  # noqa: BLE001 (whatever the tracker raises, SystemExit too, must not end the thread)
            self._count_dropped(len(batch))
            self.failures += 1
            if self.failures == 1:
                why = " ".join(str(e).split())[:300] or type(e).__name__
                log.warning(
                    f"warning: {self.name}: cannot send to {self.what or 'the tracker'} ({type(e).__name__}: {why}); "
                    "training goes on, its records are dropped while this lasts (counted every "
                    f"{self._report_every_s:g} s and at the end)"
                )
                self._reported_at = time.monotonic()
                self._dropped_reported = self.dropped
            elif time.monotonic() - self._reported_at >= self._report_every_s and self.dropped > self._dropped_reported:
                log.warning(f"warning: {self.name}: {plural(self.dropped, 'record')} not sent so far")
                self._reported_at = time.monotonic()
                self._dropped_reported = self.dropped
            if isinstance(e, KeyboardInterrupt):
                raise
        finally:
            self._in_flight = 0
            self._delivered_at = time.monotonic()

    def close(self, timeout: float = FLUSH_TIMEOUT_S, cap: float = FLUSH_CAP_S) -> int:
        """Sends what is queued, waiting while batches keep being delivered: at most ``timeout`` seconds without
        one, ``cap`` seconds in all. Returns the records not sent (and says so in one line when there are any)."""
        opened = time.monotonic()
        cap_at = opened + max(cap, timeout)
        stop_queued = False
        while self._thread.is_alive():
            now = time.monotonic()
            left = min(cap_at, max(opened, self._delivered_at) + timeout) - now
            if left <= 0:
                break
            if not stop_queued:  # a full queue still takes the stop mark once the thread drains some
                try:
                    self._queue.put(_STOP, timeout=min(left, 0.1))
                    stop_queued = True
                except queue.Full:
                    continue
            self._thread.join(min(left, 0.1))
        alive = self._thread.is_alive()
        queued = self._queue.qsize() - (1 if stop_queued and not self._stop_taken else 0)
        unsent = self.dropped + max(0, queued) + self._in_flight
        if unsent:
            late = " (still sending when the wait ended)" if alive else ""
            log.warning(
                f"warning: {self.name}: {plural(unsent, 'record')} not sent to {self.what or 'the tracker'}{late}; "
                "metrics.jsonl has every step"
            )
        return unsent
