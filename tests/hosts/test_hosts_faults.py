"""Model hosts under faults, on a real server: kill -9 of a host, SIGTERM, kill -9 of the server.

Each test checks the process table and ``/dev/shm`` afterwards: no host
process and no shared-memory slab of the server may be left behind.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from servekit.hosts import channel
from servekit.testing import ServerProcess

pytestmark = pytest.mark.slow

#: these servers start fresh, and so do their hosts: the tests find a host by its command line and
#: environment, as ``ps`` shows them, and a host forked from the suite's fork server
#: (tests/support/server_forks.py) shows the fork server's
FRESH = {"SERVEKIT_TEST_FORKS": "0"}

MODEL = """
import os
import time
from pathlib import Path

import numpy as np
import servekit


@servekit.hookimpl
def load(path):
    return "hosted"


@servekit.hookimpl
def predict(inputs, parameters):
    time.sleep(float(parameters.get("sleep", 0)))
    gate = parameters.get("gate")
    if gate:
        deadline = time.monotonic() + 10
        while not Path(gate).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        with open(gate + ".rows", "a") as f:
            f.write(f"{len(inputs)}\\n")
    return {"y": inputs * 2, "pid": np.full((len(inputs), 1), os.getpid())}
"""


def hosted_repo(base: Path) -> Path:
    folder = base / "models" / "hosted"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(MODEL)
    (folder / "servekit.yaml").write_text(
        "placement: process\nbatching: {max_batch_size: 32, max_batch_time_ms: 10000}\n"
    )
    return base / "models"


def predict(url: str, value: float = 1.0, **parameters: object) -> requests.Response:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [value]}], "parameters": parameters}
    return requests.post(url + "/v2/models/hosted/infer", json=body, timeout=60)


def outputs(r: requests.Response) -> dict[str, list]:
    return {o["name"]: o["data"] for o in r.json()["outputs"]}


def hosts_of(owner: int) -> dict[int, str]:
    """Model host processes of the server whose top process is ``owner``: pid -> server id."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if b"servekit.hosts.host" not in (entry / "cmdline").read_bytes():
                continue
            env = dict(line.split(b"=", 1) for line in (entry / "environ").read_bytes().split(b"\0") if b"=" in line)
        except OSError:
            continue
        if env.get(b"SERVEKIT_HOSTS_OWNER") == str(owner).encode():
            found[int(entry.name)] = env[b"SERVEKIT_HOSTS_ID"].decode()
    return found


def slabs(server_id: str) -> list[str]:
    return sorted(p.name for p in channel.SHM_DIR.glob(f"servekit-{server_id}-*"))


def wait_for(check, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.05)


def metric(url: str, name: str) -> float:
    text = requests.get(url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_every_worker_hands_requests_to_one_host_and_they_batch_together(tmp_path):
    with ServerProcess(hosted_repo(tmp_path), workers=2, threads=8, env=FRESH) as server:
        owner = server.proc.pid
        pids = {outputs(predict(server.url))["pid"][0] for _ in range(6)}
        assert set(pids) == set(hosts_of(owner)) and len(pids) == 1
        gate = str(tmp_path / "gate")
        with ThreadPoolExecutor(8) as pool:
            first = pool.submit(predict, server.url, 0.0, gate=gate)
            time.sleep(0.5)  # the first call holds the model at the gate
            rest = [pool.submit(predict, server.url, float(i), gate=gate) for i in range(1, 8)]
            time.sleep(1.0)  # every other request waits in the host's batcher
            Path(gate).touch()
            answers = [f.result() for f in [first, *rest]]
        assert [outputs(r)["y"] for r in answers] == [[2.0 * i] for i in range(8)]
        rows = [int(n) for n in Path(gate + ".rows").read_text().split()]
        assert sum(rows) == 8 and max(rows) > 1, rows
        assert metric(server.url, "servekit_host_batch_size_count") >= 2
        assert "servekit_host_queue_depth" in requests.get(server.url + "/metrics", timeout=10).text

        def stats() -> dict:
            return requests.get(server.url + "/v2/models/hosted/stats", timeout=10).json()["model_stats"][0]

        wait_for(lambda: stats()["inference_count"] >= 14)  # the host's tally flushes every half second
        time.sleep(1.0)
        counted = stats()  # each request once (by the host), not once more by the worker that handed it over
        assert counted["inference_count"] == 14 and counted["inference_stats"]["success"]["count"] == 14, counted
        assert counted["execution_count"] < 14  # the gated requests shared calls


def test_kill_9_of_a_host_fails_only_its_in_flight_requests_then_it_serves_again(tmp_path):
    with ServerProcess(hosted_repo(tmp_path), workers=2, threads=8, env=FRESH) as server:
        owner = server.proc.pid
        predict(server.url)
        ((host_pid, server_id),) = hosts_of(owner).items()
        statuses: Counter = Counter()
        errors: list[str] = []
        stop = threading.Event()

        def loop() -> None:
            while not stop.is_set():
                r = predict(server.url, sleep=0.05)
                statuses[r.status_code] += 1
                if r.status_code != 200:
                    errors.append(r.json()["error"])

        with ThreadPoolExecutor(4) as pool:
            loops = [pool.submit(loop) for _ in range(4)]
            wait_for(lambda: statuses[200] > 20)
            os.kill(host_pid, signal.SIGKILL)
            wait_for(lambda: set(hosts_of(owner)) - {host_pid})
            before = statuses[200]
            wait_for(lambda: statuses[200] > before + 20)
            stop.set()
            for f in loops:
                f.result()
        print(f"\nkill -9 of the host under 4 request loops: {dict(statuses)}")
        assert set(statuses) <= {200, 503}, errors
        assert statuses[503] <= 4, errors  # at most one in-flight request per loop
        assert all("exited while answering" in e for e in errors), errors
        (new_pid,) = hosts_of(owner)
        assert new_pid != host_pid and outputs(predict(server.url))["pid"] == [new_pid]
        assert metric(server.url, "servekit_host_restarts_total") == 1
        assert not [s for s in slabs(server_id) if s.startswith(f"servekit-{server_id}-{host_pid}-")]
    wait_for(lambda: not hosts_of(owner))
    assert not slabs(server_id)


def test_sigterm_drains_the_http_side_then_the_hosts_losing_no_accepted_request(tmp_path):
    server = ServerProcess(hosted_repo(tmp_path), workers=2, threads=6, shutdown_delay=1.0, drain_seconds=20, env=FRESH)
    server.start()
    owner = server.proc.pid
    predict(server.url)
    ((_, server_id),) = hosts_of(owner).items()
    outcomes: Counter = Counter()
    lost: list[str] = []
    ready_503 = threading.Event()

    def loop() -> None:
        while not ready_503.is_set():
            try:
                r = predict(server.url, sleep=0.02)
            except requests.ConnectionError as exc:
                if "Connection refused" in str(exc):
                    return
                lost.append(repr(exc))
                continue
            outcomes[r.status_code] += 1
            if r.status_code != 200:
                lost.append(r.text[:200])

    def watch() -> None:
        while True:
            try:
                if requests.get(server.url + "/v2/health/ready", timeout=5).status_code == 503:
                    ready_503.set()
                    return
            except requests.ConnectionError:
                ready_503.set()
                return
            time.sleep(0.02)

    with ThreadPoolExecutor(8) as pool:
        loops = [pool.submit(loop) for _ in range(4)]
        wait_for(lambda: outcomes[200] > 30)
        slow = pool.submit(predict, server.url, 3.0, sleep=2.0)  # in the host when SIGTERM comes
        time.sleep(0.3)
        watcher = pool.submit(watch)
        server.proc.send_signal(signal.SIGTERM)
        exit_code = server.proc.wait(60)
        for f in loops:
            f.result()
        watcher.result()
        slow_response = slow.result()
    print(f"\nSIGTERM with a model host: {dict(outcomes)}; slow request {slow_response.status_code}")
    assert not lost, lost[:5]
    assert slow_response.status_code == 200 and outputs(slow_response)["y"] == [6.0]
    assert exit_code == 0
    wait_for(lambda: not hosts_of(owner), timeout=10)
    assert not slabs(server_id)


def test_kill_9_of_the_server_leaves_no_host_and_no_shared_memory(tmp_path):
    server = ServerProcess(hosted_repo(tmp_path), workers=2, env=FRESH)
    server.start()
    owner = server.proc.pid
    with ThreadPoolExecutor(4) as pool:
        assert all(r.status_code == 200 for r in pool.map(lambda _: predict(server.url), range(8)))
    hosts = hosts_of(owner)
    ((_, server_id),) = hosts.items()
    assert slabs(server_id) == []  # names are removed as soon as both sides map a slab
    inflight = threading.Thread(target=lambda: _swallow(predict, server.url, sleep=5), daemon=True)
    inflight.start()
    time.sleep(0.5)
    server.proc.kill()
    server.proc.wait(10)
    wait_for(lambda: not hosts_of(owner), timeout=15)
    assert not slabs(server_id)


def _swallow(fn, *args, **kwargs) -> None:
    try:
        fn(*args, **kwargs)
    except requests.RequestException:
        pass
