"""Adaptive batching: concurrent requests to one model version share one ``predict`` call.

Requests arrive on any protocol and reach :meth:`DataPlane.predict`; when the
model's ``batching.max_batch_size`` (``servekit.yaml``, or ``--max-batch-size``)
is above 1, the data plane hands each request to the model version's
:class:`Batcher`.  Requests that can share a call (same signature, parameters,
requested outputs, input names, dtypes and trailing shapes) are stacked along
axis 0, the ``predict`` hook runs once, and its outputs are split back by rows.

There is no batching thread.  The first request of a batch is its *leader*: it
waits for batch-mates and then runs the call in its own (gunicorn) thread;
the others wait for their share.  The leader closes the batch when

- the batch holds ``max_batch_size`` rows, or
- ``max_batch_time_ms`` has passed since the batch opened, or
- the model is idle: no call of this model version is running.

The last rule makes batching *adaptive*: under light load a request never
waits (nothing is running, so its batch closes at once), and under heavy load
requests pile up while the model is busy and go in together when it frees up.

Isolation: requests whose tensors differ in trailing shape or dtype never
share a batch, so a malformed request is checked by the model on its own.  If
a batched call raises, every member is retried on its own, so each gets its
own answer or its own error.  Outputs that cannot be split by rows (a scalar,
a generator, a wrong first dimension) are recomputed per request and batching
is switched off for that model version, with a warning.  A model whose
``predict`` is a generator function (it streams) is never batched.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import orjson

from servekit.observability import load
from servekit.streams import close, is_stream
from servekit.types import BatchingConfig, Tensors

log = logging.getLogger("servekit.batching")

#: Calls the predict hook on (possibly stacked) inputs.
Runner = Callable[[Tensors], Any]


class Unsplittable(Exception):
    """A batched result cannot be cut back into per-request results."""


# ---------------------------------------------------------------------------
# Stacking and splitting
# ---------------------------------------------------------------------------


def batch_key(inputs: Tensors) -> tuple[Hashable, int] | None:
    """What must match for two requests to share a call, and the request's row count.

    ``None`` when the inputs cannot be batched: a scalar, or named tensors
    whose first dimensions differ (there is no common row axis to split on).
    """
    if isinstance(inputs, np.ndarray):
        if inputs.ndim == 0:
            return None
        return (inputs.dtype.str, inputs.shape[1:]), inputs.shape[0]
    if isinstance(inputs, dict) and inputs:
        rows = -1
        parts = []
        for name, value in inputs.items():
            if not isinstance(value, np.ndarray) or value.ndim == 0:
                return None
            if rows < 0:
                rows = value.shape[0]
            elif value.shape[0] != rows:
                return None
            parts.append((name, value.dtype.str, value.shape[1:]))
        return tuple(parts), rows
    return None


def stack(members: list[Tensors]) -> Tensors:
    """Concatenate requests along axis 0 (they share a :func:`batch_key`)."""
    first = members[0]
    if isinstance(first, np.ndarray):
        return np.concatenate(cast(list[np.ndarray], members), axis=0)
    return {name: np.concatenate([m[name] for m in members], axis=0) for name in first}


def split(outputs: Any, rows: list[int]) -> list[Any]:
    """Cut a batched result back into one result per request, ``rows[i]`` rows each."""
    total = sum(rows)
    if isinstance(outputs, dict):
        if not outputs:
            raise Unsplittable("the model returned an empty dict")
        columns = {name: split(value, rows) for name, value in outputs.items()}
        return [{name: parts[i] for name, parts in columns.items()} for i in range(len(rows))]
    if isinstance(outputs, (list, tuple)):
        if len(outputs) != total:
            raise Unsplittable(f"the model returned {len(outputs)} items for {total} rows")
        return _cut(outputs, rows)
    if isinstance(outputs, np.ndarray) or hasattr(outputs, "__array__") and hasattr(outputs, "shape"):
        array = np.asarray(outputs)
        if array.ndim == 0 or array.shape[0] != total:
            raise Unsplittable(f"the model returned shape {list(array.shape)} for {total} rows")
        return _cut(array, rows)
    raise Unsplittable(f"the model returned a {type(outputs).__name__}, which has no rows")


def _cut(sequence: Any, rows: list[int]) -> list[Any]:
    parts, start = [], 0
    for n in rows:
        parts.append(sequence[start : start + n])
        start += n
    return parts


# ---------------------------------------------------------------------------
# The batcher
# ---------------------------------------------------------------------------


@dataclass
class _Member:
    inputs: Tensors
    rows: int
    run: Runner
    arrival: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None

    def answer(self) -> Any:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.result


@dataclass
class _Batch:
    opened: float
    members: list[_Member] = field(default_factory=list)
    rows: int = 0
    closed: bool = False


@dataclass
class BatchStats:
    """Counters for tests and the benchmark: how many calls, how many requests in them."""

    calls: int = 0
    requests: int = 0
    largest: int = 0
    retried: int = 0


class Batcher:
    """Forms batches for one model version; safe to call from many threads."""

    def __init__(self, max_batch_size: int, max_batch_time_ms: float, name: str = "model"):
        if max_batch_size < 2:
            raise ValueError("a batcher needs max_batch_size >= 2")
        self.max_batch_size = max_batch_size
        self.max_wait = max(0.0, max_batch_time_ms) / 1000.0
        self.name = name
        self.enabled = True
        self.stats = BatchStats()
        self._cond = threading.Condition(threading.Lock())
        self._open: dict[Hashable, _Batch] = {}
        self._running = 0

    def submit(self, inputs: Tensors, run: Runner, options: Hashable = (), arrival: float | None = None) -> Any:
        """Predict ``inputs``, in a batch with concurrent requests where possible.

        :param run: calls the predict hook on the given inputs; the leader's
            ``run`` serves the whole batch, so it must depend only on ``options``.
        :param options: everything besides the tensors that must match
            (signature, parameters, requested outputs).
        :param arrival: when the request arrived (``time.monotonic``; default now),
            for the load signal's queue time.
        """
        arrival = time.monotonic() if arrival is None else arrival
        keyed = batch_key(inputs) if self.enabled else None
        if keyed is None or keyed[1] >= self.max_batch_size:
            return self._run_alone(inputs, run, arrival)
        shape_key, rows = keyed
        key = (options, shape_key)
        with self._cond:
            if self._running == 0 and not self._open:
                # the model is idle and nobody waits: a batch of one that closes at once
                self._running += 1
                batch = None
            else:
                member = _Member(inputs, rows, run, arrival)
                batch, leader = self._join(key, member)
        if batch is None:
            try:
                with load.running(self.name, [arrival]):
                    return run(inputs)
            finally:
                self._finished()
        if not leader:
            return member.answer()
        self._wait_and_close(key, batch)
        self._execute(batch.members)
        return member.answer()

    def _join(self, key: Hashable, member: _Member) -> tuple[_Batch, bool]:
        """Put ``member`` in the open batch for ``key`` (or open one); whether it leads. Lock held."""
        batch = self._open.get(key)
        if batch is not None and batch.rows + member.rows > self.max_batch_size:
            self._close(key, batch)  # full: its leader goes now, we start the next one
            batch = None
        leader = batch is None
        if batch is None:
            batch = _Batch(time.monotonic())
            self._open[key] = batch
        batch.members.append(member)
        batch.rows += member.rows
        if batch.rows >= self.max_batch_size:
            self._close(key, batch)
        return batch, leader

    def run_together(self, requests: list[tuple[Any, ...]]) -> list[_Member]:
        """Run requests that arrived together, now and in this thread (a model host's loop).

        Each entry is ``(inputs, run, options)`` as for :meth:`submit` (``options``
        ``None``: never batched), optionally followed by its ``arrival``.  Requests
        that may share a call do, in batches of at most ``max_batch_size`` rows, in
        arrival order; a failing batch is
        retried member by member.  Returns each request's member, in order, with
        its ``result`` or ``error`` set.
        """
        members = []
        batches: list[list[_Member]] = []
        open_: dict[Hashable, tuple[list[_Member], int]] = {}
        for inputs, run, options, *arrival in requests:
            keyed = batch_key(inputs) if self.enabled and options is not None else None
            member = _Member(inputs, keyed[1] if keyed else 0, run, *arrival)
            members.append(member)
            if keyed is None or keyed[1] >= self.max_batch_size:
                batches.append([member])
                continue
            key = (options, keyed[0])
            batch, rows = open_.get(key, (None, 0))
            if batch is None or rows + member.rows > self.max_batch_size:
                batch, rows = [], 0
                batches.append(batch)
            batch.append(member)
            open_[key] = (batch, rows + member.rows)
        for batch in batches:
            with self._cond:
                self._running += 1
            self._execute(batch)
        return members

    def queued_rows(self) -> int:
        """Rows waiting in batches that have not closed yet (for tests and debugging)."""
        with self._cond:
            return sum(batch.rows for batch in self._open.values())

    # -- internals -------------------------------------------------------------

    def _close(self, key: Hashable, batch: _Batch) -> None:
        """Called with the lock held."""
        batch.closed = True
        if self._open.get(key) is batch:
            del self._open[key]
        self._cond.notify_all()

    def _wait_and_close(self, key: Hashable, batch: _Batch) -> None:
        deadline = batch.opened + self.max_wait
        with self._cond:
            while not batch.closed and self._running > 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            self._close(key, batch)
            self._running += 1

    def _run_alone(self, inputs: Tensors, run: Runner, arrival: float) -> Any:
        with self._cond:
            self._running += 1
        try:
            with load.running(self.name, [arrival]):
                return run(inputs)
        finally:
            self._finished()

    def _finished(self) -> None:
        with self._cond:
            self._running -= 1
            self._cond.notify_all()

    def _execute(self, members: list[_Member]) -> None:
        """Run one batch (the running count was taken in :meth:`_wait_and_close`)."""
        try:
            with load.running(self.name, [m.arrival for m in members]):
                self._execute_now(members)
        finally:
            for member in members:  # never leave a waiter hanging
                if not member.done.is_set():
                    member.error = RuntimeError("batch ended without an answer")
                    member.done.set()
            self._finished()

    def _execute_now(self, members: list[_Member]) -> None:
        if len(members) == 1:
            self._run_member(members[0])
            return
        self.stats.calls += 1
        self.stats.requests += len(members)
        self.stats.largest = max(self.stats.largest, len(members))
        try:
            outputs = members[0].run(stack([m.inputs for m in members]))
            if is_stream(outputs):
                close(outputs)
                raise Unsplittable("the model returned a generator")
            parts = split(outputs, [m.rows for m in members])
        except Unsplittable as exc:
            log.warning(
                "model %s: batching switched off: %s; set batching.max_batch_size: 0 for it",
                self.name,
                exc,
            )
            self.enabled = False
            self._retry(members)
            return
        except Exception:
            # someone in the batch broke it: each member gets its own answer or error
            self._retry(members)
            return
        for member, part in zip(members, parts):
            member.result = part
            member.done.set()

    def _retry(self, members: list[_Member]) -> None:
        self.stats.retried += len(members)
        for member in members:
            self._run_member(member)

    @staticmethod
    def _run_member(member: _Member) -> None:
        try:
            member.result = member.run(member.inputs)
        except BaseException as exc:  # handed to the member's own thread
            member.error = exc
        member.done.set()


# ---------------------------------------------------------------------------
# One batcher per model version
# ---------------------------------------------------------------------------

#: A version whose batching is off (``batching.max_batch_size`` below 2, or a streaming ``predict``).
OFF = "off"
_lock = threading.Lock()
#: Every live batcher, for :func:`queued_rows`; a batcher goes with its version.
_live: weakref.WeakSet[Batcher] = weakref.WeakSet()


def batcher_for(mv: Any) -> Batcher | None:
    """The batcher of a :class:`~servekit.dataplane.repository.ModelVersion`, ``None`` when batching is off.

    Made on first use from ``mv.config.batching`` and kept on the version
    (``mv.batcher``), so it lives exactly as long as the version does.
    """
    found = mv.batcher
    if found is None:
        with _lock:
            if mv.batcher is None:
                mv.batcher = _make(mv)
            found = mv.batcher
    return found if found is not OFF else None


def active() -> list[Batcher]:
    """Every live batcher in this process."""
    return list(_live)


def queued_rows() -> int:
    """Rows waiting to be batched in this process, over all models."""
    return sum(b.queued_rows() for b in active())


def _make(mv: Any) -> Batcher | str:
    config: BatchingConfig = getattr(mv.config, "batching", None) or BatchingConfig()
    if config.max_batch_size < 2:
        return OFF
    if getattr(mv.config, "sequence", None) is not None:
        log.info("model %s keeps a state per sequence; its requests are not batched", mv.name)
        return OFF
    if _streams(mv):
        log.info("model %s streams from predict; it is not batched", mv.name)
        return OFF
    batcher = Batcher(config.max_batch_size, config.max_batch_time_ms, name=mv.name)
    _live.add(batcher)
    return batcher


def _streams(mv: Any) -> bool:
    hooks = getattr(mv, "hooks", None)
    if hooks is None:
        return False
    return any(
        inspect.isgeneratorfunction(impl.function)
        for impl in hooks.predict.get_hookimpls()
        if not (impl.wrapper or impl.hookwrapper)  # wrappers are generators by design
    )


def options_key(
    parameters: dict[str, Any] | None, signature_name: str | None, output_names: list[str] | None
) -> Hashable | None:
    """The request options as a hashable key; ``None`` when they cannot be compared."""
    if parameters:
        try:
            params: Hashable = orjson.dumps(parameters, option=orjson.OPT_SORT_KEYS)
        except TypeError:
            return None
    else:
        params = b""
    return (signature_name or "", tuple(output_names) if output_names else (), params)
