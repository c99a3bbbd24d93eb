"""The model call: each signature bound once at load, through the cheapest path that answers the same.

Per call, scikit-learn redoes work servekit has already done or that cannot
change for a fitted estimator:

- A model fitted on a DataFrame checks the feature names of every ``X``, and
  turning a DataFrame into an array costs more than the model itself (iris
  LogisticRegression, 1 row: ~100 µs from an array, ~370 µs from a DataFrame).
  servekit matches the request's names to ``feature_names_in_`` itself, so it
  calls a shallow copy of the estimator that has no ``feature_names_in_`` with
  the array in feature order: the same computation without the DataFrame.
- A RandomForest or ExtraTrees calls each tree through joblib, and scikit-learn
  wraps every one of those calls in a ``config_context`` and a
  ``warnings.catch_warnings`` (~30 µs a tree).  When the forest would run its
  trees one after another anyway (``n_jobs`` unset or 1), servekit sums the
  trees' own answers in the same order, as the forest does.
- A linear classifier (LogisticRegression, SGDClassifier, LinearSVC, ...) spends
  ~90 µs per call validating and dispatching around one matrix product: when
  its class runs scikit-learn's own ``LinearClassifierMixin`` methods, servekit
  runs the same product, the same reshape and the same argmax (or threshold) on
  a float64 matrix servekit has already checked (~8 µs).

Process-wide switches (``sklearn.set_config(assume_finite=True)``) were not
taken: they would change scikit-learn for the user's own code in the process,
and a per-call ``config_context`` costs about what it saves.

A shortcut is kept only when, at load, it answers probe rows exactly as the
estimator's own method does (same dtype, same values); otherwise, and for
anything it does not cover, the estimator's own method is called.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

Call = Callable[[Any], Any]

FORESTS = {
    ("sklearn.ensemble._forest", name)
    for name in ("RandomForestClassifier", "ExtraTreesClassifier", "RandomForestRegressor", "ExtraTreesRegressor")
}


def bind(
    estimator: Any, methods: list[str], names: list[str] | None, n_features: int | None, *, arrays: bool
) -> tuple[dict[str, Call], frozenset[str]]:
    """Method name -> a function of the feature matrix (rows by features, in feature order),
    and the methods that take a shortcut.

    :param arrays: whether requests reach the model as arrays (numbers in feature order);
        otherwise (a DataFrame of mixed columns) only the estimator's own methods are bound
    """
    plain = {m: _own(estimator, m, names) for m in methods}
    if not arrays or not n_features:
        return plain, frozenset()
    probe = np.random.default_rng(0).random((7, n_features))  # positive, finite: any numeric model takes it
    bound = dict(plain)
    for method, own in plain.items():
        fast = _shortcut(estimator, method, names)
        if fast is not None and _same_answers(own, fast, probe, method):
            bound[method] = fast
    return bound, frozenset(m for m in bound if bound[m] is not plain[m])


def _own(estimator: Any, method: str, names: list[str] | None) -> Call:
    call = getattr(estimator, method)
    if names is None:
        return call
    import pandas as pd

    columns = pd.Index(names)

    def framed(X: Any) -> Any:
        if isinstance(X, np.ndarray):  # the frame scikit-learn was fitted on, built from one block
            X = pd.DataFrame(X, columns=columns, copy=False)
        return call(X)

    return framed


def _shortcut(estimator: Any, method: str, names: list[str] | None) -> Call | None:
    target = estimator
    if names is not None:
        target = _without_names(estimator)
        if target is None:
            return None
    fast = _forest_call(target, method) or _linear_call(target, method)
    if fast is not None:
        return fast
    return None if target is estimator else getattr(target, method)


def _without_names(estimator: Any) -> Any | None:
    """A shallow copy that does not check feature names, for a plain (not composite) estimator."""
    if "feature_names_in_" not in vars(estimator) or hasattr(estimator, "steps"):
        return None
    if hasattr(estimator, "transformers_") or hasattr(estimator, "transformer_list"):
        return None  # these select columns by name
    twin = copy.copy(estimator)
    del twin.feature_names_in_
    return twin


def _forest_call(forest: Any, method: str) -> Call | None:
    kind = (type(forest).__module__, type(forest).__name__)
    if kind not in FORESTS or getattr(forest, "n_outputs_", 0) != 1 or forest.n_jobs not in (None, 1):
        return None
    trees = list(forest.estimators_)
    classifier = hasattr(forest, "classes_")
    if classifier and method == "predict_proba":
        return lambda X: _tree_mean(forest, trees, X, "predict_proba")
    if classifier and method == "predict":
        return lambda X: forest.classes_.take(np.argmax(_tree_mean(forest, trees, X, "predict_proba"), axis=1), axis=0)
    if not classifier and method == "predict":
        return lambda X: _tree_mean(forest, trees, X, "predict")
    return None


def _linear_call(model: Any, method: str) -> Call | None:
    """``decision_function``/``predict`` of a linear classifier, as ``LinearClassifierMixin`` computes them."""
    try:
        from sklearn.linear_model._base import LinearClassifierMixin
    except ImportError:  # another scikit-learn layout: no shortcut
        return None
    cls = type(model)
    if method not in ("decision_function", "predict") or not isinstance(model, LinearClassifierMixin):
        return None
    if cls.decision_function is not LinearClassifierMixin.decision_function or (
        method == "predict" and cls.predict is not LinearClassifierMixin.predict
    ):
        return None  # the class computes something of its own
    coef = np.asarray(model.coef_)
    if not isinstance(model.coef_, np.ndarray) or coef.dtype != np.float64:
        return None  # sparse or other namespaces: scikit-learn's own path
    coef_t = coef.T if coef.ndim == 2 else coef
    intercept, classes, own = model.intercept_, model.classes_, getattr(model, method)
    n_features = coef_t.shape[0]

    def decision(X: Any) -> Any:
        if not (
            isinstance(X, np.ndarray)
            and X.dtype == np.float64
            and X.ndim == 2
            and X.shape[1] == n_features
            and X.flags.c_contiguous
            and np.isfinite(X).all()
        ):
            return None
        scores = X @ coef_t + intercept
        return scores.reshape(-1) if scores.ndim > 1 and scores.shape[1] == 1 else scores

    def call(X: Any) -> Any:
        scores = decision(X)
        if scores is None:  # anything servekit did not check this way: the estimator's own checks
            return own(X)
        if method == "decision_function":
            return scores
        indices = (scores > 0).astype(np.intp) if scores.ndim == 1 else np.argmax(scores, axis=1)
        return classes.take(indices, axis=0)

    return call


def _tree_mean(forest: Any, trees: list[Any], X: Any, method: str) -> np.ndarray:
    X32 = np.ascontiguousarray(X, dtype=np.float32)  # what the forest's own check makes of X
    if not np.isfinite(X32).all():  # NaN or infinity: the forest's own checks decide
        return getattr(forest, method)(X)
    width = (X32.shape[0], forest.n_classes_) if method == "predict_proba" else (X32.shape[0],)
    total = np.zeros(width, dtype=np.float64)
    for tree in trees:
        total += getattr(tree, method)(X32, check_input=False)
    total /= len(trees)
    return total


def _same_answers(own: Call, fast: Call, probe: np.ndarray, method: str) -> bool:
    try:
        for rows in (probe[:1], probe):
            expected, got = own(rows), fast(rows)
            if not (isinstance(got, np.ndarray) and got.dtype == expected.dtype and np.array_equal(got, expected)):
                log.info("scikit-learn shortcut for %s differs on probe rows; calling the estimator's own", method)
                return False
    except Exception as exc:  # a model the probe does not suit: no shortcut
        log.debug("scikit-learn shortcut for %s not checked (%s); calling the estimator's own", method, exc)
        return False
    return True
