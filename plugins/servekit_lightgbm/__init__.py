"""LightGBM plugin: ``model.txt`` or ``model.bst`` saved by ``Booster.save_model``.

Also a KServe lgbserver folder (the one ``*.bst`` booster) and an MLServer
folder (``model-settings.json`` with ``implementation:
mlserver_lightgbm.LightGBMModel`` and ``parameters.uri``) serve unchanged; see
:mod:`servekit.folders.artifacts`.  A file is LightGBM's when it starts with the
``tree`` line LightGBM's text format opens with, whatever its name: that is
how ``model.bst`` is told apart from XGBoost's.

Signatures: ``serving_default`` (``Booster.predict``, what lgbserver answers),
``predict_proba`` for ``binary`` and ``multiclass``, ``predict_raw``
(``raw_score=True``); ``:classify`` and ``:regress`` by objective; ``:explain``
answers LightGBM's own TreeSHAP values (``pred_contrib``), which with
``base_values`` sum to the raw score.

lightgbm is imported only when a folder holds a LightGBM artifact.  See
``docs/frameworks.md``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import servekit
from servekit import find_artifact, is_lightgbm_text

from .booster import LightGBMModel

#: The library this plugin needs; without it `servekit serve` lists the plugin as not installed.
SERVEKIT_REQUIRES = ("lightgbm",)

log = logging.getLogger("servekit.lightgbm")

NAMES = ("model.txt", "model.bst")
IMPLEMENTATIONS = ("mlserver_lightgbm.LightGBMModel", "mlserver_lightgbm.lightgbm.LightGBMModel")


def is_lightgbm_file(file: Path) -> bool:
    return file.suffix in (".txt", ".bst", ".lgb") and is_lightgbm_text(file)


@servekit.hookimpl
def load(path: Path, config: servekit.ModelConfig) -> LightGBMModel | None:
    file = find_artifact(path, config.options, NAMES, is_lightgbm_file, IMPLEMENTATIONS)
    if file is None:
        return None
    from .booster import load_booster

    model = load_booster(file, config)
    log.info("loaded %s (%s, %d features)", file.name, model.objective, model.n_features)
    return model


@servekit.hookimpl
def metadata(model: LightGBMModel) -> servekit.ModelMetadata:
    return model.describe()


@servekit.hookimpl
def predict(inputs: Any, model: LightGBMModel, signature_name: str | None) -> Any:
    return model.predict(inputs, signature_name)


@servekit.hookimpl
def classify(examples: list[dict[str, list[Any]]], model: LightGBMModel) -> Any:
    return model.classify(model.example_rows(examples))


@servekit.hookimpl
def regress(examples: list[dict[str, list[Any]]], model: LightGBMModel) -> Any:
    return model.regress(model.example_rows(examples))


@servekit.hookimpl
def explain(inputs: Any, model: LightGBMModel) -> Any:
    return model.contributions(model.rows(inputs))
