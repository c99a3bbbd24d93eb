"""Request limits: body size, gzip bodies, timeouts, backpressure, API key, hostile paths.

The middleware is tested on its own over a WSGI app that blocks on an event
(deterministic concurrency), and end to end through ``create_app``.
"""

from __future__ import annotations

import gzip
import io
import json
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor

import pytest
from hardening_models import hardening_repo
from servekit.routes import is_open_path
from servekit.server.limits import LimitsMiddleware


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return hardening_repo(tmp_path_factory.mktemp("limits"))


@pytest.fixture
def client(servekit_app, repo):
    return servekit_app(repo, max_request_size=10_000, request_log_url="off")


def _error(response) -> str:
    body = response.get_json()
    assert isinstance(body, dict) and isinstance(body.get("error"), str), response.get_data()
    return body["error"]


# -- body size and gzip ----------------------------------------------------------------


def test_body_over_the_limit_is_413_before_reading(client):
    r = client.post("/v1/models/linear:predict", data=b"x" * 10_001, content_type="application/json")
    assert r.status_code == 413
    assert "10001 bytes; the limit is 10000" in _error(r)


def test_body_without_content_length_over_the_limit_is_413(client):
    # a chunked upload: no Content-Length, the server reads until the stream ends
    r = client.post(
        "/v1/models/linear:predict",
        input_stream=io.BytesIO(b"[" * 20_000),
        content_type="application/json",
        environ_overrides={"wsgi.input_terminated": True},
    )
    assert r.status_code == 413
    _error(r)


def test_gzip_body_is_inflated(client):
    body = gzip.compress(json.dumps({"instances": [[1, 2], [0, 0]]}).encode())
    r = client.post(
        "/v1/models/linear:predict", data=body, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}
    )
    assert r.status_code == 200, r.get_data()
    assert r.get_json()["predictions"] == pytest.approx([9.0, 1.0])


def test_concatenated_gzip_members_are_one_body(client):
    text = json.dumps({"instances": [[1, 1]]}).encode()
    body = gzip.compress(text[:10]) + gzip.compress(text[10:])
    r = client.post(
        "/v1/models/linear:predict", data=body, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}
    )
    assert r.status_code == 200, r.get_data()
    assert r.get_json()["predictions"] == pytest.approx([6.0])


def test_gzip_bomb_is_413_on_the_inflated_size(client):
    bomb = gzip.compress(b" " * 5_000_000)  # ~5 KB on the wire, 5 MB inflated
    assert len(bomb) < 10_000
    r = client.post(
        "/v1/models/linear:predict", data=bomb, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}
    )
    assert r.status_code == 413
    assert "inflates to more than the limit of 10000 bytes" in _error(r)


@pytest.mark.parametrize(
    "body",
    [b"not gzip at all", gzip.compress(b'{"instances": [[1, 2]]}', mtime=0)[:-9], b""],
    ids=["not gzip", "truncated", "empty"],  # the same ids in every worker of a parallel run
)
def test_broken_gzip_is_400(client, body):
    r = client.post(
        "/v1/models/linear:predict", data=body, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}
    )
    assert r.status_code == 400
    assert "gzip" in _error(r)


def test_deflate_bodies_are_inflated_and_checked(client):
    r = client.post(
        "/v1/models/linear:predict",
        data=zlib.compress(b'{"instances": [[1.0, 2.0]]}'),
        headers={"Content-Encoding": "deflate", "Content-Type": "application/json"},
    )
    assert r.status_code == 200, r.get_json()
    r = client.post(
        "/v1/models/linear:predict",
        data=b"not deflate",
        headers={"Content-Encoding": "deflate", "Content-Type": "application/json"},
    )
    assert r.status_code == 400 and "deflate" in _error(r)


def test_unknown_content_encoding_is_415(client):
    r = client.post(
        "/v1/models/linear:predict",
        data=zlib.compress(b"{}"),
        headers={"Content-Encoding": "br", "Content-Type": "application/json"},
    )
    assert r.status_code == 415
    assert "'br'" in _error(r)


# -- the middleware on its own -------------------------------------------------------------


class Gate:
    """A WSGI app that holds every request until released."""

    def __init__(self):
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()

    def __call__(self, environ, start_response):
        self.entered.release()
        self.release.wait(10)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"done"]


def call(app, path="/v1/models/m:predict"):
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": path, "CONTENT_LENGTH": "0", "wsgi.input": io.BytesIO(b"")}
    seen = {}

    def start_response(status, headers, exc_info=None):
        seen["status"], seen["headers"] = status, dict(headers)

    body = app(environ, start_response)
    data = b"".join(body)
    getattr(body, "close", lambda: None)()
    return seen["status"], seen["headers"], data


def test_full_queue_is_429_with_retry_after_and_health_still_answers():
    gate = Gate()
    app = LimitsMiddleware(gate, max_request_size=100, request_timeout=30, max_inflight=1, max_queue=0)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(call, app)
        assert gate.entered.acquire(timeout=10)
        status, headers, data = call(app)
        assert status.startswith("429")
        assert headers["Retry-After"] == "1"
        assert "1 requests running" in json.loads(data)["error"]
        # probes bypass the queue: a busy worker still reports itself
        health = pool.submit(call, app, "/v2/health/ready")
        assert gate.entered.acquire(timeout=10)
        gate.release.set()
        assert first.result(10)[0] == "200 OK"
        assert health.result(10)[0] == "200 OK"
    assert app.running == 0
    assert call(app)[0] == "200 OK"  # the slot came back


def test_waiting_past_the_timeout_for_a_slot_is_503():
    gate = Gate()
    app = LimitsMiddleware(gate, max_request_size=100, request_timeout=0.3, max_inflight=1, max_queue=4)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(call, app)
        assert gate.entered.acquire(timeout=10)
        status, headers, data = call(app)  # waits for the slot the first one holds
        assert status.startswith("503"), status
        assert "no free slot within 0.3s" in json.loads(data)["error"]
        assert first.result(10)[0].startswith("504")  # the first one overran its own timeout
        gate.release.set()


def test_a_timed_out_call_keeps_its_slot_until_it_returns():
    gate = Gate()
    app = LimitsMiddleware(gate, max_request_size=100, request_timeout=0.2, max_inflight=1, max_queue=0)
    status, _, data = call(app)
    assert status.startswith("504")
    assert "not answered within 0.2s" in json.loads(data)["error"]
    assert app.running == 1
    assert call(app)[0].startswith("429")  # the runaway call still holds the only slot
    gate.release.set()
    for _ in range(100):
        if app.running == 0:
            break
        threading.Event().wait(0.05)
    assert app.running == 0
    gate.release.set()
    assert call(app)[0] == "200 OK"


# -- end to end: timeout, API key, hostile paths ----------------------------------------


def test_slow_model_times_out_with_504_json(servekit_app, repo):
    client = servekit_app(repo, request_timeout=0.5, request_log_url="off")
    r = client.post("/v1/models/slow:predict", json={"instances": [[2.0]]})
    assert r.status_code == 504
    assert "0.5s" in _error(r)
    r = client.post("/v1/models/slow:predict", json={"instances": [[0.0]]})
    assert r.status_code == 200
    assert r.get_json() == {"predictions": [[0.0]]}


@pytest.mark.parametrize(
    "path, expected",
    [
        ("/v2/health/ready", True),
        ("/v2/health/live", True),
        ("/metrics", True),
        ("/metrics/x", True),
        ("/metricsx", False),
        ("/", False),
        ("/v1/models/linear", False),
        ("/v2/healthz", False),
    ],
)
def test_open_path_matching(path, expected):
    assert is_open_path(path, ["/v2/health/", "/metrics"]) is expected


def test_api_key_guards_inference_but_not_open_paths(servekit_app, repo):
    client = servekit_app(repo, api_key="s3cret", open_paths=["/v2/health/", "/metrics", "/"], request_log_url="off")
    body = {"instances": [[1, 2]]}
    assert client.post("/v1/models/linear:predict", json=body).status_code == 401
    wrong = client.post("/v1/models/linear:predict", json=body, headers={"Authorization": "Bearer s3cre"})
    assert wrong.status_code == 401
    assert "API key" in _error(wrong)
    ok = client.post("/v1/models/linear:predict", json=body, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200
    for path in ("/v2/health/ready", "/metrics", "/"):
        assert client.get(path).status_code == 200, path
    assert client.get("/openapi.json").status_code == 401  # not in this --open-paths


@pytest.mark.parametrize(
    "path",
    [
        "/v1/models/..%2F..%2Fetc%2Fpasswd",
        "/v1/models/%2e%2e/metadata",
        "/v1/models/linear/labels/..%2F..%2Flinear",
        "/v2/models/..%2Flinear",
        "/v2/models/%2E%2E%2F%2E%2E%2Fetc/ready",
        "/v1/models/linear%2F..%2Fslow/metadata",
    ],
)
def test_hostile_model_paths_are_404_json_without_file_paths(client, repo, path):
    r = client.get(path)
    assert r.status_code in (404, 405), (path, r.status_code)
    message = _error(r)
    assert str(repo) not in message and "root:" not in message  # the decoded path may be echoed, no file


@pytest.mark.parametrize(
    "target",
    [
        "..:predict",
        "..%2F..%2Flinear:predict",
        "linear%2F..:predict",
        "linear/labels/..:predict",
    ],
)
def test_hostile_inference_targets_are_404_json(client, repo, target):
    r = client.post(f"/v1/models/{target}", json={"instances": [[1, 2]]})
    assert r.status_code == 404, (target, r.get_data())
    assert str(repo) not in _error(r)


def test_model_failure_is_500_with_the_message_and_no_traceback(client, repo):
    r = client.post("/v1/models/raiser:predict", json={"instances": [[1]]})
    assert r.status_code == 500
    message = _error(r)
    assert "boom: this model refuses every input" in message
    assert "Traceback" not in message and str(repo) not in message and ".py" not in message
