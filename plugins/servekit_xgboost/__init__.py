"""XGBoost plugin: ``model.json``, ``model.ubj`` or ``model.bst`` saved by ``Booster.save_model``.

Also a KServe xgbserver folder (the one ``*.json``/``*.ubj``/``*.bst`` booster)
and an MLServer folder (``model-settings.json`` with ``implementation:
mlserver_xgboost.XGBoostModel`` and ``parameters.uri``) serve unchanged; see
:mod:`servekit.folders.artifacts`.  ``model.bst`` is XGBoost's unless its header is
LightGBM's text format (``tree``), which the LightGBM plugin serves.

Signatures: ``serving_default`` (``Booster.predict``, what xgbserver answers),
``predict_proba`` for ``binary:logistic`` and ``multi:softprob``,
``predict_margin`` (``output_margin=True``); ``:classify`` and ``:regress`` by
objective; ``:explain`` answers XGBoost's own TreeSHAP values
(``pred_contribs``), which with ``base_values`` sum to the margin.

xgboost is imported only when a folder holds an XGBoost artifact.  See
``docs/frameworks.md``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import servekit
from servekit import find_artifact, header, is_lightgbm_text

from .booster import XGBoostModel

#: The library this plugin needs; without it `servekit serve` lists the plugin as not installed.
SERVEKIT_REQUIRES = ("xgboost",)

log = logging.getLogger("servekit.xgboost")

NAMES = ("model.json", "model.ubj", "model.bst")
IMPLEMENTATIONS = ("mlserver_xgboost.XGBoostModel", "mlserver_xgboost.xgboost.XGBoostModel")


def is_xgboost_file(file: Path) -> bool:
    """XGBoost's JSON or UBJSON (both open with the ``learner`` object), or any ``.bst`` that is
    not LightGBM's text (XGBoost's old binary format has no magic to look for)."""
    if file.suffix in (".bst", ".xgb"):  # .xgb: what MLflow's xgboost flavor wrote before JSON/UBJSON
        return not is_lightgbm_text(file)
    return file.suffix in (".json", ".ubj") and b"learner" in header(file)


@servekit.hookimpl
def load(path: Path, config: servekit.ModelConfig) -> XGBoostModel | None:
    file = find_artifact(path, config.options, NAMES, is_xgboost_file, IMPLEMENTATIONS)
    if file is None:
        return None
    from .booster import load_booster

    model = load_booster(file, config)
    log.info("loaded %s (%s, %d features)", file.name, model.objective, model.n_features)
    return model


@servekit.hookimpl
def metadata(model: XGBoostModel) -> servekit.ModelMetadata:
    return model.describe()


@servekit.hookimpl
def predict(inputs: Any, model: XGBoostModel, signature_name: str | None) -> Any:
    return model.predict(inputs, signature_name)


@servekit.hookimpl
def classify(examples: list[dict[str, list[Any]]], model: XGBoostModel) -> Any:
    return model.classify(model.example_rows(examples))


@servekit.hookimpl
def regress(examples: list[dict[str, list[Any]]], model: XGBoostModel) -> Any:
    return model.regress(model.example_rows(examples))


@servekit.hookimpl
def explain(inputs: Any, model: XGBoostModel) -> Any:
    return model.contributions(model.rows(inputs))
