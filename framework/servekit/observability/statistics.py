"""Per model version inference statistics: what Triton's statistics extension reports.

The data plane records every ``predict`` (whatever protocol asked) with
:func:`recorded` and :class:`Request`; :func:`snapshot` reads the totals back
for ``GET /v2/models/NAME/stats`` and gRPC ``ModelStatistics``
(:mod:`servekit.protocols.v2_documents`).

gunicorn runs several worker processes, and a client's stats call reaches any
one of them, so per-process numbers would jump between calls.  The values are
therefore Prometheus counters: under ``servekit serve`` they live in the
multiprocess folder :mod:`servekit.observability.metrics` prepares, every
worker writes its own file, and :func:`snapshot` sums every worker's (a worker
that exits keeps its counts, as ``/metrics`` does).  They also appear at
``/metrics`` as ``servekit_inference_*``.  Without that folder (an in-process
app) the process's own counters are read.

Recording is on every request's path, and a Prometheus counter in multiprocess
mode costs a label lookup and a file write per increment (about 18 per
request).  So a request only adds its numbers to a plain in-process tally; the
tally is flushed into the counters by a background thread every
:data:`servekit.observability.tally.FLUSH_SECONDS` and by the process itself before it reads a snapshot.  A
stats call that another worker answers may therefore miss the last fraction of
a second of this worker's requests; the same worker's never.

What each duration means here (Triton's names, cumulative nanoseconds):

- ``success`` / ``fail``: the data plane's whole ``predict``, by outcome;
- ``compute_input``: the ``preprocess`` hook; ``compute_output``: ``postprocess``;
- ``compute_infer``: the ``predict`` hook call, or, for a request that rode in
  another request's adaptive batch, its whole wait for that batch's answer;
- ``queue``: the time a batch leader waited for batch-mates before the call.

A version that runs in model hosts (:mod:`servekit.hosts`) is recorded by its
host, which runs the data plane's ``predict``; the worker that handed the
request over does not count it again.

``inference_count`` counts rows (the first dimension of the inputs),
``execution_count`` calls of the ``predict`` hook, and ``batch_stats`` groups
those calls by the rows they ran.  Request decoding and encoding are the
protocol's and not counted.
"""

from __future__ import annotations

import contextvars
import functools
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from servekit.observability.tally import Tally

ENV = "PROMETHEUS_MULTIPROC_DIR"
#: The per-request durations Triton reports, in its order.
DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")
#: The per-execution durations of ``batch_stats``.
BATCH_DURATIONS = ("compute_input", "compute_infer", "compute_output")
_PREFIX = "servekit_inference_"


class _Counters:
    """The process's counters, made on first use (after the fork, with the folder set)."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge

        labels = ("model", "version", "kind")
        self.count = Counter(_PREFIX + "phase_count", "requests per phase (Triton statistics)", labels)
        self.ns = Counter(_PREFIX + "phase_ns", "cumulative nanoseconds per phase", labels)
        self.rows = Counter(_PREFIX + "rows", "inferences (rows) run", ("model", "version"))
        self.executions = Counter(_PREFIX + "executions", "calls of the predict hook", ("model", "version"))
        batch = ("model", "version", "batch_size")
        self.batch_count = Counter(_PREFIX + "batch_executions", "predict calls by rows", batch)
        self.batch_ns = Counter(_PREFIX + "batch_infer_ns", "nanoseconds of predict calls by rows", batch)
        self.last = Gauge(
            _PREFIX + "last_ms",
            "epoch milliseconds of the last inference",
            ("model", "version"),
            multiprocess_mode="max",
        )


_counters: _Counters | None = None
_lock = threading.Lock()


def counters() -> _Counters:
    global _counters
    if _counters is None:
        with _lock:
            if _counters is None:
                _counters = _Counters()
    return _counters


# -- recording ------------------------------------------------------------------------------


@dataclass
class Request:
    """One data-plane ``predict`` being timed; its phases are added as they finish."""

    name: str
    version: str
    started: int = field(default_factory=time.perf_counter_ns)
    phases: dict[str, int] = field(default_factory=dict)

    def time(self, phase: str, call: Callable[..., Any], *args: Any) -> Any:
        """Run ``call(*args)`` and add its duration to ``phase``."""
        begun = time.perf_counter_ns()
        try:
            return call(*args)
        finally:
            self.phases[phase] = self.phases.get(phase, 0) + time.perf_counter_ns() - begun

    def execution(self, rows: int, call: Callable[[], Any]) -> Any:
        """Run one call of the ``predict`` hook over ``rows`` rows (a batch or one request)."""
        begun = time.perf_counter_ns()
        self.phases["queue"] = begun - self.phases.pop("_submitted", begun)
        try:
            return call()
        finally:
            spent = time.perf_counter_ns() - begun
            self.phases["compute_infer"] = self.phases.get("compute_infer", 0) + spent
            _record_execution(self.name, self.version, rows, spent)

    def submitted(self) -> None:
        """Mark the hand-over to the batcher (or the direct call): queue time starts here."""
        self.phases["_submitted"] = time.perf_counter_ns()

    def finish(self, ok: bool, rows: int) -> None:
        total = time.perf_counter_ns() - self.started
        waited = self.phases.pop("_submitted", None)
        if waited is not None and "compute_infer" not in self.phases:
            # rode in another request's batch: the wait held that batch's call
            self.phases["compute_infer"] = time.perf_counter_ns() - waited
        _record_request(self, "success" if ok else "fail", total, rows)


def _record_request(req: Request, outcome: str, total: int, rows: int) -> None:
    key = (req.name, req.version)
    adds: list[tuple[str, tuple[str, ...], int]] = [("count", (*key, outcome), 1), ("ns", (*key, outcome), total)]
    if outcome == "success":
        for phase, ns in req.phases.items():
            adds += [("count", (*key, phase), 1), ("ns", (*key, phase), ns)]
        adds.append(("rows", key, rows))
    _tally.add(adds, last=(key, time.time_ns() // 1_000_000) if outcome == "success" else None)


def _record_execution(name: str, version: str, rows: int, ns: int) -> None:
    size = (name, version, str(rows))
    _tally.add([("executions", (name, version), 1), ("batch_count", size, 1), ("batch_ns", size, ns)])


def record_cache(name: str, version: str, kind: str, ns: int) -> None:
    """A response-cache lookup (``kind``: ``cache_hit`` or ``cache_miss``) and its nanoseconds.

    A hit is a successful request that ran no model (Triton's: no inference or
    execution counted); a miss adds its lookup and store time beside the request's own.
    """
    key = (name, version)
    adds: list[tuple[str, tuple[str, ...], int]] = [("count", (*key, kind), 1), ("ns", (*key, kind), ns)]
    if kind == "cache_hit":
        adds += [("count", (*key, "success"), 1), ("ns", (*key, "success"), ns)]
    _tally.add(adds, last=(key, time.time_ns() // 1_000_000) if kind == "cache_hit" else None)


class _Tally(Tally):
    """Sums recorded in this process since the last flush into the shared counters."""

    thread_name = "servekit-statistics"

    def reset(self) -> None:
        self._sums: dict[tuple[str, tuple[str, ...]], int] = {}
        self._last: dict[tuple[str, str], int] = {}

    def add(self, adds: list[tuple[str, tuple[str, ...], int]], last: tuple[Any, int] | None = None) -> None:
        with self._lock:
            sums = self._sums
            for metric, labels, amount in adds:
                key = (metric, labels)
                sums[key] = sums.get(key, 0) + amount
            if last is not None:
                self._last[last[0]] = last[1]
        self.started()

    def flush(self) -> None:
        with self._lock:
            sums, self._sums = self._sums, {}
            last, self._last = self._last, {}
        c = counters()
        for (metric, labels), amount in sums.items():
            self.child(getattr(c, metric), metric, labels).inc(amount)
        for labels, when in last.items():
            self.child(c.last, "last", labels).set(when)


_tally = _Tally()


def flush() -> None:
    """Write this process's tally into the shared counters now (a worker about to exit)."""
    _tally.flush()


_current: contextvars.ContextVar[Request | None] = contextvars.ContextVar("servekit_statistics", default=None)


def current() -> Request:
    """The request :func:`recorded` is timing in this context (a detached one outside it)."""
    return _current.get() or Request("", "")


def recorded(method: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate the data plane's ``predict`` where it runs (``LocalExecutor.predict(self, mv, inputs, ...)``): count and time each call by outcome."""

    @functools.wraps(method)
    def wrapper(self: Any, mv: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        req = Request(mv.name, str(mv.version))
        token = _current.set(req)
        try:
            result = method(self, mv, inputs, *args, **kwargs)
        except BaseException:
            req.finish(False, 0)
            raise
        finally:
            _current.reset(token)
        req.finish(True, rows_of(inputs))
        return result

    return wrapper


def rows_of(inputs: Any) -> int:
    """Rows in a request: the first dimension of its (first) input; 1 for a scalar."""
    first = next(iter(inputs.values()), None) if isinstance(inputs, dict) else inputs
    shape = getattr(first, "shape", None)
    return int(shape[0]) if shape else 1


# -- reading ---------------------------------------------------------------------------------


@dataclass
class ModelStats:
    """One model version's totals, summed over every worker."""

    counts: dict[str, int] = field(default_factory=dict)
    ns: dict[str, int] = field(default_factory=dict)
    inference_count: int = 0
    execution_count: int = 0
    last_inference: int = 0
    #: rows -> (executions, nanoseconds of the predict calls)
    batches: dict[int, tuple[int, int]] = field(default_factory=dict)


def snapshot() -> dict[tuple[str, str], ModelStats]:
    """Every recorded model version's totals, keyed by ``(name, version)``."""
    _tally.flush()  # this process's own requests are always counted
    found: dict[tuple[str, str], ModelStats] = {}
    for name, labels, value in _samples():
        key = (labels.get("model", ""), labels.get("version", ""))
        _add(found.setdefault(key, ModelStats()), name[len(_PREFIX) :], labels, int(value))
    return found


def _add(stats: ModelStats, metric: str, labels: dict[str, str], value: int) -> None:
    if metric == "phase_count_total":
        stats.counts[labels["kind"]] = value
    elif metric == "phase_ns_total":
        stats.ns[labels["kind"]] = value
    elif metric == "rows_total":
        stats.inference_count = value
    elif metric == "executions_total":
        stats.execution_count = value
    elif metric == "last_ms":
        stats.last_inference = value
    elif metric in ("batch_executions_total", "batch_infer_ns_total"):
        rows = int(labels["batch_size"])
        count, ns = stats.batches.get(rows, (0, 0))
        stats.batches[rows] = (value, ns) if metric.startswith("batch_exec") else (count, value)


def _samples() -> Iterator[tuple[str, dict[str, str], float]]:
    from prometheus_client import REGISTRY, CollectorRegistry

    counters()  # the families exist (at zero) before the first request
    if os.environ.get(ENV):
        from prometheus_client import multiprocess

        registry = CollectorRegistry(auto_describe=False)
        multiprocess.MultiProcessCollector(registry)
    else:
        registry = REGISTRY
    for family in registry.collect():
        if not family.name.startswith(_PREFIX):
            continue
        for sample in family.samples:
            if sample.name.startswith(_PREFIX) and not sample.name.endswith("_created"):
                yield sample.name, sample.labels, sample.value
