"""Request tensors as the feature matrix of a tabular model (gradient-boosted trees).

A tabular model takes rows of numeric features, in its own feature order.
Clients send them three ways, and every protocol can carry each:

- one tensor of rows, ``(rows, features)`` (V1 ``instances``, a V2/Triton or
  TF Serving tensor under any name);
- one tensor per feature, named as the model names its features
  (V1 ``instances`` of objects, V2 inputs named ``age``, ``income``, ...);
- ``tf.Example``-like records (``:classify``, ``:regress``).

Values are checked here, before the model sees them, so a client's mistake (a
string, a ragged row, the wrong width, infinity) is a 400 naming what was
wrong; NaN passes, because tree boosters read it as a missing value.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from servekit.errors import BadRequest


def feature_rows(inputs: Any, names: list[str] | None, n_features: int | None) -> np.ndarray:
    """``inputs`` (one array, or named arrays) as a numeric ``(rows, n_features)`` array."""
    if isinstance(inputs, dict):
        if names and set(inputs) == set(names):
            columns = [_column(inputs[n], n) for n in names]
            if len({len(c) for c in columns}) > 1:
                raise BadRequest(f"inputs {names} must have one value per row each")
            return _checked(np.column_stack(columns), "inputs", names)
        if len(inputs) != 1:
            expected = f"one tensor of rows, or one input per feature {names}" if names else "one tensor of rows"
            raise BadRequest(f"expected {expected}; found inputs {sorted(inputs)}")
        label, value = next(iter(inputs.items()))
        return _matrix(np.asarray(value), f"input {label!r}", names, n_features)
    return _matrix(np.asarray(inputs), "input", names, n_features)


def example_rows(examples: list[dict[str, list[Any]]], names: list[str] | None, n_features: int | None) -> np.ndarray:
    """``tf.Example``-like records as rows: one value per named feature, or one feature holding the row."""
    rows = []
    for i, example in enumerate(examples):
        if names and set(example) == set(names):
            rows.append([_one(example[n], f"examples[{i}].{n}") for n in names])
        elif len(example) == 1:
            rows.append(list(next(iter(example.values()))))
        else:
            expected = f"features {names}" if names else "one feature holding the row"
            raise BadRequest(f"examples[{i}]: expected {expected}, found {sorted(example)}")
    if len({len(r) for r in rows}) > 1:
        raise BadRequest("examples hold rows of different lengths")
    return _matrix(np.asarray(rows, dtype=object), "examples", names, n_features)


def _matrix(X: np.ndarray, label: str, names: list[str] | None, n_features: int | None) -> np.ndarray:
    if X.ndim == 1 and n_features == 1:
        X = X.reshape(-1, 1)
    if X.ndim != 2:
        raise BadRequest(f"{label}: expected rows of features (2 dimensions), found shape {list(X.shape)}")
    if n_features is not None and X.shape[1] != n_features:
        raise BadRequest(f"{label}: expected rows of {n_features} features, found rows of {X.shape[1]}")
    return _checked(X, label, names)


def _column(value: Any, name: str) -> np.ndarray:
    value = np.asarray(value)
    if value.ndim == 2 and value.shape[1] == 1:
        value = value[:, 0]
    if value.ndim != 1:
        raise BadRequest(f"input {name!r}: expected one value per row, found shape {list(value.shape)}")
    return value


def _checked(X: np.ndarray, label: str, names: list[str] | None) -> np.ndarray:
    """Numbers only (booleans count), no infinity; float32 stays float32, the rest becomes float64."""
    if X.dtype.kind not in "biuf":
        try:
            X = X.astype(np.float64)
        except (TypeError, ValueError):
            raise BadRequest(f"{label}: expected numbers, found {_first_non_number(X)}") from None
    elif X.dtype != np.float32:
        X = X.astype(np.float64)
    infinite = np.argwhere(np.isinf(X))
    if len(infinite):
        row, col = (int(v) for v in infinite[0])
        where = names[col] if names and col < len(names) else f"column {col}"
        raise BadRequest(f"{label}: row {row}, {where} is infinite; send NaN for a missing value")
    return np.ascontiguousarray(X)


def _first_non_number(X: np.ndarray) -> str:
    for value in X.reshape(-1):
        try:
            float(value)
        except (TypeError, ValueError):
            return repr(value.decode("utf-8", "replace") if isinstance(value, bytes) else value)
    return "values that are not numbers"


def _one(values: list[Any], where: str) -> Any:
    if len(values) != 1:
        raise BadRequest(f"{where}: expected one value, found {len(values)}")
    return values[0]
