"""Sums a process keeps in memory and flushes into Prometheus values in the background.

In multiprocess mode every increment of a Prometheus value takes a label lookup,
a pid check and a write to a memory-mapped file.  Per-request recorders
(:mod:`servekit.observability.metrics`, :mod:`servekit.observability.statistics`) add to plain
Python sums instead; a daemon thread, started by the first record in each
process, flushes them every :data:`FLUSH_SECONDS`, and a reader flushes its own
process first.  A forked child starts empty.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

#: How often a process's sums reach the shared values.
FLUSH_SECONDS = 0.5


class Tally:
    """Base of a recorder: the lock, the flusher thread, fork safety and cached label children."""

    thread_name = "servekit-tally"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._children: dict[tuple[str, tuple[str, ...]], Any] = {}
        self._flushing = False  # a flusher thread runs in this process
        self.reset()
        os.register_at_fork(after_in_child=self._forked)

    def reset(self) -> None:
        """Empty the sums (at start and in a forked child)."""

    def flush(self) -> None:
        """Move the sums into the shared values."""

    def started(self) -> None:
        """Call after each record: the first one in a process starts its flusher."""
        if self._flushing:
            return
        with self._lock:
            if self._flushing:
                return
            self._flushing = True
        threading.Thread(target=self._run, name=self.thread_name, daemon=True).start()

    def child(self, family: Any, metric: str, labels: tuple[str, ...]) -> Any:
        """``family.labels(*labels)``, looked up once per process."""
        key = (metric, labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = family.labels(*labels)
        return found

    def _forked(self) -> None:
        """A child starts empty: its parent's sums, children and thread are the parent's."""
        self._lock = threading.Lock()
        self._children = {}
        self._flushing = False
        self.reset()

    def _run(self) -> None:
        while True:
            time.sleep(FLUSH_SECONDS)
            self.flush()


def add_to_histogram(child: Any, total: float, slots: list[int]) -> None:
    """Add summed observations to a histogram child: its sum, and each bucket's count.

    prometheus_client keeps a histogram as a sum and one value per bucket
    (non-cumulative, the last one +Inf); without that layout (another version),
    each observation is replayed at its bucket's bound.
    """
    buckets, value_sum = getattr(child, "_buckets", None), getattr(child, "_sum", None)
    if buckets is not None and value_sum is not None and len(buckets) == len(slots):
        value_sum.inc(total)
        for bucket, count in zip(buckets, slots):
            if count:
                bucket.inc(count)
        return
    bounds = [*getattr(child, "_upper_bounds", []), float("inf")]
    for bound, count in zip(bounds, slots):
        for _ in range(count):
            child.observe(bound)
