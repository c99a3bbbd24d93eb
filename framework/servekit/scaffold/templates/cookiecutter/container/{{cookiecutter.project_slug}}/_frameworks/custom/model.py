"""{{ cookiecutter.project_name }}: your own model code, served by servekit.

A worked example of every hook a plain model needs, for a linear scorer kept in
``1/weights.json``.  Swap in your own loading and maths; keep the hook names.
servekit calls (see servekit's docs/hooks.md; each hook names only the
arguments it needs):

- ``load``      once per version folder (``1/``, ``2/``...): returns what the others get as ``model``
- ``metadata``  the inputs and outputs of each signature, for ``/metadata`` and V2
- ``predict``   V1 ``:predict``, ``/predict``, V2 ``infer`` and gRPC; the ``stream``
                signature returns a generator, which servekit streams as Server-Sent
                Events (``?stream=true``), one event per row
- ``explain``   V1 ``:explain``, ``/explain`` and V2 explain: what each feature added
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import servekit
from servekit import BadRequest, ModelMetadata, Signature, TensorSpec


@dataclass
class LinearScorer:
    features: list[str]
    weights: np.ndarray
    bias: float

    def score(self, x: np.ndarray) -> np.ndarray:
        return x @ self.weights + self.bias


@servekit.hookimpl
def load(path: Path) -> LinearScorer:
    raw = json.loads((path / "weights.json").read_text())
    return LinearScorer(raw["features"], np.asarray(raw["weights"], dtype=float), float(raw["bias"]))


@servekit.hookimpl
def metadata(model: LinearScorer) -> ModelMetadata:
    # servekit refuses NaN, infinity, strings and booleans in a declared number input before
    # predict runs (a 400 naming the row); TensorSpec(..., allow_nan=True) takes NaN as a missing value.
    inputs = [TensorSpec("input", "FP64", [-1, len(model.features)])]
    outputs = [TensorSpec("score", "FP64", [-1])]
    return ModelMetadata(
        signatures={
            "serving_default": Signature(inputs=inputs, outputs=outputs),
            "stream": Signature(inputs=inputs, outputs=outputs),
        },
        platform="custom",
    )


def rows(inputs: Any, model: LinearScorer) -> np.ndarray:
    """The request as rows of features: one unnamed tensor, ``input``, or one tensor per feature."""
    if isinstance(inputs, dict):
        if set(model.features) <= set(inputs):
            inputs = np.column_stack([np.asarray(inputs[f], dtype=float) for f in model.features])
        elif "input" in inputs:
            inputs = inputs["input"]
        else:
            raise BadRequest(f"expected 'input' or one input per feature {model.features}, found {sorted(inputs)}")
    try:
        x = np.asarray(inputs, dtype=float)
    except (TypeError, ValueError):
        raise BadRequest("expected numbers") from None
    if x.ndim != 2 or x.shape[1] != len(model.features):
        raise BadRequest(f"expected rows of {len(model.features)} numbers ({', '.join(model.features)}), found shape {list(x.shape)}")
    return x


@servekit.hookimpl
def predict(inputs: Any, model: LinearScorer, signature_name: str | None) -> Any:
    x = rows(inputs, model)
    if signature_name == "stream":
        return stream_scores(x, model)
    if signature_name not in (None, "serving_default"):
        raise BadRequest(f"unknown signature {signature_name!r}; use serving_default or stream")
    return {"score": model.score(x)}


def stream_scores(x: np.ndarray, model: LinearScorer) -> Iterator[dict[str, np.ndarray]]:
    """One result per row as soon as it is ready (think: a slow model, or tokens of an answer)."""
    for row in x:
        yield {"score": model.score(row[None, :])}


@servekit.hookimpl
def explain(inputs: Any, model: LinearScorer) -> dict[str, np.ndarray]:
    x = rows(inputs, model)
    return {"contributions": x * model.weights, "bias": np.full(len(x), model.bias)}
