"""Prometheus series of a generative model's continuous batching: sequences running and waiting.

The process that runs the scheduler (a worker, or the model host every worker
feeds) writes its values into the multiprocess folder; ``/metrics`` sums them
over live processes.  Read with everything else (:mod:`servekit.observability.metrics`).
"""

from __future__ import annotations

import threading
from typing import Any

_families_lock = threading.Lock()
_families: tuple[Any, Any] | None = None


class GenerationGauges:
    """One model version's gauges: sequences in the running batch, and requests waiting to join it."""

    def __init__(self, families: tuple[Any, Any], model: str, version: str) -> None:
        running, queued = families
        self.running = running.labels(model, version)
        self.queued = queued.labels(model, version)


def generation_gauges(model: str, version: str) -> GenerationGauges:
    """The gauges of one model version, families made on first use."""
    global _families
    with _families_lock:
        if _families is None:
            from prometheus_client import Gauge

            labels = ("model", "version")
            _families = (
                Gauge(
                    "servekit_generation_running",
                    "sequences in a generative model's running batch",
                    labels,
                    multiprocess_mode="livesum",
                ),
                Gauge(
                    "servekit_generation_queue_depth",
                    "generation requests waiting to join a model's running batch",
                    labels,
                    multiprocess_mode="livesum",
                ),
            )
    return GenerationGauges(_families, model, version)
