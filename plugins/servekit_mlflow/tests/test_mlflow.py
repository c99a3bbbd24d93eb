"""The MLflow plugin: native flavors through their servekit plugin, anything else through mlflow.pyfunc."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

if importlib.util.find_spec("mlflow") is None:  # imported where used: a second of every worker's collection
    pytest.skip("mlflow is not installed", allow_module_level=True)
from framework_models import FEATURES, data, lightgbm_booster, save_pyfunc, xgboost_booster

X, Y = data()
ROWS = X[:5]
#: given, so that save_model does not infer them (it loads the model in a subprocess to do so)
REQUIREMENTS = ["mlflow"]


def predict(client, name, body):
    return client.post(f"/v1/models/{name}:predict", json=body)


def test_xgboost_flavor_serves_through_the_xgboost_plugin(tmp_path, servekit_app):
    xgb = pytest.importorskip("xgboost")
    import mlflow.xgboost

    booster = xgboost_booster()
    mlflow.xgboost.save_model(booster, tmp_path / "m" / "1", pip_requirements=REQUIREMENTS)
    client = servekit_app(tmp_path)
    got = predict(client, "m", {"instances": ROWS.tolist()}).get_json()["predictions"]
    assert np.array_equal(np.asarray(got, np.float32), booster.predict(xgb.DMatrix(ROWS)))
    meta = client.get("/v2/models/m").get_json()
    assert meta["platform"] == "xgboost" and meta["inputs"][0]["shape"] == [-1, 4]
    # the native plugin's explanations come along
    r = client.post("/v1/models/m:explain", json={"instances": ROWS.tolist()})
    assert r.status_code == 200 and len(r.get_json()["explanations"]) == len(ROWS)


@pytest.mark.slow  # seconds of its own: out of the quick lane
def test_lightgbm_flavor_booster_and_scikit_learn_estimator(tmp_path, servekit_app):
    lgb = pytest.importorskip("lightgbm")
    import mlflow.lightgbm

    booster = lightgbm_booster("binary")
    mlflow.lightgbm.save_model(booster, tmp_path / "booster" / "1", pip_requirements=REQUIREMENTS)
    classifier = lgb.LGBMClassifier(n_estimators=5, num_leaves=7, verbose=-1).fit(X, Y)
    mlflow.lightgbm.save_model(classifier, tmp_path / "estimator" / "1", pip_requirements=REQUIREMENTS)
    client = servekit_app(tmp_path)
    got = predict(client, "booster", {"instances": ROWS.tolist()}).get_json()["predictions"]
    assert got == booster.predict(ROWS).tolist()
    got = predict(client, "estimator", {"instances": ROWS.tolist()}).get_json()["predictions"]
    assert got == classifier.predict(ROWS).tolist()


@pytest.mark.slow  # saving the model imports torch where it is installed: out of the quick lane
def test_sklearn_flavor_is_the_mlflow_plugins_not_the_sklearn_plugins(tmp_path, servekit_app):
    import mlflow.sklearn
    import pandas as pd
    from mlflow.models import infer_signature
    from sklearn.linear_model import LogisticRegression

    frame = pd.DataFrame(X, columns=FEATURES)
    model = LogisticRegression().fit(frame, Y)
    mlflow.sklearn.save_model(
        model,
        tmp_path / "m" / "1",
        signature=infer_signature(frame, model.predict(frame)),
        pip_requirements=REQUIREMENTS,
    )
    client = servekit_app(tmp_path)
    rows = [dict(zip(FEATURES, r)) for r in ROWS.tolist()]
    assert predict(client, "m", {"instances": rows}).get_json()["predictions"] == model.predict(frame[:5]).tolist()
    assert [i["name"] for i in client.get("/v2/models/m").get_json()["inputs"]] == FEATURES


def test_onnx_flavor(tmp_path, servekit_app):
    pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("skl2onnx")
    import mlflow.onnx
    from framework_models import sklearn_onnx

    file, estimator = sklearn_onnx(tmp_path / "raw")
    mlflow.onnx.save_model(onnx.load(str(file)), tmp_path / "m" / "1", pip_requirements=REQUIREMENTS)
    client = servekit_app(tmp_path / "m")
    out = predict(client, "m", {"instances": ROWS.tolist()}).get_json()["predictions"]
    assert [row["label"] for row in out] == estimator.predict(ROWS).tolist()


@pytest.fixture
def pyfunc_model(tmp_path):
    save_pyfunc(tmp_path / "repo" / "scaled" / "1")
    return tmp_path / "repo"


def test_any_other_flavor_runs_through_pyfunc_with_its_signature(pyfunc_model, servekit_app):
    client = servekit_app(pyfunc_model)
    meta = client.get("/v2/models/scaled").get_json()
    assert meta["platform"] == "mlflow"
    assert meta["inputs"] == [
        {"name": "age", "datatype": "FP64", "shape": [-1]},
        {"name": "income", "datatype": "FP64", "shape": [-1]},
    ]
    assert meta["outputs"] == [{"name": "total", "datatype": "FP64", "shape": [-1]}]
    r = predict(client, "scaled", {"instances": [{"age": 1.0, "income": 2.0}, {"age": 3.0, "income": 4.0}]})
    assert r.get_json() == {"predictions": [6.0, 14.0]}
    body = {
        "inputs": [
            {"name": "age", "datatype": "FP64", "shape": [1], "data": [1.0]},
            {"name": "income", "datatype": "FP64", "shape": [1], "data": [1.0]},
        ],
        "parameters": {"params": {"factor": 10.0}},
    }
    (out,) = client.post("/v2/models/scaled/infer", json=body).get_json()["outputs"]
    assert out["name"] == "total" and out["data"] == [20.0]


def test_pyfunc_rows_must_fit_the_signature(pyfunc_model, servekit_app):
    client = servekit_app(pyfunc_model)
    r = predict(client, "scaled", {"instances": [[1.0, 2.0, 3.0]]})
    assert r.status_code == 400 and "age" in r.get_json()["error"]
    r = predict(client, "scaled", {"instances": [{"age": "old", "income": 2.0}]})
    assert r.status_code == 400, r.get_json()


def test_an_unreadable_mlmodel_fails_the_load(tmp_path, servekit_app):
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "MLmodel").write_text("just text\n")
    client = servekit_app(tmp_path)
    status = client.get("/v1/models/m").get_json()["model_version_status"][0]
    assert status["state"] == "END" and "MLmodel" in status["status"]["error_message"]


def test_model_uri_downloads_the_model_into_a_folder_of_its_own(tmp_path, servekit_app):
    xgb = pytest.importorskip("xgboost")
    import mlflow.xgboost

    booster = xgboost_booster()
    mlflow.xgboost.save_model(booster, tmp_path / "store" / "churn", pip_requirements=REQUIREMENTS)
    served = tmp_path / "repo" / "churn"
    served.mkdir(parents=True)
    (served / "servekit.yaml").write_text(f"options: {{model_uri: {(tmp_path / 'store' / 'churn').as_uri()}}}\n")
    client = servekit_app(tmp_path / "repo")
    got = predict(client, "churn", {"instances": ROWS.tolist()}).get_json()["predictions"]
    assert np.array_equal(np.asarray(got, np.float32), booster.predict(xgb.DMatrix(ROWS)))
    assert sorted(p.name for p in served.iterdir()) == ["servekit.yaml"]  # nothing written into the model folder


def test_a_model_uri_that_cannot_be_had_fails_the_load_saying_why(tmp_path, servekit_app):
    served = tmp_path / "churn"
    served.mkdir()
    (served / "servekit.yaml").write_text(f"options: {{model_uri: {(tmp_path / 'nowhere').as_uri()}}}\n")
    client = servekit_app(tmp_path)
    status = client.get("/v1/models/churn").get_json()["model_version_status"][0]
    assert status["state"] == "END" and "model_uri" in status["status"]["error_message"]


def test_unload_removes_the_downloaded_copy(tmp_path):
    pytest.importorskip("xgboost")
    import mlflow.xgboost
    import servekit_mlflow
    from servekit.types import ModelConfig

    mlflow.xgboost.save_model(xgboost_booster(), tmp_path / "store", pip_requirements=REQUIREMENTS)
    (tmp_path / "served").mkdir()
    config = ModelConfig(options={"model_uri": (tmp_path / "store").as_uri()})
    model = servekit_mlflow.load(path=tmp_path / "served", config=config, name="m", version=1)
    assert model.served_by == "xgboost" and model.downloaded.is_dir()
    servekit_mlflow.unload(model=model)
    assert not model.downloaded.exists()
