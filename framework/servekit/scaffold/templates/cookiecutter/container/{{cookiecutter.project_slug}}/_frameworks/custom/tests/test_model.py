"""{{ cookiecutter.model_name }} over HTTP: in-process (fast) and through the real server."""

from __future__ import annotations

import json
import urllib.request

import pytest

from conftest import MODEL_NAME, PROJECT

BASE = f"/v1/models/{MODEL_NAME}"
SAMPLE = json.loads((PROJECT / "requests" / "v1-predict.json").read_text())


def test_metadata_lists_both_signatures(client):
    response = client.get(f"{BASE}/metadata")
    assert response.status_code == 200, response.get_json()
    assert set(response.get_json()["metadata"]["signature_def"]["signature_def"]) == {"serving_default", "stream"}


def test_predict(client):
    response = client.post(f"{BASE}:predict", json=SAMPLE)
    assert response.status_code == 200, response.get_json()
    assert response.get_json()["predictions"] == pytest.approx([2.5, 7.5], abs=1e-4)


def test_predict_named_features(client):
    response = client.post(f"{BASE}:predict", json={"inputs": {"f0": [1.0], "f1": [1.0], "f2": [1.0]}})
    assert response.status_code == 200, response.get_json()
    assert response.get_json()["outputs"] == pytest.approx([2.5], abs=1e-4)


def test_explain(client):
    response = client.post(f"{BASE}:explain", json={"instances": [[1.0, 1.0, 1.0]]})
    assert response.status_code == 200, response.get_json()
    explanation = response.get_json()["explanations"][0]
    assert explanation["contributions"] == pytest.approx([3.0, -2.0, 0.5], abs=1e-4)
    assert explanation["bias"] == pytest.approx(1.0, abs=1e-4)


def test_stream_sends_one_event_per_row(client):
    body = {"signature_name": "stream", "instances": SAMPLE["instances"]}
    response = client.post(f"{BASE}:predict?stream=true", json=body)
    assert response.status_code == 200
    assert response.mimetype == "text/event-stream"
    text = response.get_data(as_text=True)
    events = [json.loads(line[len("data: "):]) for line in text.splitlines() if line.startswith("data: ")]
    assert [e["predictions"] for e in events] == [pytest.approx([2.5], abs=1e-4), pytest.approx([7.5], abs=1e-4)]
    assert ": servekit-metadata " in text


def test_wrong_width_is_a_clear_400(client):
    response = client.post(f"{BASE}:predict", json={"instances": [[1.0, 2.0]]})
    assert response.status_code == 400
    assert "does not match the model's shape [-1, 3]" in response.get_json()["error"]


def test_served_by_gunicorn(server):
    request = urllib.request.Request(
        server.url + f"{BASE}:predict", data=json.dumps(SAMPLE).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert json.load(response)["predictions"] == pytest.approx([2.5, 7.5], abs=1e-4)
