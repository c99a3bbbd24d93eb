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
import threading
from collections import deque
from typing import Any

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


def places_of(mv: Any) -> int:
    """The version's places: its ``concurrency``, else :data:`DEFAULT` or ``0`` (no bound) by kind."""
    configured = mv.config.concurrency
    if configured is not None:
        return int(configured)
    by = mv.loaded_by or ""
    if by.startswith(MODEL_PY_PREFIX) or by == "pipeline" or load.in_host():
        return 0
    return DEFAULT


def turn(mv: Any) -> contextlib.AbstractContextManager[Any]:
    """The version's gate (made on first use, kept on ``mv.gate``), or a no-op without a bound."""
    if mv.gate is None:
        with _lock:
            if mv.gate is None:
                places = places_of(mv)
                mv.gate = Gate(places) if places > 0 else _UNBOUNDED
    return mv.gate
