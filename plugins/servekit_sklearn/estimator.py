"""Loading a fitted estimator and mapping request tensors to its feature matrix.

Everything a fitted estimator cannot change (its features, classes, methods,
what values it accepts, how each method is best called) is read once, when the
model loads; a request pays for its own checks and the model call only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from servekit import numpy_to_v2
from servekit.errors import BadRequest
from servekit.types import CLASSIFY_METHOD, ModelMetadata, Signature, TensorSpec

from .artifacts import read_artifact
from .calls import Call, bind
from .inputs import Accepts, text_features

ARTIFACTS = ("model.skops", "model.joblib", "model.pkl")
#: How scikit-learn's input validation words a value it refuses (``check_array``).
_REFUSED_VALUES = ("contains infinity", "contains NaN", "value too large for dtype")
#: signatures beyond ``serving_default`` (``predict``, or ``transform`` for a transformer)
EXTRA_METHODS = ("predict_proba", "decision_function", "transform")


@dataclass
class SklearnModel:
    estimator: Any
    options: dict[str, Any]
    # A fitted estimator does not change: these are read once, not per request.
    is_classifier: bool = field(init=False)
    feature_names: list[str] | None = field(init=False)
    n_features: int | None = field(init=False)
    accepts: Accepts = field(init=False)
    allow_nan: bool = field(init=False)
    _methods: dict[str, str] = field(init=False, repr=False)
    _calls: dict[str, Call] = field(init=False, repr=False)
    #: methods called through a shortcut (see :mod:`servekit_sklearn.calls`)
    shortcuts: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        estimator = self.estimator
        self.is_classifier = hasattr(estimator, "classes_")
        names = getattr(estimator, "feature_names_in_", None)
        self.feature_names = [str(n) for n in names] if names is not None else None
        self.n_features = getattr(estimator, "n_features_in_", None)
        self.accepts = Accepts.of(estimator)
        allow_nan = self.options.get("allow_nan", not self.accepts.finite_only)
        if not isinstance(allow_nan, bool):
            raise ValueError(f"options.allow_nan must be true or false, found {allow_nan!r}")
        #: NaN declared as taken: where the estimator takes it, or servekit cannot tell (``options.allow_nan``)
        self.allow_nan = allow_nan and not self.accepts.finite_only
        default = "predict" if _has_method(estimator, "predict") else "transform"
        self._methods = {"serving_default": default}
        for method in EXTRA_METHODS:
            if method != default and _has_method(estimator, method):
                self._methods[method] = method
        arrays = self.accepts.numbers_only or self.feature_names is None
        methods = sorted(set(self._methods.values()))
        self._calls, self.shortcuts = bind(estimator, methods, self.feature_names, self.n_features, arrays=arrays)

    def methods(self) -> dict[str, str]:
        """Signature name -> estimator method."""
        return self._methods

    def call(self, method: str, X: Any) -> Any:
        """The estimator's ``method`` on rows from :meth:`rows`, by the cheapest equal path."""
        return self._calls[method](X)

    # -- describing --------------------------------------------------------------

    def describe(self) -> ModelMetadata:
        allow_nan = self.allow_nan
        if self.feature_names:
            text = text_features(self.estimator, self.feature_names)
            inputs = [
                TensorSpec(name, "BYTES" if name in text else "FP64", [-1], allow_nan=allow_nan)
                for name in self.feature_names
            ]
        else:
            datatype = "FP64" if self.accepts.numbers_only else "BYTES"
            shape = [-1, self.n_features] if self.n_features else None
            inputs = [TensorSpec("input", datatype, shape, allow_nan=allow_nan)]
        signatures = {}
        for signature, method in self.methods().items():
            signatures[signature] = Signature(inputs=inputs, outputs=[self._output_spec(method)])
        if self.is_classifier and "predict_proba" in signatures:
            signatures["classification"] = Signature(
                inputs=inputs,
                outputs=[
                    TensorSpec("classes", "BYTES", [-1, len(self.estimator.classes_)]),
                    TensorSpec(
                        "scores",
                        "FP32",
                        [-1, len(self.estimator.classes_)],
                        labels=[str(c) for c in self.estimator.classes_],
                    ),
                ],
                method_name=CLASSIFY_METHOD,
            )
        return ModelMetadata(signatures=signatures, platform="sklearn")

    def _output_spec(self, method: str) -> TensorSpec:
        if method == "predict":
            if self.is_classifier:
                return TensorSpec("predict", numpy_to_v2(np.asarray(self.estimator.classes_).dtype), [-1])
            n_outputs = getattr(self.estimator, "n_outputs_", 1)
            return TensorSpec("predict", "FP64", [-1] if n_outputs == 1 else [-1, n_outputs])
        width = len(self.estimator.classes_) if self.is_classifier and method != "transform" else -1
        if method == "decision_function" and width == 2:
            return TensorSpec(method, "FP64", [-1])
        # a class per column: Triton's classification extension names them
        labels = [str(c) for c in self.estimator.classes_] if width > 0 else None
        return TensorSpec(method, "FP64", [-1, width], labels=labels)

    # -- inference -------------------------------------------------------------------

    def predict(self, inputs: Any, signature_name: str | None) -> dict[str, np.ndarray]:
        method = self._methods.get(signature_name or "serving_default")
        if method is None:
            raise BadRequest(f"unknown signature {signature_name!r}; this model has {', '.join(self._methods)}")
        return {method: self._checked_call(method, self.rows(inputs))}

    def classify(self, X: Any) -> list[list[tuple[str, float]]]:
        if "predict_proba" not in self._calls:
            raise BadRequest("this model has no predict_proba, so :classify cannot score classes")
        labels = [str(c) for c in self.estimator.classes_]
        scores = self._checked_call("predict_proba", X)
        return [list(zip(labels, row.tolist())) for row in scores]

    def regress(self, X: Any) -> list[float]:
        if self.is_classifier:
            raise BadRequest("this model is a classifier; use :classify (regress needs a regressor)")
        if "predict" not in self._calls:
            raise BadRequest("this model has no predict method, so :regress cannot answer")
        return self._checked_call("predict", X).astype(float).tolist()

    def _checked_call(self, method: str, X: Any) -> Any:
        """The call; scikit-learn's own refusal of a value servekit let through (infinity sent to a
        model that takes NaN) is the client's mistake, a 400, not the model's failure."""
        try:
            return self._calls[method](X)
        except ValueError as exc:
            if any(phrase in str(exc) for phrase in _REFUSED_VALUES):
                raise BadRequest(f"the model refuses the input: {exc}") from None
            raise

    def matrix(self, inputs: Any) -> Any:
        """The ``X`` the estimator's own methods take: :meth:`rows`, as a DataFrame when fitted on one."""
        X = self.rows(inputs)
        if self.feature_names is not None and isinstance(X, np.ndarray):
            return _frame({n: X[:, i] for i, n in enumerate(self.feature_names)}, self.feature_names)
        return X

    def rows(self, inputs: Any, label: str = "input") -> Any:
        """Decoded request tensors as rows of features, checked against the estimator.

        One tensor per feature, by name, or one tensor of rows under any name (a
        ``[rows, features]`` tensor, as KServe's and MLServer's runtimes take it).
        An array in feature order where the model takes numbers (or has no feature
        names); a DataFrame of the named columns otherwise.
        """
        names = self.feature_names
        if not isinstance(inputs, dict):
            return self._rows_of(np.asarray(inputs), label)
        if names is None:
            if len(inputs) == 1:
                name, value = next(iter(inputs.items()))
                return self._rows_of(np.asarray(value), f"input {name!r}")
            raise BadRequest(
                f"this model was fitted without feature names, so named inputs {sorted(inputs)} "
                "cannot be ordered; send one unnamed tensor of rows"
            )
        if set(inputs) != set(names):
            if len(inputs) == 1:  # one tensor of rows under any name, as the tree boosters take it
                name, value = next(iter(inputs.items()))
                return self._rows_of(np.asarray(value), f"input {name!r}")
            raise BadRequest(f"expected one input per feature {names}, or one tensor of rows; found {sorted(inputs)}")
        columns = [_column(inputs[n], n) for n in names]
        if len({len(c) for c in columns}) > 1:
            raise BadRequest(
                f"inputs {names} must have one value per row each; found lengths {[len(c) for c in columns]}"
            )
        if not self.accepts.numbers_only:
            return _frame(dict(zip(names, columns)), names)
        checked = [self.accepts.numbers(c.reshape(-1, 1), "", [n]) for c, n in zip(columns, names)]
        return self.accepts.finite(np.column_stack(checked), "", names)

    def _rows_of(self, X: np.ndarray, label: str) -> Any:
        expected = self.n_features
        if X.ndim == 0:
            raise BadRequest("expected a list of rows, found a scalar")
        if X.ndim == 1 and expected is not None:
            if expected != 1:
                raise BadRequest(f"expected rows of {expected} features, found a list of scalars")
            X = X.reshape(-1, 1)
        if X.ndim > 2:
            raise BadRequest(f"expected rows of features (2 dimensions), found {X.ndim} dimensions")
        if expected is not None and X.shape[1] != expected:
            raise BadRequest(f"expected rows of {expected} features, found rows of {X.shape[1]}")
        names = self.feature_names
        if X.ndim == 2 and self.accepts.checks_values:
            X = self.accepts.check(X, label, names)
        if names is not None and not self.accepts.numbers_only:
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
            return self.rows(np.asarray(rows, dtype=object if _any_text(rows) else None), "examples")
        rows = []
        for i, ex in enumerate(examples):
            if len(ex) != 1:
                raise BadRequest(
                    f"examples[{i}]: this model was fitted without feature names; send each example "
                    'as one feature holding the row, e.g. {"inputs": [v1, v2, ...]}'
                )
            rows.append([_text(v) for v in next(iter(ex.values()))])
        try:
            return self.rows(np.asarray(rows, dtype=object if _any_text(rows) else None), "examples")
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


def _artifact(path: Path, options: dict[str, Any]) -> Path | None:
    """``options.artifact`` when it names a scikit-learn file, else the first of :data:`ARTIFACTS`.

    An MLflow model folder (``MLmodel``) holds a ``model.pkl`` or ``model.skops`` too: it is the
    MLflow plugin's, which reads the MLmodel and hands the file back here as ``options.artifact``.
    """
    explicit = options.get("artifact")
    if explicit:
        file = path / str(explicit)
        return file if file.is_file() and file.suffix in {Path(a).suffix for a in ARTIFACTS} else None
    if (path / "MLmodel").is_file():
        return None
    return next((path / a for a in ARTIFACTS if (path / a).is_file()), None)


def load_estimator(path: Path, options: dict[str, Any]) -> SklearnModel | None:
    """Load the first artifact found; ``None`` when the folder holds none."""
    file = _artifact(path, options)
    if file is None:
        return None
    artifact = file.name
    estimator = read_artifact(file, options)
    if not (_has_method(estimator, "predict") or _has_method(estimator, "transform")):
        raise ValueError(
            f"{artifact} holds a {type(estimator).__name__}, which has neither a predict nor a transform "
            "method; expected a fitted scikit-learn estimator"
        )
    return SklearnModel(estimator, dict(options))
