"""Prometheus metrics at ``GET /metrics``, summed over every gunicorn worker.

Each worker is its own process, so counters live in prometheus_client's
multiprocess mode: the server points ``PROMETHEUS_MULTIPROC_DIR`` at a fresh
folder before any worker starts (:func:`prepare_multiprocess_dir`), each worker
writes its values there, and whichever worker answers a scrape sums them all.
A worker that exits is marked dead (:func:`mark_process_dead`) so its in-flight
gauge stops counting; its counters stay, so totals survive worker restarts.
Without the variable (an in-process test app) the process's own registry is used.

What is measured:

- ``servekit_requests_total{model,protocol,status}`` and
  ``servekit_request_duration_seconds{model,protocol,status}`` per request, as the
  client saw it (413/429/504 answered by the limits included);
- ``servekit_requests_in_flight``: requests being answered now;
- ``servekit_batch_size{model}``: rows per call of the model's ``predict``, or texts
  per call of its ``embed`` (the merged batch when adaptive batching is on);
- ``servekit_model_state{model,version,state}`` and
  ``servekit_model_load_seconds{model,version}``, read from the answering
  worker's repository at scrape time;
- ``servekit_resident_bytes``: resident memory of every process of the server, read
  from ``/proc`` at scrape time;
- ``servekit_request_log_dropped_total``: request logs the spool could not keep or the store refused;
- ``servekit_model_requests_waiting{model}``, ``servekit_model_requests_running{model}``,
  ``servekit_model_queue_seconds{model}`` and ``servekit_concurrency_per_replica``: the
  load signal an autoscaler targets (:mod:`.load`, docs/scaling.md);
- ``servekit_host_queue_depth``, ``servekit_host_batch_size`` and
  ``servekit_host_restarts_total{model,version,replica}`` for model hosts
  (:mod:`.host_metrics`, docs/model-processes.md).

``model`` is the served model a request addressed, or ``""`` when it names none
that is served: a fuzzer's random names must not grow the label set.
"""

from __future__ import annotations

import bisect
import logging
import os
import shutil
import sqlite3
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from servekit.hooks.specs import hookimpl
from servekit.observability.tally import Tally
from servekit.observability.tally import add_to_histogram as _add_to_histogram

if TYPE_CHECKING:
    from flask import Blueprint

log = logging.getLogger("servekit.metrics")


class Served(Protocol):
    """What metrics read of a :class:`~servekit.dataplane.data_plane.DataPlane`.

    Not imported from there: the repository and the model hosts record metrics,
    so this module sits below the data plane and must not import it back.
    """

    @property
    def models(self) -> dict[str, Any]: ...


ENV = "PROMETHEUS_MULTIPROC_DIR"

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)

# -- the multiprocess folder (server side) ------------------------------------------


def prepare_multiprocess_dir() -> str:
    """Set ``PROMETHEUS_MULTIPROC_DIR`` for this server before workers fork.

    An operator's folder is emptied (values of a previous run must not add up);
    otherwise a private temporary folder is made.  Must run before
    ``prometheus_client`` is first imported, which reads the variable then.
    """
    given = os.environ.get(ENV)
    if given:
        folder = Path(given)
        folder.mkdir(parents=True, exist_ok=True)
        for entry in folder.glob("*.db"):
            entry.unlink()
        return str(folder)
    made = tempfile.mkdtemp(prefix="servekit-metrics-")
    os.environ[ENV] = made
    os.environ["SERVEKIT_OWN_METRICS_DIR"] = "1"
    return made


def remove_multiprocess_dir() -> None:
    """At server exit, remove the folder if :func:`prepare_multiprocess_dir` made it."""
    if os.environ.pop("SERVEKIT_OWN_METRICS_DIR", None) and os.environ.get(ENV):
        shutil.rmtree(os.environ[ENV], ignore_errors=True)


def mark_process_dead(pid: int) -> None:
    """gunicorn ``child_exit``: drop a dead worker's (or model host's) live gauges.

    prometheus_client's own ``mark_process_dead`` lists the files, then removes each:
    two workers that both find the same model host gone race on its files, and a
    process that never wrote a live gauge has none.  Either is no error here.
    """
    folder = os.environ.get(ENV)
    if folder:
        for path in Path(folder).glob(f"gauge_live*_{pid}.db"):  # livesum, liveall, livemax, ...
            path.unlink(missing_ok=True)


# -- the metrics -------------------------------------------------------------------------


class Metrics:
    """The process's metric objects, made once on first use (after the fork)."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        labels = ("model", "protocol", "status")
        self.requests = Counter("servekit_requests", "HTTP requests answered", labels)
        self.latency = Histogram(
            "servekit_request_duration_seconds",
            "time to answer a request, streams to their end",
            labels,
            buckets=LATENCY_BUCKETS,
        )
        self.in_flight = Gauge("servekit_requests_in_flight", "requests being answered", multiprocess_mode="livesum")
        self.batch_size = Histogram(
            "servekit_batch_size",
            "rows per call of a model's predict (texts per embed call)",
            ("model",),
            buckets=BATCH_BUCKETS,
        )
        self.queue_cancelled = Counter(
            "servekit_queue_cancelled",
            "queued requests dropped without being computed (disconnected, timeout, queue_full)",
            ("model", "reason"),
        )
        self.queue_pending = Gauge(
            "servekit_queue_pending",
            "requests waiting in a model's priority queue",
            ("model",),
            multiprocess_mode="livesum",
        )
        self.traffic_requests = Counter(
            "servekit_traffic_requests",
            "requests of a split model (traffic:) by the target that answered",
            ("model", "target"),
        )
        self.shadow_dropped = Counter(
            "servekit_shadow_dropped", "shadow copies dropped: the candidate fell too far behind", ("model",)
        )
        self.traffic_latency = Histogram(
            "servekit_traffic_duration_seconds",
            "time a split model's target took to answer",
            ("model", "target"),
            buckets=LATENCY_BUCKETS,
        )
        self.log_dropped = Counter(
            "servekit_request_log_dropped", "request logs the spool could not keep or the store refused"
        )


_metrics: Metrics | None = None
_lock = threading.Lock()


def metrics() -> Metrics:
    global _metrics
    if _metrics is None:
        with _lock:
            if _metrics is None:
                _metrics = Metrics()
    return _metrics


def observe_request(model: str, protocol: str, status: int, seconds: float) -> None:
    _tally.request((model, protocol, str(status)), seconds)


def observe_batch(model: str, rows: int) -> None:
    """Record one model call of ``rows`` rows (also callable from a batcher)."""
    _tally.batch(model, rows)


def request_started() -> None:
    _tally.moved_in_flight(1)


def request_finished() -> None:
    _tally.moved_in_flight(-1)


def flush() -> None:
    """Write this process's tally into the shared values now (a scrape, a worker about to exit)."""
    _tally.flush()


class _Tally(Tally):
    """What this process observed since the last flush, summed in plain Python.

    About six Prometheus increments and label lookups per request were a tenth of
    a small request's time; a scrape flushes its own process first, so another
    worker's last fraction of a second may be missing from a scrape, never a count.
    """

    thread_name = "servekit-metrics"

    def reset(self) -> None:
        self._requests: dict[tuple[str, str, str], list[Any]] = {}  # labels -> [count, sum, bucket counts]
        self._batches: dict[str, list[Any]] = {}  # model -> [sum, bucket counts]
        self._in_flight = 0
        self._published_in_flight = 0

    def request(self, labels: tuple[str, str, str], seconds: float) -> None:
        slot = bisect.bisect_left(LATENCY_BUCKETS, seconds)
        with self._lock:
            entry = self._requests.get(labels)
            if entry is None:
                entry = self._requests[labels] = [0, 0.0, [0] * (len(LATENCY_BUCKETS) + 1)]
            entry[0] += 1
            entry[1] += seconds
            entry[2][slot] += 1
        self.started()

    def batch(self, model: str, rows: int) -> None:
        slot = bisect.bisect_left(BATCH_BUCKETS, rows)
        with self._lock:
            entry = self._batches.get(model)
            if entry is None:
                entry = self._batches[model] = [0, [0] * (len(BATCH_BUCKETS) + 1)]
            entry[0] += rows
            entry[1][slot] += 1
        self.started()

    def moved_in_flight(self, delta: int) -> None:
        with self._lock:
            self._in_flight += delta
        self.started()

    def flush(self) -> None:
        with self._lock:
            requests, self._requests = self._requests, {}
            batches, self._batches = self._batches, {}
            in_flight = self._in_flight
        if not requests and not batches and in_flight == self._published_in_flight:
            return  # nothing new: a worker that served nothing writes no files at exit
        m = metrics()
        for labels, (count, total, slots) in requests.items():
            self.child(m.requests, "requests", labels).inc(count)
            _add_to_histogram(self.child(m.latency, "latency", labels), total, slots)
        for model, (total, slots) in batches.items():
            _add_to_histogram(self.child(m.batch_size, "batch", (model,)), total, slots)
        if in_flight != self._published_in_flight:
            m.in_flight.inc(in_flight - self._published_in_flight)
            self._published_in_flight = in_flight


_tally = _Tally()


# -- scraping ------------------------------------------------------------------------------


class ResponseCacheCollector:
    """The response cache's entries and bytes, server-wide (servekit.dataplane.response_cache)."""

    def __init__(self, dataplane: Served):
        self.dataplane = dataplane

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        cache = getattr(self.dataplane, "response_cache", None)
        if cache is None:
            return
        try:
            entries, held = cache.usage()
        except sqlite3.Error as exc:  # a scrape still answers, without these two
            log.warning("response cache usage not read: %s", exc)
            return
        yield GaugeMetricFamily("servekit_response_cache_entries", "answers the response cache holds", value=entries)
        yield GaugeMetricFamily(
            "servekit_response_cache_bytes", "bytes of answers the response cache holds", value=held
        )


class ModelStateCollector:
    """Model versions' state and load time, read from this worker's repository."""

    def __init__(self, dataplane: Served):
        self.dataplane = dataplane

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        state = GaugeMetricFamily(
            "servekit_model_state",
            "1 for the state a model version is in, else 0",
            labels=["model", "version", "state"],
        )
        load = GaugeMetricFamily(
            "servekit_model_load_seconds",
            "seconds the last load of a model version took",
            labels=["model", "version"],
        )
        resident = GaugeMetricFamily(
            "servekit_model_resident_bytes",
            "bytes --model-memory-budget counts for a model while it is loaded (its versions' files), 0 when not",
            labels=["model"],
        )
        for name, model in sorted(self.dataplane.models.items()):
            resident.add_metric([name], float(model.bytes if model.available() else 0))
            for version, mv in sorted(model.versions.items()):
                for s in type(mv.state):  # every repository.State, 1 for the current one
                    state.add_metric([name, str(version), s.value], 1.0 if mv.state is s else 0.0)
                if mv.load_seconds:
                    load.add_metric([name, str(version)], mv.load_seconds)
        yield state
        yield load
        yield resident
        server = GaugeMetricFamily(
            "servekit_resident_bytes",
            "resident memory of the server's processes: workers, model hosts and the engine's top process",
        )
        server.add_metric([], float(resident_bytes()))
        yield server


def resident_bytes() -> int:
    """Resident memory of the server: every process writing metrics (workers, model hosts) and
    their parent (the engine's top process), from ``/proc``; this process alone elsewhere."""
    pids = {os.getpid()}
    folder = os.environ.get(ENV)
    if folder:
        pids.add(os.getppid())
        for path in Path(folder).glob("*.db"):
            stem = path.stem.rpartition("_")[2]
            if stem.isdigit():
                pids.add(int(stem))
    page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
    total = 0
    for pid in pids:
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
        except (OSError, ValueError, IndexError):
            continue  # gone, or not Linux
    if total == 0:
        import resource

        total = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return total


def render(dataplane: Served) -> tuple[bytes, str]:
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

    from servekit.observability import generation_metrics, load, statistics

    metrics()  # every family appears from the first scrape on, even at zero
    flush()  # this worker's latest requests, as any scrape elsewhere will see them soon
    load.flush()  # this worker's waiting and running requests
    generation_metrics.flush()  # this worker's latest generations
    statistics.flush()  # this worker's latest inference statistics, as a stats call sees them
    registry = CollectorRegistry(auto_describe=False)
    if os.environ.get(ENV):
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry)
        text = generate_latest(registry)
    else:
        text = generate_latest(REGISTRY)
    live = CollectorRegistry(auto_describe=False)
    live.register(ModelStateCollector(dataplane))
    live.register(generation_metrics.CacheUsageCollector())
    live.register(ResponseCacheCollector(dataplane))
    return text + generate_latest(live), CONTENT_TYPE_LATEST


def blueprint() -> Blueprint:
    """The scrape routes, for one app (Flask is imported here: a model host counts and serves no HTTP)."""
    from flask import Blueprint, Response, current_app

    bp = Blueprint("metrics", __name__)

    @bp.get("/metrics")
    @bp.get("/monitoring/prometheus/metrics")  # TF Serving's path (--monitoring_config_file)
    def scrape():
        body, content_type = render(current_app.extensions["servekit"])
        return Response(body, status=200, content_type=content_type)

    return bp


# -- batch sizes, as a cross-cutting plugin ------------------------------------------------


class BatchSizePlugin:
    """Wraps every model's ``predict`` and ``embed`` and records how many rows (texts) each call was given."""

    def __init__(self, dataplane: Served):
        self.dataplane = dataplane

    @hookimpl(wrapper=True)
    def predict(self, inputs: Any, name: str):
        rows = _rows(inputs)
        result = yield
        if result is not None and rows:
            observe_batch(name, rows)
        return result

    @hookimpl(wrapper=True)
    def embed(self, texts: list[str], name: str):
        result = yield
        if result is not None and texts:
            observe_batch(name, len(texts))
        return result


def _rows(inputs: Any) -> int:
    first = next(iter(inputs.values()), None) if isinstance(inputs, dict) else inputs
    shape = getattr(first, "shape", None)
    if shape:
        return int(shape[0])
    try:
        return len(first)  # type: ignore[arg-type]
    except TypeError:
        return 1 if first is not None else 0
