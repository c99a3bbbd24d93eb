"""{{ cookiecutter.model_name }} over HTTP: in-process (fast) and through the real server."""

from __future__ import annotations

import json
import urllib.request

from conftest import MODEL_NAME, PROJECT

PREDICT = f"/v1/models/{MODEL_NAME}:predict"
SAMPLE = json.loads((PROJECT / "requests" / "v1-predict.json").read_text())


def test_metadata_describes_the_text_input(client):
    response = client.get(f"/v1/models/{MODEL_NAME}/metadata")
    assert response.status_code == 200, response.get_json()
    inputs = response.get_json()["metadata"]["signature_def"]["signature_def"]["serving_default"]["inputs"]
    assert list(inputs) == ["text"]


def test_predict_rows(client):
    response = client.post(PREDICT, json=SAMPLE)
    assert response.status_code == 200, response.get_json()
    predictions = response.get_json()["predictions"]
    assert [p["label"] for p in predictions] == ["positive", "negative"]
    assert all(0.5 < p["score"] <= 1.0 for p in predictions)


def test_numbers_are_a_clear_400(client):
    response = client.post(PREDICT, json={"instances": [1.0, 2.0]})
    assert response.status_code == 400
    assert "expected strings" in response.get_json()["error"]


def test_openai_embeddings(client):
    body = json.loads((PROJECT / "requests" / "openai-embeddings.json").read_text())
    response = client.post("/v1/embeddings", json=body)
    assert response.status_code == 200, response.get_json()
    data = response.get_json()["data"]
    assert [d["index"] for d in data] == [0, 1]
    assert len(data[0]["embedding"]) == 32 and data[0]["embedding"] != data[1]["embedding"]


def test_served_by_gunicorn(server):
    request = urllib.request.Request(
        server.url + PREDICT, data=json.dumps(SAMPLE).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert [p["label"] for p in json.load(response)["predictions"]] == ["positive", "negative"]
