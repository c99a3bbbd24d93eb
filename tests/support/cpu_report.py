"""Where the suite's CPU goes: the CPU seconds each test module costs, servers it started included.

Wall-clock durations (``--durations``) say which tests are long, not which are
expensive: on 2 CPUs a parallel run is bound by the CPU its tests burn, and a
test that waits on a server costs little.  With ``SERVEKIT_TEST_CPU_REPORT=FILE``
each pytest process (every xdist worker) appends one JSON line per test to
``FILE``: the node id, the user+system seconds of the process itself and of
its waited-for children (servers, subprocesses) across the test's setup, call
and teardown, the children's share of them, and when and in which worker it
ended.  A module-scoped server's cost lands on the test whose teardown stops it,
so sum by module::

    SERVEKIT_TEST_CPU_REPORT=/tmp/cpu.jsonl bash scripts/test.sh -q
    python tests/support/cpu_report.py /tmp/cpu.jsonl
"""

from __future__ import annotations

import collections
import json
import os
import resource
import sys
import time
from collections.abc import Generator

import pytest
import server_forks

ENV = "SERVEKIT_TEST_CPU_REPORT"


def _cpu_seconds() -> tuple[float, float]:
    """The CPU seconds of this process, and of its waited-for children (servers forked for it included)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime + server_forks.reaped_cpu()


class CpuReport:
    """The pytest plugin: one line per test, appended to the report file."""

    def __init__(self, path: str):
        self.path = path

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, None, None]:
        own, children = _cpu_seconds()
        yield
        own_after, children_after = _cpu_seconds()
        own, children = own_after - own, children_after - children
        line = json.dumps(
            {
                "test": item.nodeid,
                "cpu": round(own + children, 3),
                "children": round(children, 3),
                # when it ended, and where: a timeline of the run, for its tail
                "end": round(time.time(), 2),
                "worker": os.environ.get("PYTEST_XDIST_WORKER", ""),
            }
        )
        with open(self.path, "a") as report:
            report.write(line + "\n")


def register(config: pytest.Config) -> None:
    """Register the plugin when ``SERVEKIT_TEST_CPU_REPORT`` names a file (called from conftest.py)."""
    path = os.environ.get(ENV)
    if path:
        config.pluginmanager.register(CpuReport(path), "servekit-cpu-report")


def summary(path: str, top: int = 40) -> str:
    """The modules by CPU seconds, most first, with the run's total."""
    by_module: collections.Counter[str] = collections.Counter()
    in_children: collections.Counter[str] = collections.Counter()
    with open(path) as report:
        for line in report:
            record = json.loads(line)
            module = record["test"].split("::")[0]
            by_module[module] += record["cpu"]
            in_children[module] += record.get("children", 0.0)
    lines = [
        "     all  children",
        f"{sum(by_module.values()):8.1f}  {sum(in_children.values()):8.1f}  all {len(by_module)} modules",
    ]
    lines += [f"{seconds:8.1f}  {in_children[module]:8.1f}  {module}" for module, seconds in by_module.most_common(top)]
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40))
