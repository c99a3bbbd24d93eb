"""Per-key quotas through a real two-worker server: exact across workers, 429 with the headers clients read."""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import requests
from generative_models import ECHO_MODEL_PY
from grpc_support import ECHO_MODEL
from servekit.protocols.grpc.protos.inference import grpc_service_pb2 as v2
from servekit.protocols.grpc.protos.inference import grpc_service_pb2_grpc as v2_grpc
from servekit.testing import ServerProcess

pytestmark = pytest.mark.slow

KEYS = """
# scopes  key  bounds
infer  fifty-secret  name=fifty requests_per_minute=50
infer  tokens-secret  name=few-tokens tokens_per_minute=10
infer  plain-secret
infer  grpc-secret  name=grpc-two requests_per_minute=2
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("quotas")
    (base / "echo" / "1").mkdir(parents=True)
    (base / "echo" / "1" / "model.py").write_text(ECHO_MODEL)
    (base / "chat" / "1").mkdir(parents=True)
    (base / "chat" / "1" / "model.py").write_text(ECHO_MODEL_PY)
    key_file = base.parent / "keys.txt"
    key_file.write_text(KEYS)
    with ServerProcess(base, workers=2, grpc_port="auto", api_key_file=str(key_file)) as server:
        yield server


def _infer(server: ServerProcess, key: str) -> requests.Response:
    body = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
    # a new connection each: the two workers share the requests
    return requests.post(
        server.url + "/v2/models/echo/infer", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )


def _metric(text: str, name: str, **labels: str) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    found = re.search(rf"^{re.escape(name)}{{{re.escape(wanted)}}} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def test_fifty_requests_per_minute_hold_exactly_across_two_workers(server):
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: _infer(server, "fifty-secret"), range(80)))
    statuses = [a.status_code for a in answers]
    assert (statuses.count(200), statuses.count(429)) == (50, 30)
    for answer in answers:
        assert answer.headers["RateLimit-Policy"] == '"requests";q=50;w=60'
        assert answer.headers["RateLimit"].startswith('"requests";r=')
    for refused in (a for a in answers if a.status_code == 429):
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        assert refused.headers["RateLimit"].startswith('"requests";r=0;')
        assert "fifty" in refused.json()["error"]
    assert _infer(server, "plain-secret").status_code == 200  # a key without bounds is not held
    assert "RateLimit" not in _infer(server, "plain-secret").headers
    metrics = ""
    for _ in range(50):  # the counters of both workers, by the key's name
        metrics = requests.get(server.url + "/metrics", timeout=10).text
        if _metric(metrics, "servekit_quota_requests_total", key="fifty", outcome="admitted") == 50:
            break
        time.sleep(0.1)
    assert _metric(metrics, "servekit_quota_requests_total", key="fifty", outcome="admitted") == 50
    assert _metric(metrics, "servekit_quota_requests_total", key="fifty", outcome="limited_requests") == 30
    assert "secret" not in metrics


def test_tokens_per_minute_on_openai_routes_with_openais_headers(server):
    def chat() -> requests.Response:
        body = {"model": "chat", "messages": [{"role": "user", "content": "hello there, how are you"}]}
        return requests.post(
            server.url + "/v1/chat/completions",
            data=json.dumps(body),
            headers={"Authorization": "Bearer tokens-secret", "Content-Type": "application/json"},
            timeout=30,
        )

    first = chat()
    assert first.status_code == 200, first.text
    used = first.json()["usage"]["total_tokens"]
    assert used >= 10
    assert first.headers["x-ratelimit-limit-tokens"] == "10"
    assert first.headers["x-ratelimit-remaining-tokens"] == "10"  # counted once the answer is made
    refused = chat()
    assert refused.status_code == 429
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert refused.headers["x-ratelimit-remaining-tokens"] == "0"
    assert re.fullmatch(r"\d+s|\d+m\d+s", refused.headers["x-ratelimit-reset-tokens"])
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert refused.headers["RateLimit-Policy"] == '"tokens";q=10;w=60'


def test_grpc_calls_are_held_by_the_same_bounds(server):
    request = v2.ModelInferRequest(model_name="echo")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[1])
    tensor.contents.fp32_contents.append(1.0)
    metadata = [("authorization", "Bearer grpc-secret")]
    outcomes = []
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = v2_grpc.GRPCInferenceServiceStub(channel)
        for _ in range(3):
            try:
                stub.ModelInfer(request, metadata=metadata, timeout=30)
                outcomes.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                outcomes.append(exc.code())
                trailers = dict(exc.trailing_metadata() or ())
                assert 1 <= int(trailers["retry-after"]) <= 60
                assert "grpc-two" in exc.details()
    assert outcomes == [grpc.StatusCode.OK, grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED]


def test_a_bad_bound_in_the_key_file_stops_the_start_naming_key_and_field(tmp_path):
    (tmp_path / "echo" / "1").mkdir(parents=True)
    (tmp_path / "echo" / "1" / "model.py").write_text(ECHO_MODEL)
    key_file = tmp_path / "keys.txt"
    key_file.write_text("infer good-secret\ninfer other-secret name=batch requests_per_minute=lots\n")
    server = ServerProcess(tmp_path, api_key_file=str(key_file))
    with pytest.raises(RuntimeError) as failed:
        server.start(timeout=60)
    server.stop()
    assert "line 2, key 'batch': requests_per_minute='lots' must be a positive whole number" in str(failed.value)
    assert "other-secret" not in str(failed.value)
