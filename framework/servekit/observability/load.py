"""The load signal an autoscaler targets: requests waiting for and running in each model.

Four families, summed over every worker and model host of a replica
(prometheus_client's multiprocess ``livesum``: a process that exits drops out):

- ``servekit_model_requests_waiting{model}``: ``predict`` requests this replica
  accepted for the model that have not started running: waiting for a batch to
  close while the model is busy, or for a model host to take them;
- ``servekit_model_requests_running{model}``: requests inside a call of the
  model's ``predict`` now (each request of a batched call counts);
- ``servekit_model_queue_seconds{model}``: histogram of the time from a request's
  arrival to the start of its call (a worker hands a model host the moment it
  arrived, on the machine-wide monotonic clock);
- ``servekit_concurrency_per_replica``: every model's waiting plus running, plus
  the requests waiting for a worker's slot (``--max-inflight``, before the model
  is known): the one number per replica an autoscaler divides by its target.

How the counts move.  A request *arrives* in the process that accepts it for
the model (an HTTP or gRPC worker; :func:`arrived`): waiting +1 there, and the
replica's concurrency +1.  Where its call runs (:func:`running`, that worker or
a model host) it moves: waiting -1, running +1 while the call runs, and back.
When the answer is in (:func:`left`) the accepting process takes its waiting and
concurrency back.  A model host's waiting is therefore negative while it runs a
worker's request, and the sum over processes is right; if the host dies, its
file is dropped and the worker's +1 stays until the worker hears of the loss.
A host writes its counts as each call starts and ends (before the answers
leave, so the worker's -1 never reaches the gauges first), and a worker writes
its own before it hands a request to a host (:func:`handing_over`, so the
host's -1 never reaches the gauges first).  A process writes its waiting and
running one after the other: the one that falls first, so that a scrape in
between sees a request in neither, never in both.

Each process keeps plain counts and writes them into its gauges every
:data:`servekit.observability.tally.FLUSH_SECONDS` (and before it answers a scrape), so the
per-request cost is a dictionary update, not a file write.
"""

from __future__ import annotations

import bisect
import contextlib
import contextvars
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

from servekit.observability.tally import Tally, add_to_histogram

#: Seconds a request may wait for its model call; a queue an autoscaler acts on is in this range.
QUEUE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

WAITING = "servekit_model_requests_waiting"
RUNNING = "servekit_model_requests_running"
QUEUE = "servekit_model_queue_seconds"
CONCURRENCY = "servekit_concurrency_per_replica"


class _Families:
    """The process's gauges and histogram, made on first use (after the fork, with the folder set)."""

    def __init__(self) -> None:
        from prometheus_client import Gauge, Histogram

        self.waiting = Gauge(
            WAITING, "requests accepted for a model and not yet running", ("model",), multiprocess_mode="livesum"
        )
        self.running = Gauge(
            RUNNING, "requests inside a call of the model's predict", ("model",), multiprocess_mode="livesum"
        )
        self.queue = Histogram(
            QUEUE, "seconds from a request's arrival to the start of its model call", ("model",), buckets=QUEUE_BUCKETS
        )
        self.concurrency = Gauge(
            CONCURRENCY,
            "requests this replica holds for its models, waiting or running (the autoscaling target)",
            multiprocess_mode="livesum",
        )


_families: _Families | None = None
_families_lock = threading.Lock()


def families() -> _Families:
    global _families
    if _families is None:
        with _families_lock:
            if _families is None:
                _families = _Families()
    return _families


class _Load(Tally):
    """This process's counts, written into its gauges when they change."""

    thread_name = "servekit-load"

    def reset(self) -> None:
        self._flush_lock = threading.Lock()
        self._counts: dict[str, list[int]] = {}  # model -> [waiting, running]
        self._published: dict[str, tuple[int, int]] = {}
        self._concurrency = 0
        self._published_concurrency = 0
        self._queue: dict[str, list[Any]] = {}  # model -> [sum, bucket counts]
        #: shared memory another process reads this process's concurrency from (:func:`share_concurrency`)
        self.board: Any = None

    def move(self, model: str, waiting: int, running: int, concurrency: int = 0) -> None:
        with self._lock:
            if waiting or running:
                counts = self._counts.get(model)
                if counts is None:
                    counts = self._counts[model] = [0, 0]
                counts[0] += waiting
                counts[1] += running
            self._concurrency += concurrency
            if concurrency and self.board is not None:
                _BOARD.pack_into(self.board, 0, self._concurrency)
        self.started()

    def queued(self, model: str, seconds: float, count: int = 1) -> None:
        slot = bisect.bisect_left(QUEUE_BUCKETS, seconds)
        with self._lock:
            entry = self._queue.get(model)
            if entry is None:
                entry = self._queue[model] = [0.0, [0] * (len(QUEUE_BUCKETS) + 1)]
            entry[0] += seconds * count
            entry[1][slot] += count

    def snapshot(self) -> dict[str, tuple[int, int]]:
        with self._lock:
            return {model: (w, r) for model, (w, r) in self._counts.items()}

    def flush(self) -> None:
        # one flush at a time, or an older snapshot could be written over a newer one
        with self._flush_lock:
            with self._lock:
                counts = {model: (w, r) for model, (w, r) in self._counts.items()}
                concurrency = self._concurrency
                queue, self._queue = self._queue, {}
            f = families()
            for model, (waiting, running) in counts.items():
                before = self._published.get(model)
                if before != (waiting, running):
                    writes = [(f.waiting, "waiting", waiting), (f.running, "running", running)]
                    if before is not None and running < before[1]:
                        writes.reverse()  # a call ended: its requests leave running before they count again
                    for family, metric, value in writes:
                        self.child(family, metric, (model,)).set(value)
                    self._published[model] = (waiting, running)
            if concurrency != self._published_concurrency:
                f.concurrency.set(concurrency)
                self._published_concurrency = concurrency
            for model, (total, slots) in queue.items():
                add_to_histogram(self.child(f.queue, "queue", (model,)), total, slots)


_load = _Load()
_in_host = False


def serving_in_host() -> None:
    """This process is a model host: its requests arrived in a worker, which counts them."""
    global _in_host
    _in_host = True


def in_host() -> bool:
    return _in_host


def arrived(model: str) -> float:
    """A request for ``model`` is accepted here; returns its arrival time (``time.monotonic``)."""
    _load.move(model, 1, 0, 1)
    return time.monotonic()


_arrival: contextvars.ContextVar[float | None] = contextvars.ContextVar("servekit_arrival", default=None)


@contextlib.contextmanager
def arrived_at(when: float | None) -> Iterator[None]:
    """In a model host: the request being run arrived in its worker at ``when`` (``time.monotonic``)."""
    token = _arrival.set(when)
    try:
        yield
    finally:
        _arrival.reset(token)


def arrival() -> float:
    """When the request this thread runs arrived: as a model host was told, else now."""
    return _arrival.get() or time.monotonic()


def left(model: str) -> None:
    """The request :func:`arrived` took is answered (or failed)."""
    _load.move(model, -1, 0, -1)


def handing_over() -> None:
    """This worker hands a request it :func:`arrived` to a model host: its +1 waiting is written first."""
    _load.flush()


def waiting_for_slot(delta: int) -> None:
    """A request starts (+1) or stops (-1) waiting for a free slot of its worker (``--max-inflight``)."""
    _load.move("", 0, 0, delta)


@contextlib.contextmanager
def running(model: str, arrivals: list[float]) -> Iterator[None]:
    """One call of ``model`` runs here for requests that arrived at ``arrivals``."""
    n = len(arrivals)
    now = time.monotonic()
    for when in arrivals:
        _load.queued(model, max(0.0, now - when))
    _load.move(model, -n, n)
    if _in_host:
        _load.flush()  # a host's calls run back to back: written only now and then, it would look idle
    try:
        yield
    finally:
        _load.move(model, n, -n)
        if _in_host:
            # before the answer leaves: the worker's own -1 must never reach the
            # gauges ahead of this +1, or a scrape in between would see waiting < 0
            _load.flush()


#: the board's layout: this process's concurrency, a native signed 64-bit integer
_BOARD = struct.Struct("q")


def share_concurrency(board: Any) -> None:
    """Keep this process's concurrency (requests accepted and not answered) in ``board``, a
    writable buffer of 8 bytes another process maps too: a shadow process runs its copies
    while the count is 0 (:mod:`servekit.hosts.shadow`)."""
    with _load._lock:
        _BOARD.pack_into(board, 0, _load._concurrency)
        _load.board = board


def read_board(board: Any) -> int:
    """The concurrency a :func:`share_concurrency` board holds."""
    return int(_BOARD.unpack_from(board, 0)[0])


def counts() -> dict[str, tuple[int, int]]:
    """This process's ``(waiting, running)`` per model (tests; a scrape sums every process's)."""
    return _load.snapshot()


def flush() -> None:
    """Write this process's counts into its gauges now (a scrape, a process about to exit)."""
    families()  # every family appears from the first scrape on, even at zero
    _load.flush()
