"""Prometheus series of model hosts (:mod:`servekit.hosts`): queue depth, batch sizes, restarts.

The host process writes its own values into the multiprocess folder it inherits
from the server; the worker that restarts a dead host counts the restart.
Read at ``/metrics`` with everything else (:mod:`servekit.observability.metrics`).
"""

from __future__ import annotations

import threading
from typing import Any

from servekit.observability.metrics import BATCH_BUCKETS

_families_lock = threading.Lock()


class HostMetrics:
    """One model host's series: requests inside it, rows per call, and restarts (counted by workers)."""

    def __init__(self, families: tuple[Any, Any, Any], model: str, version: str, replica: str) -> None:
        queue, batch, restarts = families
        self.queue = queue.labels(model, version, replica)
        self.batch = batch.labels(model, version, replica)
        self.restarts = restarts.labels(model, version, replica)


_host_families: tuple[Any, Any, Any] | None = None


def host_metrics(model: str, version: str, replica: str) -> HostMetrics:
    """The series of one host (a replica of a model version), families made on first use."""
    global _host_families
    with _families_lock:
        if _host_families is None:
            from prometheus_client import Counter, Gauge, Histogram

            labels = ("model", "version", "replica")
            _host_families = (
                Gauge(
                    "servekit_host_queue_depth",
                    "requests a model host holds: waiting for a batch or running",
                    labels,
                    multiprocess_mode="livesum",
                ),
                Histogram(
                    "servekit_host_batch_size", "rows per predict call in a model host", labels, buckets=BATCH_BUCKETS
                ),
                Counter("servekit_host_restarts", "model hosts started again after they died", labels),
            )
    return HostMetrics(_host_families, model, version, replica)


def host_restarted(model: str, version: str, replica: str) -> None:
    host_metrics(model, version, replica).restarts.inc()
