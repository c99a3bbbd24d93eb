"""{{ cookiecutter.model_name }} over HTTP: in-process (fast) and through the real server."""

from __future__ import annotations

import json
import urllib.request

from conftest import MODEL_NAME, PROJECT

PREDICT = f"/v1/models/{MODEL_NAME}:predict"
SAMPLE = json.loads((PROJECT / "requests" / "v1-predict.json").read_text())


def test_metadata_describes_the_input(client):
    response = client.get(f"/v1/models/{MODEL_NAME}/metadata")
    assert response.status_code == 200, response.get_json()
    inputs = response.get_json()["metadata"]["signature_def"]["signature_def"]["serving_default"]["inputs"]
    assert list(inputs) == ["input"]


def test_predict_rows(client):
    response = client.post(PREDICT, json=SAMPLE)
    assert response.status_code == 200, response.get_json()
    predictions = response.get_json()["predictions"]
    assert [p["class"] for p in predictions] == [0, 1, 2]
    assert abs(sum(predictions[0]["probabilities"]) - 1.0) < 1e-5


def test_wrong_width_is_a_clear_400(client):
    response = client.post(PREDICT, json={"instances": [[1.0, 2.0]]})
    assert response.status_code == 400
    assert "does not match the model's shape [-1, 4]" in response.get_json()["error"]


def test_served_by_gunicorn(server):
    request = urllib.request.Request(
        server.url + PREDICT, data=json.dumps(SAMPLE).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert [p["class"] for p in json.load(response)["predictions"]] == [0, 1, 2]
