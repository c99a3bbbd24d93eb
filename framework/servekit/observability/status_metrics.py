"""``GET /metrics/summary``: the few numbers the status page charts, summed over workers and hosts.

One small JSON document read from the same values ``/metrics`` serves (the
multiprocess folder every worker and model host writes), so any worker answers
for the whole server.  Counters are totals since the server started; the page
takes the difference of two readings for rates, and of two histograms'
buckets for p50/p99, as Prometheus's ``rate()`` and ``histogram_quantile()`` do::

    {"time": 1764633600.1, "latency_bounds": [0.001, ..., "+Inf"], "batch_bounds": [...],
     "server": {"requests": 120, "statuses": {"200": 118, "503": 2}, "latency": [cumulative counts],
                "in_flight": 3, "queue": 3, "batch": [rows, calls], "resident_bytes": 512000000},
     "models": {"iris": {"ready": true, "requests": ..., "statuses": ..., "latency": [...],
                         "queue": 0, "batch": [rows, calls], "resident_bytes": 2048}}}

Queue depth per model is :data:`QUEUE_SERIES`, the requests accepted for the
model and not yet running (summed over workers and model hosts, the series an
autoscaler reads, :mod:`.load`), and for the server the requests in flight.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from flask import Blueprint, current_app

from servekit.observability import load, metrics

bp = Blueprint("status_metrics", __name__)

#: The series each number comes from (without ``_total``/``_bucket``), easy to point elsewhere.
REQUESTS_SERIES = "servekit_requests"
LATENCY_SERIES = "servekit_request_duration_seconds"
BATCH_SERIES = "servekit_batch_size"
IN_FLIGHT_SERIES = "servekit_requests_in_flight"
QUEUE_SERIES = load.WAITING
RESIDENT_SERIES = "servekit_model_resident_bytes"
SERVER_RESIDENT_SERIES = "servekit_resident_bytes"


def _families(dataplane: Any) -> list[Any]:
    from prometheus_client import REGISTRY, CollectorRegistry

    metrics.metrics()
    metrics.flush()  # this worker's latest requests
    if os.environ.get(metrics.ENV):
        from prometheus_client import multiprocess

        registry = CollectorRegistry(auto_describe=False)
        multiprocess.MultiProcessCollector(registry)
        found = list(registry.collect())
    else:
        found = list(REGISTRY.collect())
    return found + list(metrics.ModelStateCollector(dataplane).collect())


def _entry() -> dict[str, Any]:
    return {
        "requests": 0,
        "statuses": {},
        "latency": [0] * (len(metrics.LATENCY_BUCKETS) + 1),
        "queue": 0,
        "batch": [0.0, 0],
        "resident_bytes": 0,
    }


def summary(dataplane: Any) -> dict[str, Any]:
    """The document described above."""
    server = {**_entry(), "in_flight": 0}
    models = {name: {**_entry(), "ready": bool(model.available())} for name, model in sorted(dataplane.models.items())}
    for family in _families(dataplane):
        for sample in family.samples:
            _add(sample.name, sample.labels, sample.value, server, models.get(sample.labels.get("model", "")))
    server["in_flight"] = max(0, server["in_flight"] - 1)  # not counting this request
    server["queue"] = server["in_flight"]
    return {
        "time": time.time(),
        "latency_bounds": [*metrics.LATENCY_BUCKETS, "+Inf"],
        "server": server,
        "models": models,
    }


_LATENCY_SLOT = {repr(float(b)): i for i, b in enumerate([*metrics.LATENCY_BUCKETS, float("inf")])}


def _add(name: str, labels: dict[str, str], value: float, server: dict, model: dict | None) -> None:
    """One sample into the server's numbers and its model's (``None``: no served model)."""
    both = [entry for entry in (server, model) if entry is not None]
    if name == REQUESTS_SERIES + "_total":
        status = labels.get("status", "")
        for entry in both:
            entry["requests"] += int(value)
            entry["statuses"][status] = entry["statuses"].get(status, 0) + int(value)
    elif name == LATENCY_SERIES + "_bucket":
        slot = _LATENCY_SLOT.get(repr(float(labels["le"])))
        for entry in both if slot is not None else []:
            entry["latency"][slot] += int(value)
    elif name in (BATCH_SERIES + "_sum", BATCH_SERIES + "_count"):
        for entry in both:
            entry["batch"][0 if name.endswith("_sum") else 1] += value
    elif name == IN_FLIGHT_SERIES:
        server["in_flight"] += int(value)
    elif name == SERVER_RESIDENT_SERIES:
        server["resident_bytes"] = int(value)
    elif model is not None and name in (QUEUE_SERIES, RESIDENT_SERIES):
        model["queue" if name == QUEUE_SERIES else "resident_bytes"] += round(value)


@bp.get("/metrics/summary")
def summary_route():
    document = summary(current_app.extensions["servekit"])
    return current_app.response_class(json.dumps(document), mimetype="application/json")
