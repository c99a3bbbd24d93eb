"""A loaded LightGBM ``Booster``: what it computes, read once at load, and the calls per signature.

The objective line of the model file (``objective=binary sigmoid:1``,
``objective=multiclass num_class:3``, ``objective=regression``) says what
``Booster.predict`` answers and so which signatures exist; ``feature_names``
says what rows it takes.  Names LightGBM made up itself (``Column_0``, ...)
are not the client's names, so such a model takes one tensor of rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from servekit import cpus_per_worker, example_rows, feature_rows
from servekit.errors import BadRequest
from servekit.types import CLASSIFY_METHOD, REGRESS_METHOD, ModelConfig, ModelMetadata, Signature, TensorSpec

CLASSIFIERS = ("binary", "multiclass", "multiclassova")
#: objectives whose ``predict`` is class probabilities (binary: of class 1)
PROBABILITY_OBJECTIVES = ("binary", "multiclass")
#: signature name -> output name and the ``Booster.predict`` keywords
CALLS: dict[str, dict[str, Any]] = {
    "serving_default": {},
    "predict_proba": {},
    "predict_raw": {"raw_score": True},
}
OUTPUTS = {"serving_default": "predict", "predict_proba": "predict_proba", "predict_raw": "predict_raw"}


@dataclass
class LightGBMModel:
    booster: Any
    file_name: str
    objective: str
    n_features: int
    n_classes: int  # models per iteration: 1 except for multiclass
    feature_names: list[str] | None
    threads: int
    classes: list[str] = field(default_factory=list)
    #: NaN is a missing value (LightGBM's own reading); ``options.allow_nan: false`` refuses it instead
    allow_nan: bool = True

    @property
    def is_classifier(self) -> bool:
        return self.objective in CLASSIFIERS

    def signatures(self) -> list[str]:
        names = ["serving_default"]
        if self.objective in PROBABILITY_OBJECTIVES:
            names.append("predict_proba")
        names.append("predict_raw")
        return names

    # -- describing ------------------------------------------------------------------

    def describe(self) -> ModelMetadata:
        # LightGBM computes in float64, so FP64 inputs are what it sees; NaN is a missing value
        if self.feature_names:
            inputs = [TensorSpec(name, "FP64", [-1], allow_nan=self.allow_nan) for name in self.feature_names]
        else:
            inputs = [TensorSpec("input", "FP64", [-1, self.n_features], allow_nan=self.allow_nan)]
        signatures = {s: Signature(inputs=inputs, outputs=[self._output_spec(s)]) for s in self.signatures()}
        if "predict_proba" in signatures:
            k = len(self.classes)
            signatures["classification"] = Signature(
                inputs=inputs,
                outputs=[TensorSpec("classes", "BYTES", [-1, k]), TensorSpec("scores", "FP32", [-1, k])],
                method_name=CLASSIFY_METHOD,
            )
        elif not self.is_classifier:
            signatures["regression"] = Signature(
                inputs=inputs, outputs=[TensorSpec("outputs", "FP32", [-1])], method_name=REGRESS_METHOD
            )
        return ModelMetadata(signatures=signatures, platform="lightgbm")

    def _output_spec(self, signature: str) -> TensorSpec:
        name = OUTPUTS[signature]
        if signature == "predict_proba":
            return TensorSpec(name, "FP64", [-1, max(2, self.n_classes)])
        return TensorSpec(name, "FP64", [-1, self.n_classes] if self.n_classes > 1 else [-1])

    # -- inference ---------------------------------------------------------------------

    def rows(self, inputs: Any) -> np.ndarray:
        return feature_rows(inputs, self.feature_names, self.n_features)

    def example_rows(self, examples: list[dict[str, list[Any]]]) -> np.ndarray:
        return example_rows(examples, self.feature_names, self.n_features)

    def predict(self, inputs: Any, signature_name: str | None) -> dict[str, np.ndarray]:
        signature = signature_name or "serving_default"
        if signature not in self.signatures():
            raise BadRequest(f"unknown signature {signature!r}; this model has {', '.join(self.signatures())}")
        return {OUTPUTS[signature]: self.call(signature, self.rows(inputs))}

    def call(self, signature: str, X: np.ndarray) -> np.ndarray:
        out = self.booster.predict(X, num_threads=self.threads, **CALLS[signature])
        if signature == "predict_proba" and self.objective == "binary":
            return np.column_stack([1 - out, out])
        return out

    def classify(self, X: np.ndarray) -> list[list[tuple[str, float]]]:
        if self.objective not in PROBABILITY_OBJECTIVES:
            raise BadRequest(f"objective {self.objective} gives no class probabilities, so :classify cannot score")
        scores = self.call("predict_proba", X)
        return [list(zip(self.classes, row.tolist())) for row in scores]

    def regress(self, X: np.ndarray) -> list[float]:
        if self.is_classifier:
            raise BadRequest(f"objective {self.objective} is a classifier's; use :classify")
        return self.call("serving_default", X).astype(float).reshape(len(X), -1)[:, 0].tolist()

    def contributions(self, X: np.ndarray) -> dict[str, np.ndarray]:
        """LightGBM's TreeSHAP values: ``attributions`` per feature and ``base_values``, summing to the raw score."""
        contribs = np.asarray(self.booster.predict(X, pred_contrib=True, num_threads=self.threads))
        if self.n_classes > 1:  # one block of (features + 1) per class, side by side
            contribs = contribs.reshape(len(X), self.n_classes, self.n_features + 1)
        return {"attributions": contribs[..., :-1], "base_values": np.ascontiguousarray(contribs[..., -1])}


def load_booster(file: Path, config: ModelConfig) -> LightGBMModel:
    """Read ``file`` with ``lightgbm.Booster``; a ValueError naming the file when it is not a model."""
    import lightgbm

    try:
        booster = lightgbm.Booster(model_file=str(file))
    except lightgbm.basic.LightGBMError as exc:
        raise ValueError(f"{file.name}: not a model LightGBM can read ({exc})") from exc
    objective = _objective(file)
    names = [str(n) for n in booster.feature_name()]
    if names == [f"Column_{i}" for i in range(len(names))]:
        names = []
    n_classes = booster.num_model_per_iteration()
    width = max(2, n_classes) if objective in CLASSIFIERS else 0
    classes = [str(c) for c in config.options.get("classes", range(width))]
    if width and len(classes) != width:
        raise ValueError(f"options.classes has {len(classes)} labels; the model has {width} classes")
    threads = int(config.options.get("num_threads") or cpus_per_worker())
    allow_nan = config.options.get("allow_nan", True)
    if not isinstance(allow_nan, bool):
        raise ValueError(f"options.allow_nan must be true or false, found {allow_nan!r}")
    return LightGBMModel(
        booster,
        file.name,
        objective,
        booster.num_feature(),
        n_classes,
        names or None,
        threads,
        classes,
        allow_nan=allow_nan,
    )


def _objective(file: Path) -> str:
    """The objective's name from the model file's header (``objective=binary sigmoid:1`` -> ``binary``)."""
    with file.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("objective="):
                return line.partition("=")[2].split()[0] if line.partition("=")[2].split() else "custom"
            if line.startswith("Tree="):  # past the header: a model trained with a custom objective
                break
    return "custom"
