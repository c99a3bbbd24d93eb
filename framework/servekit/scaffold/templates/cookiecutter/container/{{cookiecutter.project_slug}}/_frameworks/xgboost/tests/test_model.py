"""{{ cookiecutter.model_name }} over HTTP: in-process (fast) and through the real server."""

from __future__ import annotations

import json
import urllib.request

from conftest import MODEL_NAME, PROJECT

PREDICT = f"/v1/models/{MODEL_NAME}:predict"
SAMPLE = json.loads((PROJECT / "requests" / "v1-predict.json").read_text())
FEATURES = ["sepal_length", "sepal_width", "petal_length", "petal_width"]


def test_metadata_names_the_features(client):
    response = client.get(f"/v1/models/{MODEL_NAME}/metadata")
    assert response.status_code == 200, response.get_json()
    signatures = response.get_json()["metadata"]["signature_def"]["signature_def"]
    assert sorted(signatures["serving_default"]["inputs"]) == sorted(FEATURES)
    assert {"predict_proba", "predict_margin", "classification"} <= set(signatures)


def test_predict_rows_gives_class_probabilities(client):
    response = client.post(PREDICT, json=SAMPLE)
    assert response.status_code == 200, response.get_json()
    setosa, virginica = response.get_json()["predictions"]
    assert setosa.index(max(setosa)) == 0 and virginica.index(max(virginica)) == 2
    assert abs(sum(setosa) - 1.0) < 1e-5


def test_classify_names_the_classes(client):
    examples = [dict(zip(FEATURES, ([v] for v in SAMPLE["instances"][0])))]
    response = client.post(f"/v1/models/{MODEL_NAME}:classify", json={"examples": examples})
    assert response.status_code == 200, response.get_json()
    label, _ = max(response.get_json()["results"][0], key=lambda pair: pair[1])
    assert label == "setosa"


def test_explain_adds_up_to_the_margin(client):
    body = {"instances": SAMPLE["instances"][:1]}
    (explanation,) = client.post(f"/v1/models/{MODEL_NAME}:explain", json=body).get_json()["explanations"]
    margin = client.post(PREDICT, json={**body, "signature_name": "predict_margin"}).get_json()["predictions"][0]
    totals = [sum(row) + base for row, base in zip(explanation["attributions"], explanation["base_values"])]
    assert all(abs(t - m) < 1e-4 for t, m in zip(totals, margin))


def test_wrong_width_is_a_clear_400(client):
    response = client.post(PREDICT, json={"instances": [[1.0, 2.0]]})
    assert response.status_code == 400
    assert "4 features" in response.get_json()["error"]


def test_served_by_gunicorn(server):
    request = urllib.request.Request(
        server.url + PREDICT, data=json.dumps(SAMPLE).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert len(json.load(response)["predictions"]) == 2
