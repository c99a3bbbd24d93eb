"""The fault suite: a real gunicorn server (2 workers) under faults, answering correctly throughout.

Each test prints its counts (run with ``-s`` to see them).  No timing is
asserted; "fast" is reported, correctness is asserted.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from hardening_models import hardening_repo, post_huge_body, worker_pids
from servekit.testing import ServerProcess

pytestmark = pytest.mark.slow  # starts real servers or subprocesses

LINEAR = {"instances": [[1, 2], [0, 0]]}
LINEAR_ANSWER = [9.0, 1.0]


def linear_ok(response: requests.Response) -> bool:
    if response.status_code != 200:
        return False
    predictions = response.json().get("predictions")
    return predictions is not None and all(abs(a - b) < 1e-6 for a, b in zip(predictions, LINEAR_ANSWER))


def wait_for(condition, timeout: float = 60.0, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return hardening_repo(tmp_path_factory.mktemp("faults"), extra_linear=("guarded",))


@pytest.fixture(scope="module")
def server(repo):
    with ServerProcess(repo, workers=2, threads=4, poll_interval=0.3, max_request_size=1_000_000) as s:
        yield s


# -- a model that raises -----------------------------------------------------------------------


def test_a_model_that_raises_is_500_with_its_message_and_the_worker_lives_on(server):
    pids = worker_pids(server.proc.pid)
    statuses = Counter()
    with requests.Session() as http:
        for _ in range(40):
            r = http.post(server.url + "/v1/models/raiser:predict", json={"instances": [[1]]})
            statuses[r.status_code] += 1
            assert r.status_code == 500
            assert "boom: this model refuses every input" in r.json()["error"]
            assert "Traceback" not in r.text
        good = sum(linear_ok(http.post(server.url + "/v1/models/linear:predict", json=LINEAR)) for _ in range(40))
    print(f"\nraising model: {dict(statuses)}; good requests after: {good}/40; workers {sorted(pids)}")
    assert good == 40
    assert worker_pids(server.proc.pid) == pids


# -- a 100 MB body -------------------------------------------------------------------------------


def test_a_100_mb_body_is_413_at_once_and_the_server_is_fine(server):
    size = 100 * 1024 * 1024
    response, sent, seconds = post_huge_body("127.0.0.1", server.http_port, "/v1/models/linear:predict", size)
    head, _, body = response.partition(b"\r\n\r\n")
    print(
        f"\n100 MB body: answered after {sent / 1e6:.1f} MB sent, in {seconds * 1000:.0f} ms: "
        f"{head.splitlines()[0].decode() if head else 'no answer'}"
    )
    assert head.startswith(b"HTTP/1.1 413"), response[:300]
    assert b"the limit is 1000000 bytes" in body
    assert sent < size
    with requests.Session() as http:
        assert all(linear_ok(http.post(server.url + "/v1/models/linear:predict", json=LINEAR)) for _ in range(10))


# -- a corrupt new version ---------------------------------------------------------------------------


def test_a_corrupt_new_version_is_reported_and_the_previous_keeps_serving(server, repo):
    url = server.url + "/v1/models/guarded:predict"
    stop = threading.Event()
    results = Counter()

    def load():
        with requests.Session() as http:
            while not stop.is_set():
                results["ok" if linear_ok(http.post(url, json=LINEAR)) else "failed"] += 1

    staging = repo / "staging-2"
    staging.mkdir()
    (staging / "model.joblib").write_bytes(b"\x80\x04 this is not a pickle")
    with ThreadPoolExecutor(2) as pool:
        loops = [pool.submit(load) for _ in range(2)]
        wait_for(lambda: results["ok"] > 20)
        os.rename(staging, repo / "guarded" / "2")  # the new version appears whole

        def both_workers_report_v2_failed():
            # one status call reaches one worker; ask until several in a row agree
            for _ in range(6):
                status = requests.get(server.url + "/v1/models/guarded").json()["model_version_status"]
                states = {s["version"]: s for s in status}
                if states.get("2", {}).get("state") != "END" or states.get("1", {}).get("state") != "AVAILABLE":
                    return None
            return states

        states = wait_for(both_workers_report_v2_failed, timeout=60)
        before = results["ok"]
        wait_for(lambda: results["ok"] > before + 20)
        stop.set()
        for loop in loops:
            loop.result()
    error = states["2"]["status"]["error_message"]
    print(f"\ncorrupt version 2: {dict(results)} requests during the reload; reported: {error!r}")
    assert results["failed"] == 0
    assert error and str(repo) not in error
    # the version answering is still 1
    meta = requests.get(server.url + "/v1/models/guarded/metadata").json()
    assert meta["model_spec"]["version"] == "1"


# -- 10,000 fuzzed bodies ------------------------------------------------------------------------------


POST_PATHS = [
    "/v1/models/linear:predict",
    "/v1/models/linear:classify",
    "/v1/models/linear:regress",
    "/v1/models/linear:explain",
    "/v1/models/linear/versions/1:predict",
    "/v2/models/linear/infer",
    "/v2/models/linear/explain",
    "/v2/models/linear/versions/1/infer",
    "/predict",
    "/explain",
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/embeddings",
    "/openai/v1/completions",
    "/completions",
    "/chat/completions",
    "/embeddings",
    "/v2/repository/index",
]  # repository load/unload are left out: they change what is served


def fuzz_bodies(rng: random.Random, n: int) -> list[bytes]:
    def value(depth: int = 0):
        kind = rng.randrange(9 if depth < 3 else 5)
        if kind == 0:
            return rng.choice([None, True, False])
        if kind == 1:
            return rng.choice([0, -1, 2**63, -(2**70), 1e308, -1e-308, 3.5])
        if kind == 2:
            return "".join(rng.choice('ab"\\/\u00e9\u2028\x00 {}[]:,') for _ in range(rng.randrange(12)))
        if kind == 3:
            return rng.choice(["NaN", "Infinity", "-Infinity", "b64", "FP32", "BYTES"])
        if kind == 4:
            return rng.random() * rng.choice([1, 1e10, -1e-10])
        if kind in (5, 6):
            return [value(depth + 1) for _ in range(rng.randrange(4))]
        keys = [
            "instances",
            "inputs",
            "examples",
            "signature_name",
            "outputs",
            "parameters",
            "model",
            "messages",
            "prompt",
            "input",
            "stream",
            "name",
            "shape",
            "datatype",
            "data",
            "context",
            "n",
        ]
        return {rng.choice(keys): value(depth + 1) for _ in range(rng.randrange(4))}

    bodies = []
    for _ in range(n):
        kind = rng.randrange(6)
        if kind == 0:
            bodies.append(bytes(rng.randrange(256) for _ in range(rng.randrange(64))))
        elif kind == 1:
            text = json.dumps(value())
            bodies.append(text[: rng.randrange(len(text) + 1)].encode())  # cut anywhere
        elif kind == 2:
            bodies.append(json.dumps({"instances": value()}).encode())
        elif kind == 3:
            bodies.append(
                json.dumps({"inputs": [{"name": "x", "shape": value(), "datatype": value(), "data": value()}]}).encode()
            )
        else:
            bodies.append(json.dumps(value()).encode())
    return bodies


def test_10000_fuzzed_bodies_get_4xx_json_and_the_server_answers_correctly_after(server):
    rng = random.Random(20260808)
    bodies = fuzz_bodies(rng, 10_000)
    jobs = [(POST_PATHS[i % len(POST_PATHS)], body) for i, body in enumerate(bodies)]
    statuses: Counter = Counter()
    accepted: Counter = Counter()  # endpoints that took a fuzzed body as valid
    bad: list[str] = []
    lock = threading.Lock()

    def run(chunk):
        with requests.Session() as http:
            for path, body in chunk:
                r = http.post(server.url + path, data=body, headers={"Content-Type": "application/json"})
                try:
                    doc = r.json()
                    is_json = True
                except ValueError:
                    doc, is_json = None, False
                with lock:
                    statuses[r.status_code] += 1
                    if r.status_code < 300:
                        accepted[path] += 1
                    fine = (200 <= r.status_code < 300 and is_json) or (
                        400 <= r.status_code < 500 and is_json and isinstance(doc, dict) and "error" in doc
                    )
                    if not fine and len(bad) < 10:
                        bad.append(f"{path} {body[:80]!r} -> {r.status_code} {r.text[:200]}")

    started = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(run, [jobs[i::4] for i in range(4)]))
    seconds = time.perf_counter() - started
    by_class = Counter(f"{s // 100}xx" for s in statuses.elements())
    print(
        f"\nfuzz: {len(jobs)} bodies over {len(POST_PATHS)} POST endpoints in {seconds:.1f}s: "
        f"{dict(sorted(by_class.items()))}, by status {dict(sorted(statuses.items()))}; "
        f"taken as valid: {dict(accepted)}"
    )
    assert not bad, "\n".join(bad)
    assert sum(statuses.values()) == len(jobs)
    assert by_class["5xx"] == 0
    # only the repository index takes any JSON object; every inference endpoint refused every body
    assert set(accepted) <= {"/v2/repository/index"}
    with requests.Session() as http:
        assert all(linear_ok(http.post(server.url + "/v1/models/linear:predict", json=LINEAR)) for _ in range(20))


# -- killing a worker mid-load ------------------------------------------------------------------------


def test_killing_a_worker_mid_load_gunicorn_replaces_it_and_requests_keep_succeeding(server):
    pids = worker_pids(server.proc.pid)
    assert len(pids) == 2
    victim = min(pids)
    stop = threading.Event()
    results: Counter = Counter()
    after_replacement = Counter()
    replaced = threading.Event()

    def load():
        with requests.Session() as http:
            while not stop.is_set():
                try:
                    ok = linear_ok(http.post(server.url + "/v1/models/linear:predict", json=LINEAR, timeout=30))
                except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError):
                    ok = False  # in flight in the killed worker: cut before or during its answer
                key = "ok" if ok else "failed"
                results[key] += 1
                if replaced.is_set():
                    after_replacement[key] += 1

    with ThreadPoolExecutor(3) as pool:
        loops = [pool.submit(load) for _ in range(3)]
        wait_for(lambda: results["ok"] > 30)
        os.kill(victim, signal.SIGKILL)
        new = wait_for(lambda: (worker_pids(server.proc.pid) - pids) or None, timeout=60)
        wait_for(lambda: requests.get(server.url + "/v2/health/ready").status_code == 200)
        replaced.set()
        wait_for(lambda: after_replacement["ok"] >= 200, timeout=120)
        stop.set()
        for loop in loops:
            loop.result()
    print(
        f"\nkilled worker {victim}; replaced by {sorted(new)}; requests: {dict(results)}; "
        f"after the replacement: {dict(after_replacement)}"
    )
    assert victim not in worker_pids(server.proc.pid)
    assert len(worker_pids(server.proc.pid)) == 2
    assert after_replacement["failed"] == 0


# -- SIGTERM under a request loop ----------------------------------------------------------------------


def test_sigterm_under_a_request_loop_loses_no_accepted_request(tmp_path):
    repo = hardening_repo(tmp_path)
    server = ServerProcess(repo, workers=2, threads=6, shutdown_delay=1.5, drain_seconds=20)
    server.start()
    url = server.url
    outcomes: Counter = Counter()
    lost: list[str] = []
    ready_503 = threading.Event()
    stop = threading.Event()
    sigterm_at: list[float] = []

    def record(kind: str, detail: str = "") -> None:
        outcomes[kind] += 1
        if kind == "lost":
            lost.append(detail)

    def request_loop():
        # like a load balancer: new requests go out until readiness says 503
        while not stop.is_set() and not ready_503.is_set():
            try:
                r = requests.post(url + "/v1/models/linear:predict", json=LINEAR, timeout=30)
            except requests.ConnectionError as exc:
                if "Connection refused" in str(exc):
                    record("refused")  # never accepted: nothing to lose
                    break
                record("lost", repr(exc))
                continue
            if linear_ok(r):
                record("ok_after_sigterm" if sigterm_at else "ok")
            else:
                record("lost", f"{r.status_code} {r.text[:100]}")

    def watch_readiness():
        while not stop.is_set():
            try:
                if requests.get(url + "/v2/health/ready", timeout=5).status_code == 503:
                    ready_503.set()
                    return
            except requests.ConnectionError:
                return
            time.sleep(0.02)

    def slow_request():
        return requests.post(url + "/v1/models/slow:predict", json={"instances": [[3.0]]}, timeout=60)

    def stream():
        r = requests.post(
            url + "/v1/models/ticker:predict?stream=true", json={"instances": [[6, 0.5]]}, stream=True, timeout=60
        )
        return r.status_code, r.content.decode()

    with ThreadPoolExecutor(8) as pool:
        loops = [pool.submit(request_loop) for _ in range(4)]
        wait_for(lambda: outcomes["ok"] > 40)
        slow = pool.submit(slow_request)
        streamed = pool.submit(stream)
        time.sleep(0.3)  # both in flight
        watcher = pool.submit(watch_readiness)
        sigterm_at.append(time.monotonic())
        server.proc.send_signal(signal.SIGTERM)
        exit_code = server.proc.wait(60)
        exited_after = time.monotonic() - sigterm_at[0]
        stop.set()
        for loop in loops:
            loop.result()
        watcher.result()
        slow_response = slow.result()
        stream_status, stream_text = streamed.result()

    events = [line for line in stream_text.splitlines() if line.startswith("data:")]
    print(
        f"\nSIGTERM: {dict(outcomes)}; readiness turned 503: {ready_503.is_set()}; slow request "
        f"{slow_response.status_code}; stream {stream_status} with {len(events)} events; "
        f"exit code {exit_code} after {exited_after:.1f}s"
    )
    assert not lost, lost[:5]
    assert ready_503.is_set()
    assert slow_response.status_code == 200 and slow_response.json() == {"predictions": [[6.0]]}
    assert stream_status == 200 and len(events) == 6
    assert ": servekit-metadata" in stream_text
    assert exit_code == 0
