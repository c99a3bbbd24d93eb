"""Canary splits and shadow traffic on a real server: weights, sticky clients, the request log, reloads,
and the shadow process (its priority, a replaced candidate, its end with its worker's)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from servekit.testing import ServerProcess
from sklearn_models import SCALING_MODEL

pytestmark = pytest.mark.slow

#: a shadow process computes only on CPU time nothing else wants (SCHED_IDLE): on a machine a
#: parallel run keeps busy, its start and its copies wait for minutes, which is its purpose
needs_idle_cpu = pytest.mark.alone


SPLIT = "version_policy: all\ntraffic:\n  weights: {1: 50, 2: 50}\n  sticky: x-user\n"
SHADOWED = (
    "version_policy: all\nlabels: {stable: 1}\ntraffic:\n  weights: {1: 1}\nshadow:\n  target: 2\n  fraction: 1.0\n"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("models")
    for name, settings in (("split", SPLIT), ("shadowed", SHADOWED), ("reloaded", SHADOWED), ("many", SHADOWED)):
        for version in (1, 2):
            folder = base / name / str(version)
            folder.mkdir(parents=True)
            (folder / "model.py").write_text(SCALING_MODEL.replace("FACTOR", str(version * 10)))
        (base / name / "servekit.yaml").write_text(settings)
    with ServerProcess(base, workers=1, threads=8, request_log_url="sqlite") as running:
        running.base = base
        yield running


def infer(server: ServerProcess, model: str, value: float = 1.0, **headers: str) -> requests.Response:
    body = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [value]}]}
    r = requests.post(f"{server.url}/v2/models/{model}/infer", json=body, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    return r


def wait_until(condition) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, "the server never got there"
        time.sleep(0.1)


def test_a_split_sends_a_sticky_client_to_one_version_and_counts_each_version_on_metrics(server):
    for user in ("ada", "grace", "edsger", "barbara"):
        versions = {infer(server, "split", **{"X-User": user}).json()["model_version"] for _ in range(5)}
        assert len(versions) == 1, f"{user} moved between versions {versions}"
    seen = {infer(server, "split", **{"X-User": f"user-{i}"}).json()["model_version"] for i in range(40)}
    assert seen == {"1", "2"}
    answered = infer(server, "split", **{"X-User": "ada"}).json()
    assert answered["outputs"][0]["data"] == [10.0 * int(answered["model_version"])]
    text = requests.get(server.url + "/metrics", timeout=30).text
    counts = {
        target: sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("servekit_traffic_requests_total{")
            and f'target="{target}"' in line
            and 'model="split"' in line
        )
        for target in ("1", "2")
    }
    assert counts["1"] + counts["2"] == 4 * 5 + 40 + 1 and min(counts.values()) > 0
    assert 'servekit_traffic_duration_seconds_count{model="split",target="2"}' in text
    # a request that names its version is not split
    assert (
        requests.post(
            f"{server.url}/v2/models/split/versions/1/infer",
            json={"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]},
            timeout=30,
        ).json()["model_version"]
        == "1"
    )


def shadows(server: ServerProcess, model: str) -> list[dict]:
    """The shadow answers the request log holds for ``model``'s version 2."""
    r = requests.get(
        f"{server.url}/v1/logs/requests", params={"model": model, "version": "2", "limit": 10000}, timeout=30
    )
    return [record for record in r.json()["requests"] if record["protocol"] == "shadow"]


def concurrent_copies(server: ServerProcess, model: str, count: int) -> tuple[dict[str, int], list[dict]]:
    """``count`` requests from 8 clients at once (the i-th sends i): each served one's request log
    id with its i, and the shadow records, once as many are in the log."""
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: infer(server, model, value=float(i)), range(count)))
    served = {r.headers["X-Request-Log-Id"]: i for i, r in enumerate(answers)}
    wait_until(lambda: len(shadows(server, model)) >= count)
    return served, shadows(server, model)


def dropped(server: ServerProcess, model: str) -> float:
    text = requests.get(server.url + "/metrics", timeout=30).text
    prefix = f'servekit_shadow_dropped_total{{model="{model}"}}'
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


@needs_idle_cpu
def test_with_shadow_at_100_percent_every_shadow_answer_is_in_the_request_log_beside_the_served_one(server):
    served = []
    for i in range(20):
        r = infer(server, "shadowed", value=float(i))
        assert r.json()["model_version"] == "1" and r.json()["outputs"][0]["data"] == [10.0 * i]  # never the shadow's
        served.append(r.headers["X-Request-Log-Id"])

    wait_until(lambda: len(shadows(server, "shadowed")) >= 20)
    found = {record["requestId"]: record["response"] for record in shadows(server, "shadowed")}
    assert set(served) <= set(found)
    for i, rid in enumerate(served):
        logged = found[rid]
        assert logged["shadow_of"] == rid
        assert logged["served"]["output_0"] == [[10.0 * i]] and logged["shadow"]["output_0"] == [[20.0 * i]]
        assert logged["difference"] == pytest.approx(10.0 * i)


def test_a_changed_split_takes_effect_without_a_restart_and_a_bad_one_is_named_while_serving_goes_on(server):
    settings = server.base / "split" / "servekit.yaml"
    settings.write_text("version_policy: all\ntraffic:\n  weights: {2: 1}\n")
    wait_until(lambda: all(infer(server, "split").json()["model_version"] == "2" for _ in range(10)))
    settings.write_text("version_policy: all\ntraffic:\n  weights: {2: -5}\n")

    def named() -> bool:  # the reload fails, in the server's log, and the loaded version keeps serving
        with open(server.log.name, encoding="utf-8", errors="replace") as log:
            return "'traffic.weights.2' must be a number from 0, found -5" in log.read()

    wait_until(named)
    assert infer(server, "split").status_code == 200


@needs_idle_cpu
def test_every_shadow_answer_of_concurrent_requests_reaches_the_log_with_its_difference(server):
    """8 clients at once, 400 requests: none of the copies is dropped, each is logged once, beside its own."""
    served, records = concurrent_copies(server, "many", 400)
    assert len(records) == 400 and {record["requestId"] for record in records} == set(served)
    for record in records:
        i = served[record["requestId"]]
        assert record["status"] == 200 and record["path"] == "/shadow/many" and record["method"] == "SHADOW"
        assert record["response"]["shadow"]["output_0"] == [[20.0 * i]]
        assert record["response"]["difference"] == pytest.approx(10.0 * i)
    assert dropped(server, "many") == 0


def children(pid: int) -> dict[int, bytes]:
    """The processes whose parent is ``pid``, with their command lines."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                found[int(stat.parent.name)] = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
    return found


def workers(server: ServerProcess) -> list[int]:
    assert server.proc is not None
    own = children(server.proc.pid)
    master = Path(f"/proc/{server.proc.pid}/cmdline").read_bytes()
    return [pid for pid, line in own.items() if line == master]


def shadow_process(worker: int) -> int:
    """The shadow process of ``worker`` (waits for it to appear)."""

    def found() -> list[int]:
        return [pid for pid, line in children(worker).items() if b"servekit.hosts.shadow" in line]

    wait_until(found)
    (pid,) = found()
    return pid


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def idle_allowed() -> bool:
    """Whether this machine lets a process put itself at SCHED_IDLE (a container may refuse)."""
    probe = "import os; os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


@needs_idle_cpu
def test_the_shadow_process_runs_at_idle_priority_every_thread_of_it(server):
    # it starts and loads its first candidate at its worker's priority, then goes idle for good
    served = infer(server, "shadowed").headers["X-Request-Log-Id"]
    wait_until(lambda: any(r["requestId"] == served for r in shadows(server, "shadowed")))
    (worker,) = workers(server)
    pid = shadow_process(worker)
    threads = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
    assert len(threads) > 1  # the request log's shipper among them
    if idle_allowed():
        assert {os.sched_getscheduler(t) for t in threads} == {os.SCHED_IDLE}
        policy = next(line for line in Path(f"/proc/{pid}/sched").read_text().splitlines() if line.startswith("policy"))
        assert int(policy.split(":")[1]) == os.SCHED_IDLE
    else:
        assert {os.getpriority(os.PRIO_PROCESS, t) for t in threads} == {19}
    assert os.sched_getscheduler(worker) != os.SCHED_IDLE  # the worker serves at its own priority


@needs_idle_cpu
def test_a_candidate_version_replaced_in_the_worker_is_loaded_anew_by_the_shadow_process(server):
    first = infer(server, "reloaded", value=1.0).headers["X-Request-Log-Id"]
    wait_until(lambda: any(r["requestId"] == first for r in shadows(server, "reloaded")))
    # new settings reload the model's versions, version 2 with its new model.py: a new candidate
    (server.base / "reloaded" / "2" / "model.py").write_text(SCALING_MODEL.replace("FACTOR", "30"))
    (server.base / "reloaded" / "servekit.yaml").write_text(SHADOWED + "concurrency: 8\n")
    body = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}

    def replaced() -> bool:
        r = requests.post(f"{server.url}/v2/models/reloaded/versions/2/infer", json=body, timeout=30)
        return r.status_code == 200 and r.json()["outputs"][0]["data"] == [30.0]

    wait_until(replaced)
    after = infer(server, "reloaded", value=2.0).headers["X-Request-Log-Id"]
    wait_until(lambda: any(r["requestId"] == after for r in shadows(server, "reloaded")))
    found = {r["requestId"]: r["response"] for r in shadows(server, "reloaded")}
    assert found[first]["shadow"]["output_0"] == [[20.0]]
    assert found[after]["shadow"]["output_0"] == [[60.0]] and found[after]["difference"] == pytest.approx(40.0)


#: the candidate of the kill test: an input of 1000 or more keeps its predict busy for ten minutes
STUCK_CANDIDATE = """
import time
from pathlib import Path

import servekit


@servekit.hookimpl
def load(path):
    return 20


@servekit.hookimpl
def predict(model, inputs):
    if float(inputs.max()) >= 1000:
        Path(MARKER).touch()
        time.sleep(600)
    return inputs * model
"""


@needs_idle_cpu
def test_a_worker_killed_with_sigkill_takes_its_shadow_process_with_it_and_so_does_a_clean_stop(tmp_path):
    base = tmp_path / "models"
    stuck = tmp_path / "stuck"
    for number in (1, 2):
        (base / "shadowed" / str(number)).mkdir(parents=True)
    (base / "shadowed" / "1" / "model.py").write_text(SCALING_MODEL.replace("FACTOR", "10"))
    (base / "shadowed" / "2" / "model.py").write_text(STUCK_CANDIDATE.replace("MARKER", repr(str(stuck))))
    (base / "shadowed" / "servekit.yaml").write_text(SHADOWED)
    with ServerProcess(base, workers=1, request_log_url="sqlite") as running_server:
        rid = infer(running_server, "shadowed").headers["X-Request-Log-Id"]
        wait_until(lambda: any(r["requestId"] == rid for r in shadows(running_server, "shadowed")))
        (worker,) = workers(running_server)
        first = shadow_process(worker)
        infer(running_server, "shadowed", value=1000.0)  # its copy never ends on its own
        wait_until(stuck.exists)
        os.kill(worker, signal.SIGKILL)
        wait_until(lambda: not running(first))  # within its 10 s grace, stuck as it is
        running_server.wait_ready()
        infer(running_server, "shadowed")  # the worker that replaced it starts its own
        (replacement,) = workers(running_server)
        second = shadow_process(replacement)
        assert second != first
        rid = infer(running_server, "shadowed", value=3.0).headers["X-Request-Log-Id"]
        wait_until(lambda: any(r["requestId"] == rid for r in shadows(running_server, "shadowed")))
    assert not running(second)  # the server's stop ended its worker, and the worker its shadow process


@needs_idle_cpu
def test_two_workers_each_copy_through_a_shadow_process_of_their_own_into_one_request_log(tmp_path):
    """Two workers: copies from both reach the one store, each once; each worker has its own process."""
    for version in (1, 2):
        folder = tmp_path / "many" / str(version)
        folder.mkdir(parents=True)
        (folder / "model.py").write_text(SCALING_MODEL.replace("FACTOR", str(version * 10)))
    (tmp_path / "many" / "servekit.yaml").write_text(SHADOWED)
    with ServerProcess(tmp_path, workers=2, threads=8, request_log_url="sqlite") as two:
        served, records = concurrent_copies(two, "many", 200)
        assert len(records) == 200 and {record["requestId"] for record in records} == set(served)
        for record in records:
            assert record["response"]["shadow"]["output_0"] == [[20.0 * served[record["requestId"]]]]
        both = workers(two)
        assert len(both) == 2
        with_copies = [w for w in both if any(b"servekit.hosts.shadow" in line for line in children(w).values())]
        # 8 clients at once reach both workers (in three runs, always both)
        assert len(with_copies) == 2 and len({shadow_process(w) for w in with_copies}) == 2
