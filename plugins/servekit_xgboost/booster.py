"""A loaded XGBoost ``Booster``: what it computes, read once at load, and the calls per signature.

The objective (``binary:logistic``, ``multi:softprob``, ``reg:squarederror``,
...) says what ``Booster.predict`` answers and so which signatures exist; the
feature names and count say what rows it takes.  All of it is in the saved
model (``save_config``), so nothing is guessed from a probe call.

Predictions go through XGBoost's in-place prediction (:mod:`.dense`: what
``inplace_predict`` answers, without its per-call Python overhead), which
answers what ``predict(DMatrix(X))`` answers without building a DMatrix per
request; contributions need the DMatrix (``pred_contribs`` is not an in-place
option).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from servekit import cpus_per_worker, example_rows, feature_rows
from servekit.errors import BadRequest
from servekit.types import CLASSIFY_METHOD, REGRESS_METHOD, ModelConfig, ModelMetadata, Signature, TensorSpec

from .dense import DensePredict

#: objectives whose ``predict`` is class probabilities (binary: of class 1)
PROBABILITY_OBJECTIVES = ("binary:logistic", "multi:softprob")
#: signature name -> whether it answers the margin (``inplace_predict(predict_type="margin")``)
MARGIN = {"serving_default": False, "predict_proba": False, "predict_margin": True}
OUTPUTS = {"serving_default": "predict", "predict_proba": "predict_proba", "predict_margin": "predict_margin"}


@dataclass
class XGBoostModel:
    booster: Any
    file_name: str
    objective: str
    n_features: int
    n_classes: int
    feature_names: list[str] | None
    classes: list[str] = field(default_factory=list)
    #: NaN is a missing value (XGBoost's own reading); ``options.allow_nan: false`` refuses it instead
    allow_nan: bool = True
    dense: DensePredict = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.dense = DensePredict(self.booster)

    @property
    def is_classifier(self) -> bool:
        return self.objective.startswith(("binary:", "multi:"))

    def signatures(self) -> list[str]:
        names = ["serving_default"]
        if self.objective in PROBABILITY_OBJECTIVES:
            names.append("predict_proba")
        names.append("predict_margin")
        return names

    # -- describing ------------------------------------------------------------------

    def describe(self) -> ModelMetadata:
        inputs = self._input_specs()
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
        return ModelMetadata(signatures=signatures, platform="xgboost")

    def _input_specs(self) -> list[TensorSpec]:
        # XGBoost computes in float32 (a DMatrix holds float32), so FP32 loses nothing; NaN is a missing value
        if self.feature_names:
            return [TensorSpec(name, "FP32", [-1], allow_nan=self.allow_nan) for name in self.feature_names]
        return [TensorSpec("input", "FP32", [-1, self.n_features], allow_nan=self.allow_nan)]

    def _output_spec(self, signature: str) -> TensorSpec:
        name = OUTPUTS[signature]
        per_class = self.objective.startswith("multi:") and not (
            signature == "serving_default" and self.objective == "multi:softmax"
        )
        if signature == "predict_proba":
            return TensorSpec(name, "FP32", [-1, max(2, self.n_classes)])
        return TensorSpec(name, "FP32", [-1, self.n_classes] if per_class else [-1])

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
        out = self.dense(X, MARGIN[signature])
        if signature == "predict_proba" and self.objective == "binary:logistic":
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
        """XGBoost's TreeSHAP values: ``attributions`` per feature and ``base_values``, summing to the margin."""
        import xgboost

        matrix = xgboost.DMatrix(X, feature_names=self.feature_names)
        contribs = self.booster.predict(matrix, pred_contribs=True)
        # the last column is the bias: the expected margin, the same for every row
        return {"attributions": contribs[..., :-1], "base_values": np.ascontiguousarray(contribs[..., -1])}


def load_booster(file: Path, config: ModelConfig) -> XGBoostModel:
    """Read ``file`` with ``xgboost.Booster``; a ValueError naming the file when it is not a model."""
    import xgboost

    try:
        booster = xgboost.Booster(model_file=str(file))
    except xgboost.core.XGBoostError as exc:
        raise ValueError(f"{file.name}: not a model XGBoost can read ({_first_line(exc)})") from exc
    booster.set_param(_params(config))
    if config.device.startswith("cuda"):
        _check_gpu(booster, config.device)
    learner = json.loads(booster.save_config())["learner"]
    objective = learner["objective"]["name"]
    n_classes = int(learner["learner_model_param"].get("num_class", "0") or 0)
    names = list(booster.feature_names) if booster.feature_names else None
    width = max(2, n_classes) if objective.startswith(("binary:", "multi:")) else 0
    classes = [str(c) for c in config.options.get("classes", range(width))]
    if width and len(classes) != width:
        raise ValueError(f"options.classes has {len(classes)} labels; the model has {width} classes")
    allow_nan = config.options.get("allow_nan", True)
    if not isinstance(allow_nan, bool):
        raise ValueError(f"options.allow_nan must be true or false, found {allow_nan!r}")
    return XGBoostModel(
        booster, file.name, objective, booster.num_features(), n_classes, names, classes, allow_nan=allow_nan
    )


def _params(config: ModelConfig) -> dict[str, Any]:
    """Threads from the worker's share of the CPUs (``options.nthread`` overrides); the device asked for."""
    params: dict[str, Any] = {"nthread": int(config.options.get("nthread") or cpus_per_worker())}
    if config.device.startswith("cuda"):
        params["device"] = config.device
    return params


def _check_gpu(booster: Any, device: str) -> None:
    """Fail the load when ``device: cuda`` cannot be had: XGBoost itself would warn and run on the CPU."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # XGBoost's own "changed from GPU to CPU" warning: said below
        booster.inplace_predict(np.zeros((1, booster.num_features()), dtype=np.float32))
    used = json.loads(booster.save_config())["learner"]["generic_param"].get("device", "cpu")
    if not used.startswith("cuda"):
        raise ValueError(
            f"device {device!r} was requested but XGBoost found no GPU (it runs on {used}); use auto or cpu"
        )


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
