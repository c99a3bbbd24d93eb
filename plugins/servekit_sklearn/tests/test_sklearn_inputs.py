"""A client's wrong values (strings, NaN, infinity) are a 400 naming the input, never the model's 500.

End to end through a real server on every path a value can take to a
scikit-learn model: V1 ``:predict`` and ``:classify``, generic ``/predict`` and
its streaming form, V2 over HTTP (tritonclient) and gRPC (tritonclient.grpc).
NaN is refused only where the estimator refuses it: models that take missing
values (HistGradientBoosting, a Pipeline with a SimpleImputer) answer.
"""

from __future__ import annotations

import joblib
import numpy as np
import pandas as pd
import pytest
import requests
from servekit.testing import ServerProcess
from servekit_sklearn.inputs import Accepts
from sklearn.compose import make_column_transformer
from sklearn.ensemble import HistGradientBoostingClassifier, RandomForestClassifier
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler
from sklearn_models import fit_iris

pytestmark = pytest.mark.slow  # starts real servers

FEATURES = ("sepal_length", "sepal_width", "petal_length", "petal_width")
SETOSA = [5.1, 3.5, 1.4, 0.2]
RNG = np.random.default_rng(3)
X = RNG.normal(size=(80, 4))
Y = (X[:, 0] + X[:, 1] > 0).astype(int)


def named(values, **changes) -> dict:
    return {**dict(zip(FEATURES, values)), **changes}


@pytest.fixture(scope="module")
def iris_server(tmp_path_factory):
    """One pandas-fitted iris LogisticRegression (so /predict knows its model), HTTP and gRPC."""
    base = tmp_path_factory.mktemp("iris")
    fit_iris(base / "iris", 1)
    with ServerProcess(base, grpc_port="auto", workers=1) as server:
        yield server


@pytest.fixture(scope="module")
def nan_server(tmp_path_factory):
    """Models that take NaN and one that refuses it, all without feature names."""
    base = tmp_path_factory.mktemp("nan")
    models = {
        "boosting": HistGradientBoostingClassifier(max_iter=5),
        "imputed": make_pipeline(SimpleImputer(), LogisticRegression()),
        "plain": LogisticRegression(),
    }
    for name, estimator in models.items():
        (base / name / "1").mkdir(parents=True)
        joblib.dump(estimator.fit(X, Y), base / name / "1" / "model.joblib")
    with ServerProcess(base, workers=1) as server:
        yield server


def post(server: ServerProcess, path: str, body: str | dict) -> requests.Response:
    if isinstance(body, dict):
        return requests.post(server.url + path, json=body, timeout=30)
    return requests.post(server.url + path, data=body, headers={"Content-Type": "application/json"}, timeout=30)


def assert_400(response: requests.Response, *fragments: str) -> None:
    assert response.status_code == 400, response.text
    message = response.json()["error"]
    for fragment in fragments:
        assert fragment in message


# -- V1, generic, streaming -----------------------------------------------------------------


def test_v1_predict_refuses_a_string_naming_input_and_row(iris_server):
    r = post(iris_server, "/v1/models/iris:predict", {"instances": [named(SETOSA, petal_width="abc")]})
    assert_400(r, "input 'petal_width': expected numbers, found the string 'abc' at row 0")


def test_v1_predict_refuses_nan_and_infinity(iris_server):
    r = post(iris_server, "/v1/models/iris:predict", '{"instances": [[5.1, NaN, 1.4, 0.2]]}')
    assert_400(r, "input 'sepal_width' contains NaN at row 0", "does not take missing values")
    r = post(
        iris_server,
        "/v1/models/iris:predict",
        '{"inputs": {"sepal_length": [Infinity], "sepal_width": [1], "petal_length": [1], "petal_width": [1]}}',
    )
    assert_400(r, "input 'sepal_length' contains infinity at row 0")


def test_v1_classify_refuses_a_string_feature(iris_server):
    r = post(iris_server, "/v1/models/iris:classify", {"examples": [named(SETOSA, sepal_length="abc")]})
    assert_400(r, "input 'sepal_length'", "the string 'abc'")
    r = post(
        iris_server,
        "/v1/models/iris:classify",
        '{"examples": [{"sepal_length": 5.1, "sepal_width": NaN, "petal_length": 1.4, "petal_width": 0.2}]}',
    )
    assert_400(r, "input 'sepal_width' contains NaN")


def test_generic_predict_and_its_stream_refuse_before_answering(iris_server):
    r = post(iris_server, "/predict", {"instances": [["5.1", "abc", "1.4", "0.2"]]})
    assert_400(r, "input 'sepal_length': expected numbers, found the string '5.1' at row 0")
    for path in ("/predict?stream=true", "/v1/models/iris:predict?stream=true"):
        r = post(iris_server, path, '{"instances": [[5.1, 3.5, 1.4, 0.2], [1, 2, NaN, 4]]}')
        assert_400(r, "input 'petal_length' contains NaN at row 1")
        assert r.headers["Content-Type"].startswith("application/json")


def test_good_values_still_answer_on_every_path(iris_server):
    assert post(iris_server, "/predict", {"instances": [SETOSA]}).json() == {"predictions": ["setosa"]}
    r = post(iris_server, "/v1/models/iris:classify", {"examples": [named(SETOSA)]})
    assert r.json()["results"][0][0][0] == "setosa"


# -- V2 over HTTP and gRPC ------------------------------------------------------------------


def v2_inputs(module, petal_width: np.ndarray, datatype: str = "FP64") -> list:
    inputs = []
    for name, column in zip(FEATURES, np.array([SETOSA], dtype=np.float64).T):
        value, kind = (petal_width, datatype) if name == "petal_width" else (column, "FP64")
        tensor = module.InferInput(name, list(value.shape), kind)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return inputs


def test_v2_http_refuses_bytes_and_nan(iris_server):
    httpclient = pytest.importorskip("tritonclient.http")
    from tritonclient.utils import InferenceServerException

    client = httpclient.InferenceServerClient(iris_server.url.removeprefix("http://"))
    with pytest.raises(InferenceServerException) as err:
        client.infer("iris", v2_inputs(httpclient, np.array([b"abc"], dtype=object), "BYTES"))
    assert err.value.status() == "400" and "input 'petal_width': expected numbers" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.infer("iris", v2_inputs(httpclient, np.array([np.nan])))
    assert err.value.status() == "400" and "'petal_width' contains NaN" in err.value.message()
    ok = client.infer("iris", v2_inputs(httpclient, np.array([0.2])))
    assert ok.as_numpy("predict").tolist() == [b"setosa"]


def test_grpc_refuses_nan_as_invalid_argument(iris_server):
    grpcclient = pytest.importorskip("tritonclient.grpc")
    from tritonclient.utils import InferenceServerException

    with grpcclient.InferenceServerClient(f"127.0.0.1:{iris_server.grpc_port}") as client:
        with pytest.raises(InferenceServerException) as err:
            client.infer("iris", v2_inputs(grpcclient, np.array([np.nan])))
        assert "INVALID_ARGUMENT" in str(err.value.status()) and "contains NaN" in err.value.message()
        with pytest.raises(InferenceServerException) as err:
            client.infer("iris", v2_inputs(grpcclient, np.array([b"abc"], dtype=object), "BYTES"))
        assert "INVALID_ARGUMENT" in str(err.value.status()) and "the string 'abc'" in err.value.message()


# -- NaN: refused only where the estimator refuses it --------------------------------------


@pytest.mark.parametrize("name", ["boosting", "imputed"])
def test_models_that_take_missing_values_answer_nan(nan_server, name):
    r = post(nan_server, f"/v1/models/{name}:predict", '{"instances": [[5.1, 3.5, 1.4, 0.2], [6.7, NaN, 5.2, 2.3]]}')
    assert r.status_code == 200, r.text
    assert len(r.json()["predictions"]) == 2


def test_a_model_that_refuses_nan_says_so(nan_server):
    r = post(nan_server, "/v1/models/plain:predict", '{"instances": [[5.1, 3.5, 1.4, 0.2], [6.7, NaN, 5.2, 2.3]]}')
    assert_400(r, "input 'input' contains NaN at row 1 column 1", "does not take missing values")


# -- what each kind of estimator accepts, against what scikit-learn does -------------------

FRAME = pd.DataFrame(X, columns=["a", "b", "c", "d"])
MIXED = FRAME.assign(d=np.where(X[:, 3] > 0, "x", "y"))

#: estimator, data it is fitted on, refuses NaN (None: servekit cannot tell, so lets it through), numbers only
DECISIONS = {
    "linear": (LogisticRegression(), X, True, True),
    "boosting": (HistGradientBoostingClassifier(max_iter=3), X, False, True),
    "forest": (RandomForestClassifier(3), X, False, True),
    "imputer then linear": (make_pipeline(SimpleImputer(), LogisticRegression()), X, False, True),
    "scaler then linear": (make_pipeline(StandardScaler(), LogisticRegression()), X, True, True),
    "scaler then boosting": (
        make_pipeline(StandardScaler(), HistGradientBoostingClassifier(max_iter=3)),
        X,
        False,
        True,
    ),
    "most-frequent imputer": (
        make_pipeline(SimpleImputer(strategy="most_frequent"), LogisticRegression()),
        X,
        False,
        False,
    ),
    "one-hot columns": (
        make_pipeline(make_column_transformer((OneHotEncoder(), ["d"]), remainder="passthrough"), LogisticRegression()),
        MIXED,
        None,
        False,
    ),
}


@pytest.mark.parametrize("kind", sorted(DECISIONS))
def test_nan_is_refused_exactly_where_scikit_learn_refuses_it(kind):
    estimator, data, refuses, numbers_only = DECISIONS[kind]
    estimator.fit(data, Y)
    accepts = Accepts.of(estimator)
    assert (accepts.finite_only, accepts.numbers_only) == (bool(refuses), numbers_only)
    if refuses is None:
        return
    with_nan = data.copy()
    if isinstance(with_nan, pd.DataFrame):
        with_nan.iloc[0, 0] = np.nan
    else:
        with_nan[0, 0] = np.nan
    if refuses:
        with pytest.raises(ValueError, match="NaN"):
            estimator.predict(with_nan)
    else:
        assert len(estimator.predict(with_nan)) == len(data)


def test_strings_are_refused_only_by_models_that_take_numbers():
    numeric = Accepts.of(LogisticRegression().fit(X, Y))
    rows = np.array([[1.0, "abc"]], dtype=object)
    with pytest.raises(Exception, match="input 'x': expected numbers, found the string 'abc' at row 0 column 1"):
        numeric.check(rows, "input 'x'")
    assert numeric.check(np.array([[1, 2.5]], dtype=object), "input").dtype == np.float64
    mixed = Accepts.of(DECISIONS["one-hot columns"][0].fit(MIXED, Y))
    assert mixed.check(rows, "input") is rows
