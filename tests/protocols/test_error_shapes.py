"""The one error renderer: every layer answers in the shape of the route it answers."""

from __future__ import annotations

import gzip

import pytest
import requests
from servekit.testing import ServerProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    import joblib
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    root = tmp_path_factory.mktemp("models")
    (root / "iris" / "1").mkdir(parents=True)
    x, y = load_iris(return_X_y=True)
    joblib.dump(LogisticRegression(max_iter=500).fit(x, y), root / "iris" / "1" / "model.joblib")
    with ServerProcess(root, max_request_size=1000, api_key="k") as running:
        yield running


AUTH = {"Authorization": "Bearer k"}


def test_too_large_on_an_openai_route_is_openai_shaped(server):
    r = requests.post(server.url + "/v1/completions", data=b"x" * 5000, headers=AUTH, timeout=30)
    assert r.status_code == 413
    error = r.json()["error"]
    assert error["code"] == 413 and error["type"] == "invalid_request_error" and "limit is 1000" in error["message"]


def test_too_large_elsewhere_is_the_plain_shape(server):
    r = requests.post(server.url + "/v2/models/iris/infer", data=b"x" * 5000, headers=AUTH, timeout=30)
    assert r.status_code == 413 and "limit is 1000" in r.json()["error"]


def test_bad_gzip_on_an_openai_route_is_openai_shaped(server):
    headers = {**AUTH, "Content-Encoding": "gzip"}
    r = requests.post(server.url + "/v1/embeddings", data=b"not gzip", headers=headers, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_unsupported_encoding_is_415(server):
    headers = {**AUTH, "Content-Encoding": "br"}
    r = requests.post(server.url + "/v2/models/iris/infer", data=b"{}", headers=headers, timeout=30)
    assert r.status_code == 415 and "'br' is not supported" in r.json()["error"]


def test_missing_key_on_fast_and_flask_routes(server):
    body = {"instances": [[5.1, 3.5, 1.4, 0.2]]}
    fast = requests.post(server.url + "/v1/models/iris:predict", json=body, timeout=30)
    flask = requests.get(server.url + "/v1/models/iris", timeout=30)
    openai = requests.post(server.url + "/v1/embeddings", json={"model": "iris", "input": "x"}, timeout=30)
    assert fast.status_code == flask.status_code == openai.status_code == 401
    assert fast.json() == flask.json() == {"error": "missing or wrong API key; send 'Authorization: Bearer <key>'"}
    assert openai.json()["error"]["type"] == "authentication_error"
    ok = requests.post(server.url + "/v1/models/iris:predict", json=body, headers=AUTH, timeout=30)
    assert ok.status_code == 200 and ok.json() == {"predictions": [0]}


def test_gzip_body_on_the_fast_lane(server):
    raw = b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP64", "data": [5.1, 3.5, 1.4, 0.2]}]}'
    headers = {**AUTH, "Content-Encoding": "gzip"}
    r = requests.post(server.url + "/v2/models/iris/infer", data=gzip.compress(raw), headers=headers, timeout=30)
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [0]
