"""The scikit-learn plugin on its own: formats, signatures, feature mapping, explanations."""

from __future__ import annotations

import joblib
import numpy as np
import pytest
from servekit.errors import BadRequest
from servekit_sklearn.attributions import attributions
from servekit_sklearn.estimator import load_estimator
from sklearn.ensemble import RandomForestRegressor
from sklearn.linear_model import LogisticRegression
from sklearn.svm import SVC
from sklearn_models import fit_iris

ROW = [[5.1, 3.5, 1.4, 0.2]]


# skops imports torch where torch is installed: out of the quick lane
@pytest.mark.parametrize("fmt", ["joblib", "pkl", pytest.param("skops", marks=pytest.mark.slow)])
def test_every_artifact_format_loads_and_predicts(tmp_path, servekit_app, fmt):
    fit_iris(tmp_path / "iris", 1, fmt=fmt)
    client = servekit_app(tmp_path)
    r = client.post("/v1/models/iris:predict", json={"instances": ROW})
    assert r.get_json() == {"predictions": ["setosa"]}


@pytest.mark.slow  # skops imports torch where torch is installed: out of the quick lane
def test_skops_refuses_untrusted_types(tmp_path):
    import skops.io

    folder = tmp_path / "1"
    folder.mkdir()
    skops.io.dump(FunctionEstimator(), folder / "model.skops")
    with pytest.raises(ValueError, match="not trusted"):
        load_estimator(folder, {})


class FunctionEstimator:
    """Not a scikit-learn type: skops must not load it unless trusted."""

    def predict(self, X):
        return X


def test_model_without_feature_names_takes_rows(tmp_path, servekit_app):
    fit_iris(tmp_path / "iris", 1, named=False)
    client = servekit_app(tmp_path)
    assert client.post("/v1/models/iris:predict", json={"instances": ROW}).get_json() == {"predictions": ["setosa"]}
    r = client.post("/v1/models/iris:predict", json={"instances": [{"a": 1, "b": 2}]})
    assert r.status_code == 400 and "without feature names" in r.get_json()["error"]
    r = client.post("/v1/models/iris:classify", json={"examples": [{"inputs": ROW[0]}]})
    assert r.get_json()["results"][0][0][0] == "setosa"
    meta = client.get("/v1/models/iris/metadata").get_json()
    inputs = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]["inputs"]
    assert inputs["input"]["tensor_shape"]["dim"] == [{"size": "-1", "name": ""}, {"size": "4", "name": ""}]


def test_named_inputs_must_match_the_feature_names(tmp_path, servekit_app):
    fit_iris(tmp_path / "iris", 1)
    client = servekit_app(tmp_path)
    r = client.post("/v1/models/iris:predict", json={"instances": [{"sepal_length": 1, "petal_width": 2}]})
    assert r.status_code == 400 and "expected one input per feature" in r.get_json()["error"]


def test_classifier_without_predict_proba_cannot_classify(tmp_path, servekit_app):
    X, y = np.random.default_rng(0).normal(size=(20, 2)), np.array([0, 1] * 10)
    (tmp_path / "svc" / "1").mkdir(parents=True)
    joblib.dump(SVC().fit(X, y), tmp_path / "svc" / "1" / "model.joblib")
    client = servekit_app(tmp_path)
    r = client.post("/v1/models/svc:classify", json={"examples": [{"x": [0.1, 0.2]}]})
    assert r.status_code == 400 and "predict_proba" in r.get_json()["error"]
    sigs = client.get("/v1/models/svc/metadata").get_json()["metadata"]["signature_def"]["signature_def"]
    assert "predict_proba" not in sigs and "decision_function" in sigs


def test_linear_attributions_equal_shap(tmp_path):
    shap = pytest.importorskip("shap")
    rng = np.random.default_rng(1)
    X = rng.normal(size=(50, 3))
    y = (X @ [1.0, -2.0, 0.5] > 0).astype(int)
    model = LogisticRegression().fit(X, y)
    folder = tmp_path / "1"
    folder.mkdir()
    joblib.dump(model, folder / "model.joblib")
    loaded = load_estimator(folder, {"explain_baseline": X.mean(axis=0).tolist()})
    ours = attributions(loaded, X[:5])
    explainer = shap.LinearExplainer(model, shap.maskers.Independent(X.mean(axis=0, keepdims=True)))
    expected = explainer.shap_values(X[:5])
    assert np.allclose(ours["attributions"], expected)
    assert np.allclose(ours["base_values"], explainer.expected_value)
    # additivity: attributions + base value = the model's decision function
    assert np.allclose(ours["attributions"].sum(axis=1) + ours["base_values"], model.decision_function(X[:5]))


def test_tree_attributions_use_shap_and_add_up(tmp_path):
    pytest.importorskip("shap")
    rng = np.random.default_rng(2)
    X = rng.normal(size=(60, 4))
    y = X[:, 0] * 3 + X[:, 1]
    model = RandomForestRegressor(n_estimators=5, random_state=0).fit(X, y)
    folder = tmp_path / "1"
    folder.mkdir()
    joblib.dump(model, folder / "model.joblib")
    out = attributions(load_estimator(folder, {}), X[:3])
    assert out["attributions"].shape == (3, 4)
    assert np.allclose(out["attributions"].sum(axis=1) + out["base_values"], model.predict(X[:3]))


def test_baseline_option_is_checked(tmp_path):
    fit_iris(tmp_path / "iris", 1, named=False)
    loaded = load_estimator(tmp_path / "iris" / "1", {"explain_baseline": [1, 2]})
    with pytest.raises(BadRequest, match="explain_baseline"):
        attributions(loaded, np.array(ROW))
