"""Per-feature attributions (SHAP values) for ``:explain``.

- Linear models (``coef_``): exact SHAP values in closed form,
  ``coef * (x - baseline)``, which is what ``shap.LinearExplainer`` computes
  with the baseline as its background; no extra package needed.
- Tree ensembles: ``shap.TreeExplainer`` (exact, path-dependent) when ``shap``
  is installed (``pip install servekit[explain]``).
- Anything else: ``shap.KernelExplainer`` against the baseline, when ``shap``
  is installed; otherwise the endpoint answers 501.

The baseline is ``options.explain_baseline`` from ``servekit.yaml`` (one value
per feature, e.g. the training means), zeros by default.

Returns named tensors: ``attributions`` with shape ``(rows, features)`` or
``(rows, outputs, features)`` for several classes, and ``base_values``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from servekit.errors import BadRequest, NotImplementedByModel

from .estimator import SklearnModel


def attributions(model: SklearnModel, X: Any) -> dict[str, np.ndarray]:
    values = np.asarray(X, dtype=float) if not _is_frame(X) else X.to_numpy(dtype=float)
    baseline = _baseline(model, values.shape[1])
    estimator = model.estimator
    coef = getattr(estimator, "coef_", None)
    if coef is not None and getattr(estimator, "intercept_", None) is not None:
        return _linear(np.asarray(coef, dtype=float), np.asarray(estimator.intercept_, dtype=float), values, baseline)
    try:
        import shap
    except ImportError:
        raise NotImplementedByModel(
            f"explaining a {type(estimator).__name__} needs the shap package "
            "(pip install servekit[explain]); linear models are explained without it"
        ) from None
    if hasattr(estimator, "estimators_") or hasattr(estimator, "tree_"):
        explainer = shap.TreeExplainer(estimator)
        shap_values = explainer.shap_values(values, check_additivity=False)
        expected = explainer.expected_value
    else:
        f = estimator.predict_proba if hasattr(estimator, "predict_proba") else estimator.predict
        explainer = shap.KernelExplainer(f, baseline.reshape(1, -1))
        shap_values = explainer.shap_values(values, silent=True)
        expected = explainer.expected_value
    shap_values = np.asarray(shap_values, dtype=float)
    if shap_values.ndim == 3 and shap_values.shape[0] == len(values):
        shap_values = shap_values.transpose(0, 2, 1)  # (rows, features, outputs) -> (rows, outputs, features)
    elif shap_values.ndim == 3:
        shap_values = shap_values.transpose(1, 0, 2)  # (outputs, rows, features)
    base = np.broadcast_to(np.asarray(expected, dtype=float), (len(values),) + np.shape(expected))
    return {"attributions": shap_values, "base_values": np.ascontiguousarray(base)}


def _linear(coef: np.ndarray, intercept: np.ndarray, X: np.ndarray, baseline: np.ndarray) -> dict[str, np.ndarray]:
    delta = X - baseline  # (rows, features)
    if coef.ndim == 1 or coef.shape[0] == 1:
        w = coef.reshape(-1)
        return {
            "attributions": delta * w,
            "base_values": np.full(len(X), float(intercept.reshape(-1)[0] + baseline @ w)),
        }
    return {
        "attributions": delta[:, None, :] * coef[None, :, :],
        "base_values": np.tile(intercept + coef @ baseline, (len(X), 1)),
    }


def _baseline(model: SklearnModel, n_features: int) -> np.ndarray:
    raw = model.options.get("explain_baseline")
    if raw is None:
        return np.zeros(n_features)
    baseline = np.asarray(raw, dtype=float).reshape(-1)
    if baseline.shape[0] != n_features:
        raise BadRequest(f"options.explain_baseline has {baseline.shape[0]} values for {n_features} features")
    return baseline


def _is_frame(X: Any) -> bool:
    return hasattr(X, "to_numpy") and hasattr(X, "columns")
