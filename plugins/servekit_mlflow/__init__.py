"""MLflow plugin: an MLflow model folder (``MLmodel`` beside the flavor's files).

A flavor that a servekit plugin serves natively (``sklearn``, ``xgboost``,
``lightgbm``, ``onnx``) loads through that plugin, found by its entry point,
with the flavor's data file as its artifact: the model answers exactly as the
same file would on its own, with that plugin's signatures, metadata and
explanations, and needs no mlflow installed.  Any other flavor loads through
``mlflow.pyfunc`` (``pip install servekit[mlflow]``), described by the
model's MLflow signature.  ``options.model_uri`` (``models:/NAME/VERSION``, ...)
serves a model from an MLflow tracking server or registry instead of a local
folder (see :mod:`servekit_mlflow.registry`).  See ``docs/frameworks.md``.
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
    if config.options.get("artifact"):
        return None
    uri = config.options.get("model_uri")
    if (path / MLMODEL).is_file():
        folder, downloaded = path, None
    elif uri:
        from .registry import download

        folder, downloaded = download(str(uri), config.options)
    else:
        return None
    from .served import load_mlflow

    try:
        model = load_mlflow(folder, read_mlmodel(folder), config, name, version)
    except BaseException:
        _remove(downloaded)
        raise
    model.downloaded = downloaded
    log.info("loaded MLflow model %s (flavor %s, through %s)", uri or path, model.flavor, model.served_by)
    return model


@servekit.hookimpl
def unload(model: MlflowModel) -> bool | None:
    handled = model.forward("unload")
    _remove(model.downloaded)
    return handled or None


def _remove(folder: Path | None) -> None:
    if folder is not None:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


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
    sequence: Any,
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
        sequence=sequence,
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
