"""Loading a fitted estimator and mapping request tensors to its feature matrix."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from servekit.codecs.dtypes import numpy_to_v2
from servekit.errors import BadRequest
from servekit.types import CLASSIFY_METHOD, ModelMetadata, Signature, TensorSpec

ARTIFACTS = ("model.skops", "model.joblib", "model.pkl")
#: signatures beyond ``serving_default`` (``predict``), when the estimator has the method
EXTRA_METHODS = ("predict_proba", "decision_function")


@dataclass
class SklearnModel:
    estimator: Any
    options: dict[str, Any]

    # A fitted estimator does not change: these are read once, not per request.

    @cached_property
    def is_classifier(self) -> bool:
        return hasattr(self.estimator, "classes_")

    @cached_property
    def feature_names(self) -> list[str] | None:
        names = getattr(self.estimator, "feature_names_in_", None)
        return [str(n) for n in names] if names is not None else None

    @cached_property
    def n_features(self) -> int | None:
        return getattr(self.estimator, "n_features_in_", None)

    @cached_property
    def _methods(self) -> dict[str, str]:
        found = {"serving_default": "predict"}
        for method in EXTRA_METHODS:
            if _has_method(self.estimator, method):
                found[method] = method
        return found

    def methods(self) -> dict[str, str]:
        """Signature name -> estimator method."""
        return self._methods

    # -- describing --------------------------------------------------------------

    def describe(self) -> ModelMetadata:
        if self.feature_names:
            inputs = [TensorSpec(name, "FP64", [-1]) for name in self.feature_names]
        else:
            inputs = [TensorSpec("input", "FP64", [-1, self.n_features] if self.n_features else None)]
        signatures = {}
        for signature, method in self.methods().items():
            signatures[signature] = Signature(inputs=inputs, outputs=[self._output_spec(method)])
        if self.is_classifier and "predict_proba" in signatures:
            signatures["classification"] = Signature(
                inputs=inputs,
                outputs=[TensorSpec("classes", "BYTES", [-1, len(self.estimator.classes_)]),
                         TensorSpec("scores", "FP32", [-1, len(self.estimator.classes_)])],
                method_name=CLASSIFY_METHOD,
            )
        return ModelMetadata(signatures=signatures, platform="sklearn")

    def _output_spec(self, method: str) -> TensorSpec:
        if method == "predict":
            if self.is_classifier:
                return TensorSpec("predict", numpy_to_v2(np.asarray(self.estimator.classes_).dtype), [-1])
            n_outputs = getattr(self.estimator, "n_outputs_", 1)
            return TensorSpec("predict", "FP64", [-1] if n_outputs == 1 else [-1, n_outputs])
        width = len(self.estimator.classes_) if self.is_classifier else -1
        if method == "decision_function" and width == 2:
            return TensorSpec(method, "FP64", [-1])
        return TensorSpec(method, "FP64", [-1, width])

    # -- inference -------------------------------------------------------------------

    def predict(self, inputs: Any, signature_name: str | None) -> dict[str, np.ndarray]:
        methods = self.methods()
        method = methods.get(signature_name or "serving_default")
        if method is None:
            raise BadRequest(
                f"unknown signature {signature_name!r}; this model has {', '.join(methods)}"
            )
        return {method: getattr(self.estimator, method)(self.matrix(inputs))}

    def classify(self, X: Any) -> list[list[tuple[str, float]]]:
        if not _has_method(self.estimator, "predict_proba"):
            raise BadRequest("this model has no predict_proba, so :classify cannot score classes")
        labels = [str(c) for c in self.estimator.classes_]
        scores = self.estimator.predict_proba(X)
        return [list(zip(labels, row.tolist())) for row in scores]

    def matrix(self, inputs: Any) -> Any:
        """The estimator's ``X`` from decoded request tensors, checked against its features."""
        names = self.feature_names
        if isinstance(inputs, dict):
            if names is None:
                if len(inputs) == 1:
                    return self.matrix(next(iter(inputs.values())))
                raise BadRequest(
                    f"this model was fitted without feature names, so named inputs {sorted(inputs)} "
                    "cannot be ordered; send one unnamed tensor of rows"
                )
            if set(inputs) != set(names):
                raise BadRequest(f"expected inputs {names}, found {sorted(inputs)}")
            columns = {n: _column(inputs[n], n) for n in names}
            return _frame(columns, names)
        X = np.asarray(inputs)
        if X.ndim == 0:
            raise BadRequest("expected a list of rows, found a scalar")
        expected = self.n_features
        if X.ndim == 1 and expected is not None:
            if expected != 1:
                raise BadRequest(f"expected rows of {expected} features, found a list of scalars")
            X = X.reshape(-1, 1)
        if X.ndim > 2:
            raise BadRequest(f"expected rows of features (2 dimensions), found {X.ndim} dimensions")
        if expected is not None and X.shape[1] != expected:
            raise BadRequest(f"expected rows of {expected} features, found rows of {X.shape[1]}")
        if names is not None:
            return _frame({n: X[:, i] for i, n in enumerate(names)}, names)
        return X

    def examples_to_matrix(self, examples: list[dict[str, list[Any]]]) -> Any:
        """``tf.Example``-like records as rows: one value per named feature, or one vector."""
        names = self.feature_names
        if names is not None:
            rows = []
            for i, ex in enumerate(examples):
                if set(ex) != set(names):
                    raise BadRequest(f"examples[{i}]: expected features {names}, found {sorted(ex)}")
                rows.append([_scalar(ex[n], f"examples[{i}].{n}") for n in names])
            return self.matrix(np.asarray(rows, dtype=object if _any_text(rows) else None))
        rows = []
        for i, ex in enumerate(examples):
            if len(ex) != 1:
                raise BadRequest(
                    f"examples[{i}]: this model was fitted without feature names; send each example "
                    "as one feature holding the row, e.g. {\"inputs\": [v1, v2, ...]}"
                )
            rows.append([_text(v) for v in next(iter(ex.values()))])
        try:
            return self.matrix(np.asarray(rows))
        except ValueError:
            raise BadRequest("examples hold rows of different lengths") from None


def _has_method(estimator: Any, name: str) -> bool:
    try:
        return callable(getattr(estimator, name))
    except AttributeError:  # sklearn hides methods a configuration lacks (e.g. SVC without probability)
        return False


def _column(value: np.ndarray, name: str) -> np.ndarray:
    value = np.asarray(value)
    if value.ndim == 2 and value.shape[1] == 1:
        value = value[:, 0]
    if value.ndim != 1:
        raise BadRequest(f"input {name!r}: expected one value per row, found shape {list(value.shape)}")
    return value


def _frame(columns: dict[str, np.ndarray], names: list[str]) -> Any:
    try:
        import pandas as pd
    except ImportError:  # without pandas, numeric columns still work
        return np.column_stack([columns[n] for n in names])
    return pd.DataFrame({n: columns[n] for n in names}, columns=names)


def _scalar(values: list[Any], where: str) -> Any:
    if len(values) != 1:
        raise BadRequest(f"{where}: expected one value, found {len(values)}")
    return _text(values[0])


def _text(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _any_text(rows: list[list[Any]]) -> bool:
    return any(isinstance(v, str) for row in rows for v in row)


def load_estimator(path: Path, options: dict[str, Any]) -> SklearnModel | None:
    """Load the first artifact found; ``None`` when the folder holds none."""
    for artifact in ARTIFACTS:
        file = path / artifact
        if file.is_file():
            break
    else:
        return None
    if file.suffix == ".skops":
        import skops.io

        trusted = options.get("trusted_types") or []
        untrusted = [t for t in skops.io.get_untrusted_types(file=file) if t not in trusted]
        if untrusted:
            raise ValueError(
                f"model.skops holds types that are not trusted: {', '.join(untrusted)}; "
                "list them under options.trusted_types in servekit.yaml if you trust them"
            )
        estimator = skops.io.load(file, trusted=trusted or None)
    else:
        import joblib  # pickle: trusted files only (documented)

        estimator = joblib.load(file)
    if not hasattr(estimator, "predict"):
        raise ValueError(f"{artifact} holds a {type(estimator).__name__}, which has no predict method")
    return SklearnModel(estimator, dict(options))
