"""{{ cookiecutter.project_name }}: a scikit-learn classifier served by servekit.

servekit calls these hooks (see servekit's docs/hooks.md); each names only the
arguments it needs:

- ``load``      once per version folder (``1/``, ``2/``...): returns what the others get as ``model``
- ``metadata``  the inputs and outputs shown by ``/v1/models/NAME/metadata`` and V2 metadata
- ``predict``   where V1 ``:predict``, ``/predict``, V2 ``infer`` and gRPC all end

Remove this file and servekit's sklearn plugin serves ``1/model.joblib`` with
its default signatures instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import joblib
import numpy as np

import servekit
from servekit import BadRequest, ModelMetadata, Signature, TensorSpec

FEATURES = ["sepal_length", "sepal_width", "petal_length", "petal_width"]


@servekit.hookimpl
def load(path: Path) -> Any:
    # joblib files run code when loaded: serve only models you trained yourself.
    return joblib.load(path / "model.joblib")


@servekit.hookimpl
def metadata(model: Any) -> ModelMetadata:
    # servekit refuses NaN and infinity in these inputs (a 400 naming the row) before predict runs;
    # a model that reads NaN as a missing value (HistGradientBoostingClassifier, a Pipeline with a
    # SimpleImputer) says so with TensorSpec(..., allow_nan=True).
    signature = Signature(
        inputs=[TensorSpec("input", "FP64", [-1, len(FEATURES)])],
        outputs=[
            TensorSpec("label", "BYTES", [-1]),
            TensorSpec("probabilities", "FP64", [-1, len(model.classes_)]),
        ],
    )
    return ModelMetadata(signatures={"serving_default": signature}, platform="sklearn")


def features(inputs: Any) -> np.ndarray:
    """Rows of the four measurements: one unnamed tensor, an ``input`` tensor, or one tensor per feature."""
    if isinstance(inputs, dict):
        if set(FEATURES) <= set(inputs):
            inputs = np.column_stack([np.asarray(inputs[f], dtype=float) for f in FEATURES])
        elif "input" in inputs:
            inputs = inputs["input"]
        else:
            raise BadRequest(f"expected an input named 'input' or one per feature {FEATURES}, found {sorted(inputs)}")
    try:
        x = np.asarray(inputs, dtype=float)
    except (TypeError, ValueError):
        raise BadRequest("expected numbers for the four measurements") from None
    if x.ndim != 2 or x.shape[1] != len(FEATURES):
        raise BadRequest(f"expected rows of {len(FEATURES)} numbers ({', '.join(FEATURES)}), found shape {list(x.shape)}")
    return x


@servekit.hookimpl
def predict(inputs: Any, model: Any) -> dict[str, np.ndarray]:
    probabilities = model.predict_proba(features(inputs))
    labels = model.classes_[probabilities.argmax(axis=1)].astype(object)
    return {"label": labels, "probabilities": probabilities}
