"""MLflow plugin: an MLflow model folder (``MLmodel`` beside the flavor's files).

A flavor that a servekit plugin serves natively (``sklearn``, ``xgboost``,
``lightgbm``, ``onnx``) loads through that plugin, found by its entry point,
with the flavor's data file as its artifact: the model answers exactly as the
same file would on its own, with that plugin's signatures, metadata and
explanations, and needs no mlflow installed.  Any other flavor loads through
``mlflow.pyfunc`` (``pip install servekit[mlflow]``), described by the
model's MLflow signature.  See ``docs/frameworks.md``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import servekit

from .mlmodel import MLMODEL, read_mlmodel
from .served import MlflowModel

log = logging.getLogger("servekit.mlflow")


@servekit.hookimpl
def load(path: Path, config: servekit.ModelConfig, name: str, version: int) -> MlflowModel | None:
    if not (path / MLMODEL).is_file() or config.options.get("artifact"):
        return None
    from .served import load_mlflow

    model = load_mlflow(path, read_mlmodel(path), config, name, version)
    log.info("loaded MLflow model %s (flavor %s, through %s)", path, model.flavor, model.served_by)
    return model


@servekit.hookimpl
def unload(model: MlflowModel) -> bool | None:
    return model.forward("unload")


@servekit.hookimpl
def metadata(model: MlflowModel, name: str, version: int) -> servekit.ModelMetadata | None:
    return model.describe(name=name, version=version)


@servekit.hookimpl
def predict(
    inputs: Any,
    parameters: dict[str, Any],
    model: MlflowModel,
    signature_name: str | None,
    output_names: list[str] | None,
    name: str,
    version: int,
) -> Any:
    if model.pyfunc is not None:
        return model.pyfunc.predict(inputs, parameters)
    return model.forward(
        "predict",
        inputs=inputs,
        parameters=parameters,
        signature_name=signature_name,
        output_names=output_names,
        name=name,
        version=version,
    )


@servekit.hookimpl
def explain(
    inputs: Any, parameters: dict[str, Any], model: MlflowModel, signature_name: str | None, name: str, version: int
) -> Any:
    return model.forward(
        "explain", inputs=inputs, parameters=parameters, signature_name=signature_name, name=name, version=version
    )


@servekit.hookimpl
def classify(
    examples: Any, parameters: dict[str, Any], model: MlflowModel, signature_name: str | None, name: str, version: int
) -> Any:
    return model.forward(
        "classify", examples=examples, parameters=parameters, signature_name=signature_name, name=name, version=version
    )


@servekit.hookimpl
def regress(
    examples: Any, parameters: dict[str, Any], model: MlflowModel, signature_name: str | None, name: str, version: int
) -> Any:
    return model.forward(
        "regress", examples=examples, parameters=parameters, signature_name=signature_name, name=name, version=version
    )
