"""How many calls of one model run at once in a process, and in which order.

A worker's request threads take one GIL in turn, and the order in which they get
it is not the order in which their requests arrived.  Sixteen threads each
computing a small model at once share the CPU like that, and a request can wait
many turns: at 64 connections the defaults' p99 was 3.2x their mean latency
(V1 iris, 39.5 ms at 5,226 requests/s).  Triton runs each model instance one
call at a time (``instance_group`` sets how many instances).  Here each version
has a :class:`Gate` with ``concurrency`` places.  A call beyond them waits its
turn and is woken in arrival order, and the waiting threads stay off the GIL.
With two places, V1 iris at 64 connections had a p99 of 23.9-29.3 ms against
34.4-40.1 ms, for about 7% of its throughput (bench/RESULTS.md).

The gate holds only where the call computes in this process without batching:

- a batched model forms its batch from the calls waiting together (``servekit.dataplane.batching``);
- a version in model hosts runs its calls there, and a host batches its workers' calls;
- a ``model.py`` or a pipeline may wait on I/O or on other models for most of a call.

So :data:`DEFAULT` places apply to the unbatched models of the framework plugins
in a worker.  Everything else runs unbounded unless its ``servekit.yaml`` sets
``concurrency`` (``0``: no bound).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import threading
import time
from collections import deque
from typing import Any

from servekit.dataplane import traffic
from servekit.hooks.manager import MODEL_PY_PREFIX
from servekit.observability import load

#: places for an unbatched framework-plugin model computed in a worker
DEFAULT = 2

#: the gate of a version without a bound: enters and leaves at once
_UNBOUNDED = contextlib.nullcontext()
_lock = threading.Lock()


class Gate:
    """At most ``places`` holders at once; the others are let in first come, first served."""

    def __init__(self, places: int):
        if places < 1:
            raise ValueError("a gate needs at least one place")
        self.free = places
        self.waiting: deque[threading.Event] = deque()
        self.lock = threading.Lock()

    def __enter__(self) -> Gate:
        with self.lock:
            if self.free and not self.waiting:
                self.free -= 1
                return self
            turn = threading.Event()
            self.waiting.append(turn)
        turn.wait()  # the place is handed over by the holder that leaves
        return self

    def __exit__(self, *exc: Any) -> None:
        with self.lock:
            if self.waiting:
                self.waiting.popleft().set()
            else:
                self.free += 1


class _Waiter:
    __slots__ = ("turn", "gone")

    def __init__(self) -> None:
        self.turn = threading.Event()
        self.gone = False  # left the queue (cancelled or timed out); skipped when its turn comes


class PriorityGate:
    """A gate whose waiting calls are let in by priority level (1 first), then by arrival.

    The version's ``queue:`` (Triton's ``dynamic_batching`` priorities and queue
    policy) sets the levels, each level's timeout, what a timeout does and how
    many may wait.  A waiting call whose client went away (an HTTP connection
    closed, a gRPC call cancelled) or whose timeout passed leaves the queue
    without being computed, and is counted (``servekit_queue_cancelled``).
    """

    #: how often a waiting call looks whether its client is still there
    POLL = 0.05

    def __init__(self, places: int, config: Any, model: str = "model"):
        if places < 1:
            raise ValueError("a gate needs at least one place")
        self.free = places
        self.config = config
        self.model = model
        self.waiting: list[tuple[int, int, _Waiter]] = []
        self.queued = 0
        self.lock = threading.Lock()
        self._order = itertools.count()

    def __enter__(self) -> PriorityGate:
        self.enter(traffic.current())
        return self

    def enter(self, ticket: traffic.Ticket) -> None:
        level, deadline, policy = ticket.place_in(self.config)
        waiter = _Waiter()
        with self.lock:
            if self.free and not self.queued:
                self.free -= 1
                return
            if policy.max_queue_size and self.queued >= policy.max_queue_size:
                traffic.count_cancelled(self.model, "queue_full")
                raise traffic.QueueFull(
                    f"model {self.model!r}: its queue holds {self.queued} requests, the most it takes "
                    f"(queue max_queue_size {policy.max_queue_size}); try again later"
                )
            heapq.heappush(self.waiting, (level, next(self._order), waiter))
            self.queued += 1
        traffic.queued(self.model, 1)
        try:
            self._wait(waiter, ticket, level, deadline, policy)
        finally:
            traffic.queued(self.model, -1)

    def _wait(self, waiter: _Waiter, ticket: traffic.Ticket, level: int, deadline: float, policy: Any) -> None:
        watch = ticket.cancelled is not None or deadline < float("inf")
        while True:
            pause = min(self.POLL, max(0.0, deadline - time.monotonic())) if watch else None
            turn = waiter.turn.wait(pause)
            # looked at once more when the turn comes: a client gone by then costs no call either
            reason = "disconnected" if ticket.cancelled is not None and ticket.cancelled() else ""
            if not reason and time.monotonic() >= deadline:
                if policy.timeout_action != "delay":
                    reason = "timeout"
                elif not turn and level <= self.config.priority_levels:
                    level = self.config.priority_levels + 1  # behind every request still in time
                    deadline = float("inf")
                    with self.lock:
                        if not waiter.turn.is_set():
                            waiter.gone = True
                            waiter = _Waiter()
                            heapq.heappush(self.waiting, (level, next(self._order), waiter))
                            continue
                    turn = True
            if not reason:
                if turn:
                    return
                continue
            with self.lock:
                if waiter.turn.is_set():  # handed a place meanwhile: pass it on
                    self._hand_over()
                else:
                    waiter.gone = True
                    self.queued -= 1
            traffic.count_cancelled(self.model, reason)
            if reason == "timeout":
                raise traffic.QueueTimeout(
                    f"model {self.model!r}: the request's queue timeout passed before its turn; it was not computed"
                )
            raise traffic.ClientGone(f"model {self.model!r}: the client went away while the request was queued")

    def __exit__(self, *exc: Any) -> None:
        with self.lock:
            self._hand_over()

    def _hand_over(self) -> None:
        """Give a place to the first waiter still there, else free it. Lock held."""
        while self.waiting:
            _, _, waiter = heapq.heappop(self.waiting)
            if not waiter.gone:
                self.queued -= 1
                waiter.turn.set()
                return
        self.free += 1


def places_of(mv: Any) -> int:
    """The version's places: its ``concurrency``, else :data:`DEFAULT` or ``0`` (no bound) by kind."""
    configured = mv.config.concurrency
    if configured is not None:
        return int(configured)
    if getattr(mv.config, "queue", None) is not None:
        # Triton runs an instance one call (one batch) at a time; its queue orders the rest
        batch = mv.config.batching.max_batch_size
        return batch if batch >= 2 else 1
    by = mv.loaded_by or ""
    if by.startswith(MODEL_PY_PREFIX) or by == "pipeline" or load.in_host():
        return 0
    return DEFAULT


def queues(mv: Any) -> bool:
    """Whether the version orders its waiting calls by priority and timeout: it has a ``queue:``
    and computes in this process (a version in model hosts queues there, out of reach)."""
    if getattr(mv.config, "queue", None) is None or not getattr(mv.executor, "local", False):
        return False
    return isinstance(turn(mv), PriorityGate)


def turn(mv: Any) -> contextlib.AbstractContextManager[Any]:
    """The version's gate (made on first use, kept on ``mv.gate``), or a no-op without a bound."""
    if mv.gate is None:
        with _lock:
            if mv.gate is None:
                places = places_of(mv)
                queue = getattr(mv.config, "queue", None)
                if places > 0 and queue is not None:
                    mv.gate = PriorityGate(places, queue, mv.name)
                else:
                    mv.gate = Gate(places) if places > 0 else _UNBOUNDED
    return mv.gate
