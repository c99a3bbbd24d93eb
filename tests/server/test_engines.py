"""The serving engines: workers sized to the CPUs, granian beside gunicorn, the fast lane beside Flask.

The protocol suites run again under granian, again with the fast lane off, and
again with every model in a batching model host (``SERVEKIT_SERVER``,
``SERVEKIT_FAST_LANE``, ``SERVEKIT_PLACEMENT`` reach every server and app those
suites start), so both engines, both paths and both placements answer the same
tests, real clients (tritonclient, tensorflow-serving-api) included.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
from repo_paths import REPO as ROOT
from servekit.server.cpus import available_cpus, cgroup_quota
from servekit.server.settings import Settings, worker_count
from servekit.testing import ServerProcess

# -- workers sized to the machine -------------------------------------------------------------


def test_cgroup_v2_quota_rounds_up(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cgroup_quota(tmp_path) == 1.5
    assert available_cpus(tmp_path) == min(2, len(os.sched_getaffinity(0)))


def test_cgroup_v2_without_quota_uses_affinity(tmp_path):
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_quota(tmp_path) is None
    assert available_cpus(tmp_path) == len(os.sched_getaffinity(0))


def test_cgroup_v1_quota(tmp_path):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("50000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_quota(tmp_path) == 0.5
    assert available_cpus(tmp_path) == 1  # never below one worker


def test_workers_auto_is_the_cpu_count_and_numbers_pass_through():
    assert worker_count(Settings()) == available_cpus()
    assert worker_count(Settings(workers="3")) == 3


@pytest.mark.slow
def test_auto_workers_follow_the_affinity_mask(tmp_path):
    """A server pinned to one CPU boots one worker, as in a container limited to one CPU."""
    from sklearn_models import fit_iris

    fit_iris(tmp_path / "iris", named=False)

    class Pinned(ServerProcess):
        def command(self) -> list[str]:
            return ["taskset", "-c", "0", *super().command()]

    with Pinned(tmp_path, workers="auto") as server:
        assert requests.get(server.url + "/v2/health/ready", timeout=10).status_code == 200
        log = server.output()
    assert log.count("Booting worker") == 1, log


# -- granian -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def granian_server(tmp_path_factory):
    from sklearn_models import fit_iris

    root = tmp_path_factory.mktemp("granian")
    fit_iris(root / "iris", named=False)
    with ServerProcess(root, server="granian", workers=2, grpc_port="auto", shutdown_delay=1.0) as running:
        yield running


IRIS_ROW = [5.1, 3.5, 1.4, 0.2]


@pytest.mark.slow
def test_granian_answers_v1_v2_and_grpc(granian_server):
    import tritonclient.grpc as grpcclient

    v1 = requests.post(granian_server.url + "/v1/models/iris:predict", json={"instances": [IRIS_ROW]}, timeout=30)
    assert v1.status_code == 200 and v1.json() == {"predictions": ["setosa"]}
    v2 = requests.post(
        granian_server.url + "/v2/models/iris/infer",
        timeout=30,
        json={"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP64", "data": IRIS_ROW}]},
    )
    assert v2.status_code == 200 and v2.json()["outputs"][0]["data"] == ["setosa"]
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{granian_server.grpc_port}")
    assert client.is_model_ready("iris")


@pytest.mark.slow
def test_granian_metrics_sum_every_worker(granian_server):
    for _ in range(20):
        requests.post(granian_server.url + "/v1/models/iris:predict", json={"instances": [IRIS_ROW]}, timeout=30)

    def counted() -> float:
        text = requests.get(granian_server.url + "/metrics", timeout=30).text
        return sum(
            float(x.rsplit(" ", 1)[1])
            for x in text.splitlines()
            if x.startswith("servekit_requests_total{") and 'protocol="v1"' in x and 'status="200"' in x
        )

    for _ in range(50):  # each worker flushes its counts every half second
        if counted() >= 20:
            break
        time.sleep(0.1)
    assert counted() >= 20


@pytest.mark.slow
# granian kills a worker that has not stopped within its grace: on a machine loaded by a parallel
# run a worker can take longer than that to drain, which is the machine's doing, not the server's
@pytest.mark.alone
def test_granian_sigterm_turns_readiness_503_first_and_loses_no_request(tmp_path):
    from sklearn_models import fit_iris

    fit_iris(tmp_path / "iris", named=False)
    server = ServerProcess(tmp_path, server="granian", workers=2, shutdown_delay=1.5, drain_seconds=20).start()
    failures: list[str] = []
    answered = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                r = requests.post(server.url + "/v1/models/iris:predict", json={"instances": [IRIS_ROW]}, timeout=30)
            except requests.ConnectionError:
                return  # the listener closed: no request was accepted and lost
            if r.status_code != 200:
                failures.append(f"{r.status_code} {r.text}")
            answered.append(r.status_code)

    threads = [threading.Thread(target=loop) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    server.proc.send_signal(signal.SIGTERM)
    # within the 1.5 s shutdown delay, readiness turns 503 (each worker is told by a signal)
    ready = requests.get(server.url + "/v2/health/ready", timeout=10)
    for _ in range(10):
        if ready.status_code == 503:
            break
        time.sleep(0.05)
        ready = requests.get(server.url + "/v2/health/ready", timeout=10)
    stop.set()
    for t in threads:
        t.join(30)
    assert server.proc.wait(30) == 0
    assert ready.status_code == 503
    assert not failures and answered
    # every worker noticed SIGTERM itself, whichever of its threads the kernel handed it to
    assert "refused to gracefully stop" not in server.output()


# -- the same suites on granian and through Flask alone ------------------------------------------

PROTOCOL_SUITES = [
    "tests/protocols/test_v1_rest.py",
    "tests/protocols/test_v2_http.py",
    "tests/protocols/grpc/test_grpc_v2.py",
    "tests/protocols/grpc/test_grpc_tf_serving.py",
    "tests/protocols/test_streaming.py",
    "tests/protocols/test_error_shapes.py",
]


#: the suites that cross the fast lane: it is a WSGI layer, which gRPC calls never pass
HTTP_SUITES = [suite for suite in PROTOCOL_SUITES if "/grpc/" not in suite]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("env", "suites"),
    [
        ({"SERVEKIT_SERVER": "granian"}, PROTOCOL_SUITES),
        ({"SERVEKIT_FAST_LANE": "0"}, HTTP_SUITES),
        # every model in a model host, batching on: the host's loop answers the real clients
        ({"SERVEKIT_PLACEMENT": "process", "SERVEKIT_MAX_BATCH_SIZE": "8"}, PROTOCOL_SUITES),
    ],
    ids=["granian", "flask-only", "model-hosts"],
)
def test_protocol_suites_pass(env, suites):
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:randomly", *suites],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


@pytest.mark.slow
def test_granian_replaces_a_worker_that_dies(tmp_path):
    from sklearn_models import fit_iris

    fit_iris(tmp_path / "iris", named=False)
    with ServerProcess(tmp_path, server="granian", workers=2) as server:
        workers = children(server.proc.pid)
        assert len(workers) == 2
        os.kill(min(workers), signal.SIGKILL)
        for _ in range(100):  # bounded wait for granian to start a replacement
            now = children(server.proc.pid)
            if len(now) == 2 and min(workers) not in now:
                break
            time.sleep(0.1)
        assert len(now) == 2 and min(workers) not in now
        for _ in range(10):
            r = requests.post(server.url + "/v1/models/iris:predict", json={"instances": [IRIS_ROW]}, timeout=30)
            assert r.status_code == 200
        assert server.proc.poll() is None


def children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                found.add(int(entry.name))
    return found
