"""Leaving cleanly: SIGTERM on a multi-worker server, and one worker leaving a server that stays.

gunicorn forks its workers inside the server's own ``run``; a worker that leaves
must not tidy away what its siblings still use (the metrics folder, the control
socket), and its exit must log no traceback whether it served requests or none.
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
import requests
from servekit.testing import ServerProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def iris_root(tmp_path_factory):
    from sklearn_models import fit_iris

    root = tmp_path_factory.mktemp("shutdown")
    fit_iris(root / "iris", named=False)
    return root


def two_workers(root) -> ServerProcess:
    return ServerProcess(root, workers=2, shutdown_delay=0, drain_seconds=5)


def booted_workers(server: ServerProcess) -> list[int]:
    return [int(pid) for pid in re.findall(r"Booting worker with pid: (\d+)", server.output())]


def assert_left_cleanly(server: ServerProcess) -> None:
    assert server.stop() == 0
    log = server.output()
    assert "Exception during worker exit" not in log, log
    assert "Traceback" not in log, log


@pytest.mark.parametrize("served", [False, True], ids=["served-nothing", "served-requests"])
def test_sigterm_on_two_workers_logs_no_traceback(iris_root, served):
    server = two_workers(iris_root).start()
    try:
        if served:
            for _ in range(12):  # a new connection each: the kernel spreads them over both workers
                r = requests.post(server.url + "/v1/models/iris:predict", json=IRIS, timeout=30)
                assert r.status_code == 200, r.text
            assert requests.get(server.url + "/metrics", timeout=30).status_code == 200
    finally:
        assert_left_cleanly(server)


def test_a_worker_that_leaves_takes_nothing_of_the_server_with_it(iris_root):
    """gunicorn replaces a worker that exits; the replacement serves and every worker scrapes metrics.

    The replacement forks from the top process and follows its model set; until it has
    loaded, readiness answers 503 from it (the loop waits), then 200 from both workers.
    """
    server = two_workers(iris_root).start()
    try:
        first = booted_workers(server)[0]
        os.kill(first, signal.SIGTERM)
        while len(booted_workers(server)) < 3:
            assert server.proc is not None and server.proc.poll() is None, server.output()
            time.sleep(0.1)
        deadline = time.monotonic() + 120  # a guard against a hang, not a measure
        steady = 0
        while steady < 40:  # each a new connection: both workers answer some of them
            ready = requests.get(server.url + "/v2/health/ready", timeout=30)
            assert time.monotonic() < deadline, f"not ready again: {ready.status_code} {ready.text}"
            if ready.status_code != 200:
                steady = 0
                time.sleep(0.1)
                continue
            scrape = requests.get(server.url + "/metrics", timeout=30)
            assert scrape.status_code == 200, scrape.text
            r = requests.post(server.url + "/v1/models/iris:predict", json=IRIS, timeout=30)
            assert r.status_code == 200, r.text
            steady += 1
    finally:
        assert_left_cleanly(server)


IRIS = {"instances": [[5.1, 3.5, 1.4, 0.2]]}
