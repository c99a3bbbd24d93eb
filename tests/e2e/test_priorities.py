"""Priorities, queue policy and cancellation on a real server: a busy model, a queue behind it."""

from __future__ import annotations

import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
from servekit.testing import ServerProcess

pytestmark = pytest.mark.slow

#: counts its calls and answers each call's number; the first call waits for a file (a busy model)
COUNTING_MODEL = """
import os
import pathlib
import threading
import time

import numpy as np
import servekit

markers = pathlib.Path(os.environ["PRIORITY_TEST_MARKERS"])
lock = threading.Lock()
calls = [0]


@servekit.hookimpl
def load(path):
    return "counting"


@servekit.hookimpl
def predict(inputs):
    with lock:
        calls[0] += 1
        number = calls[0]
    if number == 1:
        (markers / "MODEL-busy").touch()
        while not (markers / "MODEL-release").exists():
            time.sleep(0.01)
    return np.array([[number]])
"""

QUEUED = "queue:\n  priority_levels: 3\n  default_priority_level: 3\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("models")
    markers = tmp_path_factory.mktemp("markers")
    models = {
        "queued": QUEUED,
        "grpc_queued": QUEUED,
        "plain": "concurrency: 0\n",
        "batched": QUEUED + "batching:\n  max_batch_size: 4\n",
        "broken": "queue:\n  priority_levels: many\n",
    }
    for name, settings in models.items():
        (base / name).mkdir()
        model = COUNTING_MODEL.replace("MODEL", name)
        (base / name / "model.py").write_text(
            model if name not in ("plain", "batched") else model.replace("== 1", "== 0")
        )
        (base / name / "servekit.yaml").write_text(settings)
    env = {"PRIORITY_TEST_MARKERS": str(markers)}
    with ServerProcess(base, workers=1, threads=128, grpc_port="auto", strict_readiness=False, env=env) as running:
        running.markers = markers
        yield running


def metric(server: ServerProcess, name: str, **labels: str) -> float:
    text = requests.get(server.url + "/metrics", timeout=30).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_until(condition) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, "the server never got there"
        time.sleep(0.05)


def v1(server: ServerProcess, model: str, **headers: str) -> requests.Response:
    return requests.post(
        f"{server.url}/v1/models/{model}:predict", json={"instances": [[1.0]]}, headers=headers, timeout=120
    )


def test_a_high_priority_request_is_answered_before_100_queued_low_priority_ones_and_a_gone_client_costs_no_call(
    server,
):
    pool = ThreadPoolExecutor(110)
    busy = pool.submit(v1, server, "queued")
    wait_until((server.markers / "queued-busy").exists)  # the model is computing call 1 and holds its one place
    low = [pool.submit(v1, server, "queued", **{"Servekit-Priority": "3"}) for _ in range(100)]
    wait_until(lambda: metric(server, "servekit_queue_pending", model="queued") == 100)
    # a client that leaves while queued
    body = b'{"instances": [[1.0]]}'
    gone = socket.create_connection(("127.0.0.1", server.http_port))
    gone.sendall(
        b"POST /v1/models/queued:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Servekit-Priority: 1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    wait_until(lambda: metric(server, "servekit_queue_pending", model="queued") == 101)
    gone.close()
    wait_until(lambda: metric(server, "servekit_queue_cancelled_total", model="queued", reason="disconnected") == 1)
    late = pool.submit(v1, server, "queued", **{"Servekit-Timeout-Ms": "1"})  # its timeout passes in the queue
    high = pool.submit(
        requests.post,
        f"{server.url}/v2/models/queued/infer",
        json={
            "inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}],
            "parameters": {"priority": 1},
        },
        timeout=120,
    )
    wait_until(lambda: metric(server, "servekit_queue_pending", model="queued") == 101)
    (server.markers / "queued-release").touch()
    assert busy.result().json()["predictions"] == [[1]]
    answer = high.result()
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["data"] == [2]  # the model's second call: before all 100
    numbers = sorted(f.result().json()["predictions"][0][0] for f in low)
    assert numbers == list(range(3, 103))  # the client that left never got a call
    refused = late.result()
    assert refused.status_code == 504 and "queue timeout" in refused.json()["error"], refused.text
    assert metric(server, "servekit_queue_cancelled_total", model="queued", reason="timeout") == 1
    assert v1(server, "queued").json()["predictions"] == [[103]]
    pool.shutdown()


def test_a_grpc_call_cancelled_while_queued_costs_no_model_call(server):
    grpcclient = pytest.importorskip("tritonclient.grpc")
    pool = ThreadPoolExecutor(2)
    busy = pool.submit(v1, server, "grpc_queued")
    wait_until((server.markers / "grpc_queued-busy").exists)
    x = grpcclient.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.ones((1, 1), dtype=np.float32))
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        cancelled = threading.Event()
        call = client.async_infer("grpc_queued", [x], callback=lambda result, error: cancelled.set(), priority=1)
        wait_until(lambda: metric(server, "servekit_queue_pending", model="grpc_queued") == 1)
        call.cancel()
        wait_until(
            lambda: metric(server, "servekit_queue_cancelled_total", model="grpc_queued", reason="disconnected") == 1
        )
        (server.markers / "grpc_queued-release").touch()
        assert busy.result().json()["predictions"] == [[1]]
        assert client.infer("grpc_queued", [x]).as_numpy("output_0").tolist() == [[2]]  # no call for the cancelled one
    pool.shutdown()


def test_a_batching_model_with_a_queue_takes_priorities_in_front_of_its_batcher(server):
    infer = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}
    with ThreadPoolExecutor(8) as pool:
        answers = list(
            pool.map(
                lambda i: requests.post(
                    f"{server.url}/v2/models/batched/infer",
                    json={**infer, "parameters": {"priority": 1 + i % 3, "timeout": 60_000_000}},
                    timeout=60,
                ),
                range(8),
            )
        )
    assert [a.status_code for a in answers] == [200] * 8, [a.text for a in answers]


def test_priority_and_timeout_are_refused_naming_them_where_nothing_can_honour_them(server):
    infer = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}
    r = requests.post(f"{server.url}/v2/models/plain/infer", json={**infer, "parameters": {"priority": 1}}, timeout=30)
    assert r.status_code == 400 and "'priority'" in r.json()["error"] and "no queue" in r.json()["error"]
    r = requests.post(f"{server.url}/v2/models/queued/infer", json={**infer, "parameters": {"priority": 4}}, timeout=30)
    assert r.status_code == 400 and "priority levels 1 to 3" in r.json()["error"]
    r = requests.post(
        f"{server.url}/v2/models/queued/infer", json={**infer, "parameters": {"timeout": "soon"}}, timeout=30
    )
    assert r.status_code == 400 and "'timeout'" in r.json()["error"]
    r = v1(server, "queued", **{"Servekit-Priority": "high"})
    assert r.status_code == 400 and "Servekit-Priority" in r.json()["error"]
    r = v1(server, "plain", **{"Servekit-Timeout-Ms": "100"})
    assert r.status_code == 400 and "Servekit-Timeout-Ms" in r.json()["error"] and "no queue" in r.json()["error"]


def test_a_bad_queue_setting_fails_that_model_naming_the_key_and_the_server_keeps_serving(server):
    r = requests.get(f"{server.url}/v2/models/broken/ready", timeout=30)
    assert r.status_code != 200
    status = requests.get(f"{server.url}/v1/models/broken", timeout=30).text
    assert re.search(r"queue\.priority_levels", status), status
    assert v1(server, "plain").status_code == 200
