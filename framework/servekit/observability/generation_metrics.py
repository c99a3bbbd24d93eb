"""Prometheus series of a generative model's continuous batching: sequences running and waiting,
and the prompt tokens its prefix cache was asked for and held (vLLM's ``prefix_cache_queries`` and
``prefix_cache_hits``).

The process that runs the scheduler (a worker, or the model host every worker
feeds) writes its values into the multiprocess folder; ``/metrics`` sums them
over live processes.  Read with everything else (:mod:`servekit.observability.metrics`).
"""

from __future__ import annotations

import threading
from typing import Any

_families_lock = threading.Lock()
_families: tuple[Any, Any, Any, Any] | None = None


class GenerationGauges:
    """One model version's series: sequences in the running batch, requests waiting to join it,
    and prompt tokens looked up in the prefix cache and found there."""

    def __init__(self, families: tuple[Any, Any, Any, Any], model: str, version: str) -> None:
        running, queued, queried, hit = families
        self.running = running.labels(model, version)
        self.queued = queued.labels(model, version)
        self.prefix_queried = queried.labels(model, version)
        self.prefix_hit = hit.labels(model, version)


def generation_gauges(model: str, version: str) -> GenerationGauges:
    """The gauges of one model version, families made on first use."""
    global _families
    with _families_lock:
        if _families is None:
            from prometheus_client import Counter, Gauge

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
                Counter(
                    "servekit_prefix_cache_queries",
                    "prompt tokens a generative model looked up in its prefix cache",
                    labels,
                ),
                Counter(
                    "servekit_prefix_cache_hits",
                    "prompt tokens a generative model found in its prefix cache (not computed again)",
                    labels,
                ),
            )
    return GenerationGauges(_families, model, version)
