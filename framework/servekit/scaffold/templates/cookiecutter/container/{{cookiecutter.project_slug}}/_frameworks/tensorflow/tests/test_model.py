"""{{ cookiecutter.model_name }} over HTTP: in-process (fast) and through the real server."""

from __future__ import annotations

import json
import urllib.request

import pytest

from conftest import MODEL_NAME, PROJECT

PREDICT = f"/v1/models/{MODEL_NAME}:predict"
SAMPLE = json.loads((PROJECT / "requests" / "v1-predict.json").read_text())


def test_metadata_comes_from_the_saved_model(client):
    response = client.get(f"/v1/models/{MODEL_NAME}/metadata")
    assert response.status_code == 200, response.get_json()
    signature = response.get_json()["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert list(signature["inputs"]) == ["x"] and list(signature["outputs"]) == ["y"]


def test_predict_rows(client):
    response = client.post(PREDICT, json=SAMPLE)
    assert response.status_code == 200, response.get_json()
    assert response.get_json()["predictions"] == pytest.approx([2.5, 1.0], abs=1e-4)


def test_predict_columns(client):
    response = client.post(PREDICT, json={"inputs": {"x": [[1.0, 1.0, 1.0]]}})
    assert response.status_code == 200, response.get_json()
    assert response.get_json()["outputs"] == pytest.approx([2.5], abs=1e-4)


def test_wrong_shape_is_a_clear_400(client):
    response = client.post(PREDICT, json={"instances": [[1.0, 2.0]]})
    assert response.status_code == 400
    assert "expected shape" in response.get_json()["error"]


def test_served_by_gunicorn(server):
    request = urllib.request.Request(
        server.url + PREDICT, data=json.dumps(SAMPLE).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert json.load(response)["predictions"] == pytest.approx([2.5, 1.0], abs=1e-4)
