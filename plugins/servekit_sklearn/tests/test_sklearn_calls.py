"""The plugin's model call answers bit for bit as the estimator's own methods do.

Every kind of estimator the plugin serves, every signature it offers, 1 and 100
rows, through the plugin's ``predict`` hook (shortcut or not) against the
estimator's own ``predict``/``predict_proba``/``decision_function``/``transform``
on the same values: same dtype, same values (``np.array_equal``, not ``allclose``).
"""

from __future__ import annotations

from pathlib import Path

import joblib
import numpy as np
import pandas as pd
import pytest
import servekit_sklearn as plugin
from servekit_sklearn.estimator import load_estimator
from sklearn.cluster import KMeans
from sklearn.compose import make_column_transformer
from sklearn.decomposition import PCA
from sklearn.ensemble import (
    ExtraTreesClassifier,
    HistGradientBoostingRegressor,
    RandomForestClassifier,
    RandomForestRegressor,
)
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LinearRegression, LogisticRegression, RidgeClassifier, SGDClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler
from sklearn.svm import SVC, LinearSVC

N_FEATURES = 5
RNG = np.random.default_rng(7)
X_FIT = RNG.normal(size=(200, N_FEATURES))
Y_CLASS = np.array(["a", "b", "c"])[(X_FIT[:, 0] > 0).astype(int) + (X_FIT[:, 1] > 0.5).astype(int)]
Y_REG = X_FIT @ np.arange(1.0, N_FEATURES + 1) + 0.1 * RNG.normal(size=200)
NAMES = [f"f{i}" for i in range(N_FEATURES)]
FRAME = pd.DataFrame(X_FIT, columns=NAMES)


def _mixed_frame() -> pd.DataFrame:
    return FRAME.assign(f4=np.where(X_FIT[:, 4] > 0, "hi", "lo"))


#: name -> (a fitted estimator, whether it was fitted on a DataFrame, the methods it should answer)
KINDS = {
    "classifier": lambda: LogisticRegression(max_iter=500).fit(X_FIT, Y_CLASS),
    "classifier, pandas-fitted": lambda: LogisticRegression(max_iter=500).fit(FRAME, Y_CLASS),
    "binary classifier, integer classes": lambda: LogisticRegression().fit(X_FIT, (X_FIT[:, 2] > 0).astype(int)),
    "linear svm": lambda: LinearSVC().fit(X_FIT, Y_CLASS),
    "sgd classifier": lambda: SGDClassifier(random_state=0).fit(X_FIT, Y_CLASS),
    "ridge classifier (predict of its own)": lambda: RidgeClassifier().fit(X_FIT, Y_CLASS),
    "regressor": lambda: LinearRegression().fit(X_FIT, Y_REG),
    "svm decision_function": lambda: SVC().fit(X_FIT, Y_CLASS),
    "forest classifier": lambda: RandomForestClassifier(12, random_state=0).fit(X_FIT, Y_CLASS),
    "forest classifier, pandas-fitted": lambda: ExtraTreesClassifier(12, random_state=0).fit(FRAME, Y_CLASS),
    "forest regressor": lambda: RandomForestRegressor(12, random_state=0).fit(X_FIT, Y_REG),
    "forest regressor, pandas-fitted": lambda: RandomForestRegressor(12, random_state=0).fit(FRAME, Y_REG),
    "forest, parallel": lambda: RandomForestClassifier(6, n_jobs=2, random_state=0).fit(X_FIT, Y_CLASS),
    "forest, two outputs": lambda: RandomForestRegressor(6, random_state=0).fit(X_FIT, np.c_[Y_REG, -Y_REG]),
    "gradient boosting (takes NaN)": lambda: HistGradientBoostingRegressor(max_iter=10).fit(X_FIT, Y_REG),
    "pipeline": lambda: make_pipeline(StandardScaler(), LogisticRegression()).fit(X_FIT, Y_CLASS),
    "pipeline with imputer, pandas-fitted": lambda: make_pipeline(SimpleImputer(), LogisticRegression()).fit(
        FRAME, Y_CLASS
    ),
    "pipeline with string column": lambda: make_pipeline(
        make_column_transformer((OneHotEncoder(), ["f4"]), remainder="passthrough"), LogisticRegression()
    ).fit(_mixed_frame(), Y_CLASS),
    "transformer": lambda: StandardScaler().fit(X_FIT),
    "transformer, pandas-fitted": lambda: PCA(3).fit(FRAME),
    "clusterer": lambda: KMeans(3, n_init=2, random_state=0).fit(X_FIT),
}

#: kinds whose calls are expected to take a shortcut (so the equality below covers it)
SHORTCUTS = {
    "classifier": {"predict", "decision_function"},
    "binary classifier, integer classes": {"predict", "decision_function"},
    "linear svm": {"predict", "decision_function"},
    "sgd classifier": {"predict", "decision_function"},
    "ridge classifier (predict of its own)": {"decision_function"},
    "pipeline": set(),
    "classifier, pandas-fitted": {"predict", "predict_proba", "decision_function"},
    "forest classifier": {"predict", "predict_proba"},
    "forest classifier, pandas-fitted": {"predict", "predict_proba"},
    "forest regressor": {"predict"},
    "forest regressor, pandas-fitted": {"predict"},
    "transformer, pandas-fitted": {"transform"},
}


@pytest.fixture(scope="module", params=sorted(KINDS))
def served(request, tmp_path_factory):
    estimator = KINDS[request.param]()
    folder = tmp_path_factory.mktemp("model")
    joblib.dump(estimator, folder / "model.joblib")
    return request.param, joblib.load(folder / "model.joblib"), load_estimator(folder, {})


def request_rows(kind: str, n: int, *, nan: bool = False) -> pd.DataFrame:
    rows = pd.DataFrame(RNG.normal(size=(n, N_FEATURES)), columns=NAMES)
    if kind == "pipeline with string column":
        rows["f4"] = np.where(rows["f4"] > 0, "hi", "lo")
    if nan:
        rows.iloc[n // 2, 1] = np.nan
    return rows


def own_answer(estimator, method: str, rows: pd.DataFrame):
    fitted_on_frame = hasattr(estimator, "feature_names_in_")
    return getattr(estimator, method)(rows if fitted_on_frame else rows.to_numpy())


def as_request(model, rows: pd.DataFrame):
    """What a codec hands the plugin: named columns for a named model, else one array of rows."""
    if model.feature_names is not None:
        return {name: rows[name].to_numpy() for name in model.feature_names}
    return rows.to_numpy()


def assert_identical(got, expected) -> None:
    assert isinstance(got, np.ndarray) and got.dtype == expected.dtype and got.shape == expected.shape
    assert np.array_equal(got, expected, equal_nan=got.dtype.kind == "f")


@pytest.mark.parametrize("n", [1, 100])
def test_every_signature_answers_as_the_estimator_does(served, n):
    kind, estimator, model = served
    rows = request_rows(kind, n)
    for signature, method in model.methods().items():
        out = plugin.predict(inputs=as_request(model, rows), model=model, signature_name=signature)
        assert_identical(out[method], own_answer(estimator, method, rows))


def test_named_rows_as_one_array_answer_the_same(served):
    """A named model sent rows (``instances`` of lists) rather than named columns."""
    kind, estimator, model = served
    rows = request_rows(kind, 10)
    if model.feature_names is None or kind == "pipeline with string column":
        pytest.skip("rows of numbers in feature order only")
    method = model.methods()["serving_default"]
    out = plugin.predict(inputs=rows.to_numpy(), model=model, signature_name=None)
    assert_identical(out[method], own_answer(estimator, method, rows))


def test_models_that_take_nan_answer_nan_rows_as_the_estimator_does(served):
    kind, estimator, model = served
    if model.accepts.finite_only or kind == "pipeline with string column":
        pytest.skip("refuses NaN (tested in test_sklearn_inputs)")
    rows = request_rows(kind, 9, nan=True)
    method = model.methods()["serving_default"]
    try:
        expected = own_answer(estimator, method, rows)
    except ValueError:
        pytest.skip(f"{kind} lets NaN through to scikit-learn, which refuses it")
    out = plugin.predict(inputs=as_request(model, rows), model=model, signature_name=None)
    assert_identical(out[method], expected)


def test_the_expected_shortcuts_are_taken(served):
    kind, _, model = served
    assert model.shortcuts == SHORTCUTS.get(kind, set())


def test_classify_and_regress_answer_the_estimators_numbers(tmp_path: Path):
    classifier = RandomForestClassifier(8, random_state=0).fit(FRAME, Y_CLASS)
    regressor = RandomForestRegressor(8, random_state=0).fit(FRAME, Y_REG)
    rows = request_rows("", 4)
    examples = [{n: [float(v)] for n, v in zip(NAMES, row)} for row in rows.to_numpy()]
    for name, estimator in (("c", classifier), ("r", regressor)):
        (tmp_path / name).mkdir()
        joblib.dump(estimator, tmp_path / name / "model.joblib")
    results = plugin.classify(examples=examples, model=load_estimator(tmp_path / "c", {}))
    assert [[score for _, score in r] for r in results] == classifier.predict_proba(rows).tolist()
    assert plugin.regress(examples=examples, model=load_estimator(tmp_path / "r", {})) == (
        regressor.predict(rows).tolist()
    )


def test_infinity_to_a_model_that_takes_nan_is_the_clients_mistake(tmp_path: Path):
    from servekit.errors import BadRequest

    joblib.dump(RandomForestClassifier(5, random_state=0).fit(X_FIT, Y_CLASS), tmp_path / "model.joblib")
    model = load_estimator(tmp_path, {})
    rows = np.array(X_FIT[:2])
    rows[1, 3] = np.inf
    with pytest.raises(BadRequest, match="contains infinity"):
        plugin.predict(inputs=rows, model=model, signature_name=None)
    rows[1, 3] = np.nan  # NaN it takes, as scikit-learn does
    assert plugin.predict(inputs=rows, model=model, signature_name=None)["predict"].shape == (2,)
