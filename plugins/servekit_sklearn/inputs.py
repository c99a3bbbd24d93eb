"""What a fitted estimator accepts, read once at load, and request values checked against it.

scikit-learn refuses a string in a numeric model, and NaN in most models, with a
ValueError from deep inside ``predict``; reported as the model failing, that
would be a 500 for what is the client's mistake.  So the values are checked
here, before the call, and refused with a 400 that names the input, the row
and the column.

Whether an estimator accepts NaN is its ``allow_nan`` tag, but composites do not
say it right: a Pipeline that starts with a SimpleImputer is tagged
``allow_nan=False``.  So composites are walked step by step, and wherever the
walk cannot tell (a third-party estimator, a ColumnTransformer mixing
imputers and scalers, a transformer that may encode NaN), NaN is let through:
a wrong 400 would refuse a request the model can answer, while a missed one
only leaves scikit-learn's own error in place.  Strings are refused only when
every estimator in the model is a scikit-learn family known to take numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np
from servekit.errors import BadRequest

#: scikit-learn families whose estimators validate ``X`` as numbers (``check_array(dtype="numeric")``)
NUMERIC_MODULES = tuple(
    f"sklearn.{m}"
    for m in (
        "linear_model",
        "ensemble",
        "tree",
        "svm",
        "neighbors",
        "naive_bayes",
        "neural_network",
        "cluster",
        "decomposition",
        "discriminant_analysis",
        "gaussian_process",
        "kernel_ridge",
        "cross_decomposition",
        "kernel_approximation",
        "random_projection",
        "preprocessing._data",
        "preprocessing._polynomial",
        "mixture",
        "covariance",
        "semi_supervised",
    )
)
#: composites: what they accept is what their parts accept
COMPOSITE_MODULES = tuple(
    f"sklearn.{m}"
    for m in (
        "pipeline",
        "compose",
        "multiclass",
        "multioutput",
        "calibration",
        "model_selection",
        "ensemble",
    )
)
#: transformers that keep NaN where it was (so the next step decides)
NAN_PRESERVING = ("sklearn.preprocessing._data",)


class Nan(Enum):
    """What a step does with NaN in its input."""

    REFUSES = "refuses"
    REMOVES = "removes"  # an imputer: later steps never see it
    PASSES = "passes"  # accepted, and either answered or passed on in place
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Accepts:
    """The values an estimator takes, decided once at load."""

    numbers_only: bool
    finite_only: bool  # NaN and infinity refused (scikit-learn's ``ensure_all_finite=True``)
    model: str  # the estimator's class name, for messages

    @classmethod
    def of(cls, estimator: Any) -> Accepts:
        return cls(
            numbers_only=_numbers_only(estimator),
            finite_only=_nan(estimator) is Nan.REFUSES,
            model=type(estimator).__name__,
        )

    @property
    def checks_values(self) -> bool:
        return self.numbers_only or self.finite_only

    def check(self, X: np.ndarray, label: str, names: list[str] | None = None) -> np.ndarray:
        """``X`` (rows by features) checked, strings refused, as scikit-learn will see it.

        :param label: how the request named the tensor, e.g. ``"input 'x'"``
        :param names: feature names, when the columns came as named inputs
        """
        return self.finite(self.numbers(X, label, names), label, names)

    def numbers(self, X: np.ndarray, label: str, names: list[str] | None = None) -> np.ndarray:
        """``X`` as numbers (an object array of numbers becomes float64, as scikit-learn makes it)."""
        if self.numbers_only and X.dtype.kind not in "biufc":
            return _as_numbers(X, label, names)
        return X

    def finite(self, X: np.ndarray, label: str, names: list[str] | None = None) -> np.ndarray:
        if self.finite_only and X.dtype.kind in "fc" and not np.isfinite(X).all():
            self._refuse_non_finite(X, label, names)
        return X

    def _refuse_non_finite(self, X: np.ndarray, label: str, names: list[str] | None) -> None:
        row, col = (int(i) for i in np.argwhere(~np.isfinite(X))[0])
        where, at = _locate(label, names, row, col)
        if np.isnan(X[row, col]):
            raise BadRequest(
                f"{where} contains NaN {at}; the model ({self.model}) does not accept missing values: "
                "send numbers, or serve a model that fills them in (e.g. a Pipeline with a SimpleImputer)"
            )
        raise BadRequest(f"{where} contains infinity {at}; the model ({self.model}) takes only finite numbers")


def _as_numbers(X: np.ndarray, label: str, names: list[str] | None) -> np.ndarray:
    if X.dtype.kind == "O":
        text = np.frompyfunc(lambda v: isinstance(v, (str, bytes)), 1, 1)(X).astype(bool)
        if not text.any():
            try:  # what scikit-learn's check_array does with an object array of numbers
                return X.astype(np.float64)
            except (TypeError, ValueError):
                text = ~np.frompyfunc(_is_number, 1, 1)(X).astype(bool)
    else:  # str or bytes arrays: every cell is text
        text = np.ones(X.shape, dtype=bool)
    row, col = (int(i) for i in np.argwhere(text)[0])
    where, at = _locate(label, names, row, col)
    raise BadRequest(f"{where}: expected numbers, found {_show(X[row, col])} {at}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, complex, np.number, np.bool_)) and not isinstance(value, str)


def _show(value: Any) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    return f"a {type(value).__name__} ({str(value)[:40]})"


def _locate(label: str, names: list[str] | None, row: int, col: int) -> tuple[str, str]:
    if names is not None:
        return f"input {names[col]!r}", f"at row {row}"
    return label, f"at row {row} column {col}"


def text_features(estimator: Any, names: list[str]) -> set[str]:
    """The features that may hold strings: every one, unless a ColumnTransformer says which.

    A model that takes strings (a OneHotEncoder behind a ColumnTransformer) declares
    those features ``BYTES`` and the rest ``FP64``, so servekit's value checks refuse
    a string only where the model takes numbers.
    """
    if _numbers_only(estimator):
        return set()
    first = estimator
    how, parts = _children(estimator)
    if how == "sequence" and parts:
        first, rest = parts[0], parts[1:]
    else:
        rest = []
    transformers = getattr(first, "transformers_", None)
    if not isinstance(transformers, list):
        return set(names)
    after_numeric = all(_numbers_only(p) for p in rest)
    text: set[str] = set()
    for _, transformer, columns in transformers:
        if transformer == "drop":
            continue
        if transformer == "passthrough" and after_numeric:
            continue
        if transformer != "passthrough" and _numbers_only(transformer):
            continue
        selected = _column_names(columns, names)
        if selected is None:
            return set(names)
        text |= selected
    return text


def _column_names(columns: Any, names: list[str]) -> set[str] | None:
    """A ColumnTransformer's column selection as feature names; ``None`` when it cannot tell."""
    if isinstance(columns, (str, int, np.integer)):
        columns = [columns]
    try:
        picked = list(columns)
    except TypeError:  # a callable selector
        return None
    if picked and all(isinstance(c, (bool, np.bool_)) for c in picked):
        return {n for n, keep in zip(names, picked) if keep}
    out = set()
    for column in picked:
        if isinstance(column, str) and column in names:
            out.add(column)
        elif isinstance(column, (int, np.integer)) and -len(names) <= int(column) < len(names):
            out.add(names[int(column)])
        else:
            return None
    return out


# -- reading the estimator, once --------------------------------------------------


def _module(estimator: Any) -> str:
    return type(estimator).__module__ or ""


def _children(estimator: Any) -> tuple[str, list[Any]]:
    """A composite's parts and how they see ``X``: ``"sequence"``, ``"columns"`` or ``"all"``."""
    steps = getattr(estimator, "steps", None)
    if isinstance(steps, list) and _module(estimator).startswith("sklearn.pipeline"):
        return "sequence", [s for _, s in steps if s is not None and not _is_passthrough(s)]
    transformers = getattr(estimator, "transformers_", None)
    if isinstance(transformers, list):
        return "columns", [t for _, t, _ in transformers]
    parts = []
    try:
        params = estimator.get_params(deep=False)
    except Exception:  # not a scikit-learn estimator
        return "all", []
    for key, value in params.items():
        if key == "final_estimator":  # a stack's final estimator sees predictions, not X
            continue
        if hasattr(value, "fit"):
            parts.append(value)
        elif isinstance(value, list):
            parts += [v[1] for v in value if isinstance(v, tuple) and len(v) == 2 and hasattr(v[1], "fit")]
    return "all", parts


def _is_passthrough(step: Any) -> bool:
    return isinstance(step, str) and step == "passthrough"


def _numbers_only(estimator: Any) -> bool:
    if isinstance(estimator, str):  # "passthrough" hands values on; "drop" ignores them, strings included
        return estimator == "passthrough"
    how, parts = _children(estimator)
    module = _module(estimator)
    if parts or how != "all":
        return module.startswith(COMPOSITE_MODULES) and all(_numbers_only(p) for p in parts)
    if np.any(getattr(estimator, "is_categorical_", None) or False):  # HistGradientBoosting categories
        return False
    if module.startswith("sklearn.impute"):  # these two strategies impute strings too
        return getattr(estimator, "strategy", None) not in ("most_frequent", "constant")
    return module.startswith(NUMERIC_MODULES)


def _nan(estimator: Any) -> Nan:
    if isinstance(estimator, str):
        return Nan.PASSES if estimator == "passthrough" else Nan.REMOVES  # "drop"
    how, parts = _children(estimator)
    if how == "sequence":
        for part in parts:
            state = _nan(part)
            if state is not Nan.PASSES:
                return state
        return Nan.PASSES
    if parts or how == "columns":
        return _combine([_nan(p) for p in parts], by_column=how == "columns")
    return _leaf_nan(estimator)


def _combine(states: list[Nan], *, by_column: bool) -> Nan:
    if not states:
        return Nan.UNKNOWN
    if len(set(states)) == 1:
        return states[0]
    if by_column:  # each part sees some columns: NaN may be in a column an imputer fills
        return Nan.UNKNOWN
    if Nan.REFUSES in states:  # every part sees every column
        return Nan.REFUSES
    return Nan.UNKNOWN if Nan.UNKNOWN in states else Nan.PASSES


def _leaf_nan(estimator: Any) -> Nan:
    module = _module(estimator)
    if not module.startswith("sklearn."):
        return Nan.UNKNOWN  # third-party tags are not to be relied on
    allow = _allow_nan_tag(estimator)
    if allow is None:
        return Nan.UNKNOWN
    if not allow:
        return Nan.REFUSES
    if module.startswith("sklearn.impute"):
        return Nan.REMOVES
    if module.startswith(NAN_PRESERVING) or not hasattr(estimator, "transform"):
        return Nan.PASSES
    return Nan.UNKNOWN  # a transformer that takes NaN may encode it (OneHotEncoder) or keep it


def _allow_nan_tag(estimator: Any) -> bool | None:
    try:
        from sklearn.utils import get_tags  # scikit-learn >= 1.6
    except ImportError:
        get_tags = None
    try:
        if get_tags is not None:
            return bool(get_tags(estimator).input_tags.allow_nan)
        return bool(estimator._get_tags()["allow_nan"])  # older scikit-learn
    except Exception:
        return None
