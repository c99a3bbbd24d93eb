"""Keep what a serving process loaded out of the garbage collector's full passes.

A worker holds hundreds of thousands of objects that live as long as it does:
the imported frameworks, the app, the models.  Python's cyclic collector walks
every one of them on each full (generation 2) collection, with the GIL held, so
every request in the process waits.  Measured in a worker under load: 60-115 ms
a pass over 160,000 objects (scikit-learn models), 80-160 ms over 220,000-400,000
(transformers).  One such pass inside a benchmark cell is that cell's p99.

:func:`settle` runs once the process serves a new set of models (each change of
the plan a repository applies, and a model host's load).  It collects what the
change left behind, then ``gc.freeze()`` moves every object still alive into the
collector's permanent generation, which the later passes skip.  Those passes
then walk only what requests create.  Objects in the permanent generation are
still freed by reference counting.  A reference cycle among them that becomes
garbage (an unloaded model's) is found at the next :func:`settle`: it puts them
back into the collector's care (``gc.unfreeze()``) before it collects.  Python's
documentation recommends ``gc.freeze()`` before a fork as well, to keep the
parent's pages shared: with ``--preload`` the models' first settle runs in the
master, before the workers fork.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time

log = logging.getLogger("servekit.long_lived")

_lock = threading.Lock()


def settle() -> int:
    """Collect, then freeze every object alive; returns how many are frozen."""
    with _lock:
        started = time.perf_counter()
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        frozen = gc.get_freeze_count()
    log.info(
        "process %d: %d long-lived objects left out of the garbage collector's passes (%.0f ms)",
        os.getpid(),
        frozen,
        1e3 * (time.perf_counter() - started),
    )
    return frozen
