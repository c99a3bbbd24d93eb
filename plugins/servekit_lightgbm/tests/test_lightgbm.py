"""The LightGBM plugin in-process: artifacts and layouts, signatures, metadata, explanations, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

lgb = pytest.importorskip("lightgbm")
from framework_models import FEATURES, data, save_lightgbm

ROWS = data()[0][:5]


def predict(client, name, rows, **body):
    return client.post(f"/v1/models/{name}:predict", json={"instances": rows.tolist(), **body})


@pytest.mark.parametrize("artifact", ["model.txt", "model.bst"])
def test_every_artifact_answers_as_the_booster(tmp_path, servekit_app, artifact):
    file = save_lightgbm(tmp_path / "m" / "1", artifact)
    booster = lgb.Booster(model_file=str(file))
    client = servekit_app(tmp_path)
    got = predict(client, "m", ROWS).get_json()["predictions"]
    assert got == booster.predict(ROWS).tolist()


def test_signatures_probabilities_raw_score_and_classify(tmp_path, servekit_app):
    file = save_lightgbm(tmp_path / "m" / "1")
    booster = lgb.Booster(model_file=str(file))
    client = servekit_app(tmp_path)
    p = booster.predict(ROWS)
    proba = predict(client, "m", ROWS, signature_name="predict_proba").get_json()["predictions"]
    assert proba == np.column_stack([1 - p, p]).tolist()
    raw = predict(client, "m", ROWS, signature_name="predict_raw").get_json()["predictions"]
    assert raw == booster.predict(ROWS, raw_score=True).tolist()
    r = client.post("/v1/models/m:classify", json={"examples": [{"x": ROWS[0].tolist()}]})
    (pairs,) = r.get_json()["results"]
    assert [label for label, _ in pairs] == ["0", "1"] and np.isclose(pairs[1][1], p[0])
    r = predict(client, "m", ROWS, signature_name="nope")
    assert r.status_code == 400 and "predict_raw" in r.get_json()["error"]


def test_metadata_names_the_features_and_classes(tmp_path, servekit_app):
    file = save_lightgbm(tmp_path / "m" / "1", objective="multiclass", named=True)
    (tmp_path / "m" / "servekit.yaml").write_text("options: {classes: [low, mid, high]}\n")
    booster = lgb.Booster(model_file=str(file))
    client = servekit_app(tmp_path)
    meta = client.get("/v2/models/m").get_json()
    assert [i["name"] for i in meta["inputs"]] == FEATURES and meta["inputs"][0]["datatype"] == "FP64"
    assert meta["outputs"] == [{"name": "predict", "datatype": "FP64", "shape": [-1, 3]}]
    assert meta["platform"] == "lightgbm"
    r = client.post("/v1/models/m:predict", json={"instances": [dict(zip(FEATURES, row)) for row in ROWS.tolist()]})
    assert r.get_json()["predictions"] == booster.predict(ROWS).tolist()
    r = client.post("/v1/models/m:classify", json={"examples": [dict(zip(FEATURES, ([v] for v in ROWS[0])))]})
    assert [label for label, _ in r.get_json()["results"][0]] == ["low", "mid", "high"]


def test_unnamed_features_take_one_tensor_of_rows(tmp_path, servekit_app):
    save_lightgbm(tmp_path / "m" / "1", objective="regression")
    client = servekit_app(tmp_path)
    meta = client.get("/v2/models/m").get_json()
    assert meta["inputs"] == [{"name": "input", "datatype": "FP64", "shape": [-1, 4]}]
    r = client.post("/v1/models/m:regress", json={"examples": [{"x": row.tolist()} for row in ROWS[:2]]})
    assert len(r.get_json()["results"]) == 2


@pytest.mark.parametrize("objective", ["binary", "multiclass", "regression"])
def test_explain_is_treeshap_summing_to_the_raw_score(tmp_path, servekit_app, objective):
    file = save_lightgbm(tmp_path / "m" / "1", objective=objective)
    booster = lgb.Booster(model_file=str(file))
    client = servekit_app(tmp_path)
    out = client.post("/v1/models/m:explain", json={"instances": ROWS.tolist()}).get_json()["explanations"]
    attributions = np.asarray([e["attributions"] for e in out])
    base = np.asarray([e["base_values"] for e in out])
    assert attributions.shape[-1] == len(FEATURES)
    assert np.allclose(attributions.sum(axis=-1) + base, booster.predict(ROWS, raw_score=True))


def test_kserve_and_mlserver_layouts_serve_unchanged(tmp_path, servekit_app):
    save_lightgbm(tmp_path / "kserve", "iris.bst")  # lgbserver: the one .bst file, any name
    mlserver = tmp_path / "mlserver"
    save_lightgbm(mlserver, "my-model.txt")
    settings = {
        "name": "mlserver",
        "implementation": "mlserver_lightgbm.LightGBMModel",
        "parameters": {"uri": "./my-model.txt"},
    }
    (mlserver / "model-settings.json").write_text(json.dumps(settings))
    client = servekit_app(tmp_path / "kserve", tmp_path / "mlserver")
    for name in ("kserve", "mlserver"):
        assert predict(client, name, ROWS).status_code == 200, name


def test_an_xgboost_bst_is_not_claimed(tmp_path):
    pytest.importorskip("xgboost")
    from framework_models import save_xgboost
    from servekit_lightgbm import is_lightgbm_file

    assert not is_lightgbm_file(save_xgboost(tmp_path, "model.bst"))
    assert is_lightgbm_file(save_lightgbm(tmp_path / "l", "model.bst"))


def test_bad_rows_are_a_400(tmp_path, servekit_app):
    save_lightgbm(tmp_path / "m" / "1")
    client = servekit_app(tmp_path)
    r = client.post("/v1/models/m:predict", json={"instances": [[1.0, 2.0]]})
    # the shape its metadata declares, refused as V2 refuses it
    assert r.status_code == 400 and "shape [1, 2] does not match the model's shape [-1, 4]" in r.get_json()["error"]
    r = client.post("/v1/models/m:predict", json={"instances": [["a", "b", "c", "d"]]})
    assert r.status_code == 400 and "expected numbers" in r.get_json()["error"]


def test_threads_follow_the_workers_share(tmp_path, monkeypatch):
    from servekit.server.cpus import WORKERS_ENV, available_cpus
    from servekit.types import ModelConfig
    from servekit_lightgbm.booster import load_booster

    file = save_lightgbm(tmp_path)
    monkeypatch.setenv(WORKERS_ENV, str(available_cpus() * 2))
    assert load_booster(file, ModelConfig()).threads == 1
    assert load_booster(file, ModelConfig(options={"num_threads": 3})).threads == 3
