"""The XGBoost plugin in-process: artifacts and layouts, signatures, metadata, explanations, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

xgb = pytest.importorskip("xgboost")
from framework_models import FEATURES, data, save_xgboost, xgboost_booster

ROWS = data()[0][:5]


def predict(client, name, rows, **body):
    return client.post(f"/v1/models/{name}:predict", json={"instances": rows.tolist(), **body})


@pytest.mark.parametrize("artifact", ["model.json", "model.ubj", "model.bst"])
def test_every_artifact_answers_as_the_booster(tmp_path, servekit_app, artifact):
    file = save_xgboost(tmp_path / "m" / "1", artifact)
    booster = xgb.Booster(model_file=str(file))
    client = servekit_app(tmp_path)
    got = predict(client, "m", ROWS).get_json()["predictions"]
    assert np.array_equal(np.asarray(got, dtype=np.float32), booster.predict(xgb.DMatrix(ROWS)))


def test_signatures_probabilities_margin_and_classify(tmp_path, servekit_app):
    file = save_xgboost(tmp_path / "m" / "1")
    booster = xgb.Booster(model_file=str(file))
    client = servekit_app(tmp_path)
    p = booster.predict(xgb.DMatrix(ROWS))
    proba = predict(client, "m", ROWS, signature_name="predict_proba").get_json()["predictions"]
    assert np.allclose(proba, np.column_stack([1 - p, p]))
    margin = predict(client, "m", ROWS, signature_name="predict_margin").get_json()["predictions"]
    assert np.array_equal(np.asarray(margin, np.float32), booster.predict(xgb.DMatrix(ROWS), output_margin=True))
    r = client.post("/v1/models/m:classify", json={"examples": [{"x": ROWS[0].tolist()}]})
    (pairs,) = r.get_json()["results"]
    assert [label for label, _ in pairs] == ["0", "1"] and np.isclose(pairs[1][1], p[0])
    r = client.post("/v1/models/m:regress", json={"examples": [{"x": ROWS[0].tolist()}]})
    assert r.status_code == 400 and "classify" in r.get_json()["error"]


def test_metadata_names_the_features_and_classes(tmp_path, servekit_app):
    save_xgboost(tmp_path / "m" / "1", objective="multi:softprob", classes=3, named=True)
    client = servekit_app(tmp_path)
    meta = client.get("/v2/models/m").get_json()
    assert [i["name"] for i in meta["inputs"]] == FEATURES
    assert meta["outputs"] == [{"name": "predict", "datatype": "FP32", "shape": [-1, 3]}]
    assert meta["platform"] == "xgboost"
    # named inputs, one per feature, in any order
    body = {
        "inputs": [
            {"name": n, "datatype": "FP64", "shape": [5], "data": ROWS[:, i].tolist()}
            for i, n in reversed(list(enumerate(FEATURES)))
        ]
    }
    out = client.post("/v2/models/m/infer", json=body).get_json()["outputs"][0]
    booster = xgboost_booster("multi:softprob", named=True, classes=3)
    expected = booster.predict(xgb.DMatrix(ROWS, feature_names=FEATURES))
    assert out["shape"] == [5, 3] and np.array_equal(np.asarray(out["data"], np.float32).reshape(5, 3), expected)


def test_regression_answers_regress(tmp_path, servekit_app):
    file = save_xgboost(tmp_path / "m" / "1", objective="reg:squarederror")
    booster = xgb.Booster(model_file=str(file))
    client = servekit_app(tmp_path)
    r = client.post("/v1/models/m:regress", json={"examples": [{"x": row.tolist()} for row in ROWS[:2]]})
    assert np.allclose(r.get_json()["results"], booster.predict(xgb.DMatrix(ROWS[:2])))
    sigs = client.get("/v1/models/m/metadata").get_json()["metadata"]["signature_def"]["signature_def"]
    assert "predict_proba" not in sigs and "regression" in sigs


@pytest.mark.parametrize("objective", ["binary:logistic", "multi:softprob", "reg:squarederror"])
def test_explain_is_treeshap_summing_to_the_margin(tmp_path, servekit_app, objective):
    file = save_xgboost(tmp_path / "m" / "1", objective=objective, classes=3)
    booster = xgb.Booster(model_file=str(file))
    client = servekit_app(tmp_path)
    out = client.post("/v1/models/m:explain", json={"instances": ROWS.tolist()}).get_json()["explanations"]
    attributions = np.asarray([e["attributions"] for e in out])
    base = np.asarray([e["base_values"] for e in out])
    assert attributions.shape[-1] == len(FEATURES)
    margin = booster.predict(xgb.DMatrix(ROWS), output_margin=True)
    assert np.allclose(attributions.sum(axis=-1) + base, margin, atol=1e-5)


def test_kserve_and_mlserver_layouts_serve_unchanged(tmp_path, servekit_app):
    save_xgboost(tmp_path / "kserve", "iris.bst")  # xgbserver: the one booster file, any name
    mlserver = tmp_path / "mlserver"
    save_xgboost(mlserver, "my-model.json")
    (mlserver / "model-settings.json").write_text(
        json.dumps(
            {
                "name": "mlserver",
                "implementation": "mlserver_xgboost.XGBoostModel",
                "parameters": {"uri": "./my-model.json", "version": "v0.1.0"},
            }
        )
    )
    client = servekit_app(tmp_path / "kserve", tmp_path / "mlserver")
    for name in ("kserve", "mlserver"):
        assert predict(client, name, ROWS).status_code == 200, name


def test_lightgbm_bst_is_left_to_lightgbm(tmp_path):
    from servekit_xgboost import is_xgboost_file

    lgb = pytest.importorskip("lightgbm")
    X, y = data()
    file = tmp_path / "model.bst"
    lgb.train({"objective": "binary", "verbose": -1}, lgb.Dataset(X, label=y), 2).save_model(str(file))
    assert not is_xgboost_file(file)
    save_xgboost(tmp_path / "x", "model.bst")
    assert is_xgboost_file(tmp_path / "x" / "model.bst")


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([[1.0, 2.0]], "shape [1, 2] does not match the model's shape [-1, 4]"),  # its metadata, as V2
        ([["a", "b", "c", "d"]], "expected numbers"),
        ([[1, 2, 3, 4]], None),
        ([[1e400, 0, 0, 0]], "contains infinity"),
        ([[[1, 2, 3, 4]]], "shape [1, 1, 4] does not match the model's shape [-1, 4]"),
    ],
)
def test_bad_rows_are_a_400(tmp_path, servekit_app, rows, message):
    save_xgboost(tmp_path / "m" / "1")
    client = servekit_app(tmp_path)
    r = client.post("/v1/models/m:predict", json={"instances": rows})
    if message is None:
        assert r.status_code == 200
    else:
        assert r.status_code == 400 and message in r.get_json()["error"], r.get_json()


def test_nan_is_a_missing_value(tmp_path, servekit_app):
    file = save_xgboost(tmp_path / "m" / "1")
    booster = xgb.Booster(model_file=str(file))
    client = servekit_app(tmp_path)
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [float("nan"), 1, 2, 3]}]}
    out = client.post("/v2/models/m/infer", json=body).get_json()["outputs"][0]["data"]
    row = np.array([[np.nan, 1, 2, 3]], dtype=np.float32)
    assert np.array_equal(np.asarray(out, np.float32), booster.predict(xgb.DMatrix(row)))


def test_options_allow_nan_false_refuses_nan(tmp_path, servekit_app):
    """A model trained without missing values, whose owner would rather see a client's NaN refused."""
    save_xgboost(tmp_path / "m" / "1")
    (tmp_path / "m" / "servekit.yaml").write_text("options: {allow_nan: false}\n")
    client = servekit_app(tmp_path)
    body = '{"instances": [[1, NaN, 2, 3]]}'
    r = client.post("/v1/models/m:predict", data=body, content_type="application/json")
    assert r.status_code == 400 and "input 'input' contains NaN at row 0 column 1" in r.get_json()["error"]


def test_a_broken_file_fails_the_load_naming_it(tmp_path, servekit_app):
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.bst").write_bytes(b"\x00garbage")
    client = servekit_app(tmp_path)
    status = client.get("/v1/models/m").get_json()["model_version_status"][0]
    assert status["state"] == "END" and "model.bst" in status["status"]["error_message"]


def test_threads_and_device(tmp_path, monkeypatch):
    from servekit.server.cpus import WORKERS_ENV, available_cpus
    from servekit.types import ModelConfig
    from servekit_xgboost.booster import load_booster

    file = save_xgboost(tmp_path)
    monkeypatch.setenv(WORKERS_ENV, str(available_cpus() * 2))

    def nthread(model):
        return json.loads(model.booster.save_config())["learner"]["generic_param"]["nthread"]

    assert nthread(load_booster(file, ModelConfig())) == "1"
    assert nthread(load_booster(file, ModelConfig(options={"nthread": 3}))) == "3"
    if xgb.build_info().get("USE_CUDA"):
        try:
            load_booster(file, ModelConfig(device="cuda"))
        except ValueError as exc:  # no GPU here: said at load, not a silent CPU fallback
            assert "no GPU" in str(exc)


@pytest.mark.parametrize("objective", ["binary:logistic", "multi:softprob", "multi:softmax", "reg:squarederror"])
def test_the_dense_call_answers_what_inplace_predict_answers(objective):
    from servekit_xgboost.dense import DensePredict

    booster = xgboost_booster(objective, classes=3)
    dense = DensePredict(booster)
    assert dense.c_call is not None  # the C call is reached, not the fallback
    X = data(n=64, seed=3)[0]
    X[2, 1] = np.nan
    inputs = [X, X[:1], X[:0], X.astype(np.float32), X.astype(np.float16), (X * 10).astype(np.int64), X.T.copy().T]
    for rows in inputs:
        for margin in (False, True):
            want = booster.inplace_predict(rows, predict_type="margin" if margin else "value")
            got = dense(rows, margin)
            assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want, equal_nan=True)
