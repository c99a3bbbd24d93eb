"""How many CPUs this process may use, as a container sees it.

``os.cpu_count()`` is the host's count; a container limited by a CPU quota
(Kubernetes ``resources.limits.cpu``) or pinned by affinity may use fewer.
The smallest of the affinity mask and the cgroup quota (v2 ``cpu.max``, v1
``cpu.cfs_quota_us``/``cpu.cfs_period_us``), rounded up, at least 1.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def available_cpus(cgroup_root: Path = CGROUP_ROOT) -> int:
    counts = [_affinity()]
    quota = cgroup_quota(cgroup_root)
    if quota is not None:
        counts.append(max(1, math.ceil(quota)))
    return max(1, min(counts))


def _affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cgroup_quota(cgroup_root: Path = CGROUP_ROOT) -> float | None:
    """CPUs the cgroup quota allows (fractional), or None when there is no quota."""
    v2 = cgroup_root / "cpu.max"
    try:
        quota, period = v2.read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((cgroup_root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((cgroup_root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us


#: set by ``servekit serve`` to the number of HTTP workers, for plugins sizing their thread pools
WORKERS_ENV = "SERVEKIT_WORKER_PROCESSES"


def cpus_per_worker() -> int:
    """The CPUs one worker process may keep busy: the available CPUs shared by the workers, at least 1.

    A framework whose kernels start one thread per core (ONNX Runtime, XGBoost,
    LightGBM) would otherwise run ``workers x cores`` threads on ``cores``
    cores, and each call would wait on the others' threads.
    """
    try:
        workers = max(1, int(os.environ.get(WORKERS_ENV, "1")))
    except ValueError:
        workers = 1
    return max(1, available_cpus() // workers)
