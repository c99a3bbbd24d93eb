"""scikit-learn plugin: ``model.joblib``, ``model.pkl`` or ``model.skops``.

Signatures: ``serving_default`` (``predict``; ``transform`` for a transformer),
plus ``predict_proba``, ``decision_function`` and ``transform`` where the
estimator has them; ``:classify`` answers
``[label, probability]`` pairs from ``predict_proba`` and ``classes_``;
``:regress`` answers ``predict`` of a regressor; ``:explain`` answers per-feature
attributions (see :mod:`servekit_sklearn.attributions`).

Pickle-based files (joblib, pkl) run code when loaded: serve only files you
trust.  ``model.skops`` is the safe format; its types are checked on load.

Request values are checked against what the estimator accepts (numbers, NaN)
before the call, so a client's mistake is a 400, never the model's 500 (see
:mod:`servekit_sklearn.inputs`); the call itself takes the cheapest path that
answers exactly as the estimator does (see :mod:`servekit_sklearn.calls`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import servekit

from .estimator import SklearnModel, load_estimator

#: The library this plugin needs; without it `servekit serve` lists the plugin as not installed.
SERVEKIT_REQUIRES = ("sklearn",)


@servekit.hookimpl
def load(path: Path, config: servekit.ModelConfig) -> SklearnModel | None:
    return load_estimator(path, config.options)


# The hooks below get only models this plugin's ``load`` returned: servekit routes
# each model's hooks to the plugin that loaded it, so there is no ownership check.


@servekit.hookimpl
def metadata(model: SklearnModel) -> servekit.ModelMetadata:
    return model.describe()


@servekit.hookimpl
def predict(inputs: Any, model: SklearnModel, signature_name: str | None) -> Any:
    return model.predict(inputs, signature_name)


@servekit.hookimpl
def classify(examples: list[dict[str, list[Any]]], model: SklearnModel) -> Any:
    return model.classify(model.examples_to_matrix(examples))


@servekit.hookimpl
def regress(examples: list[dict[str, list[Any]]], model: SklearnModel) -> Any:
    return model.regress(model.examples_to_matrix(examples))


@servekit.hookimpl
def explain(inputs: Any, model: SklearnModel) -> Any:
    from .attributions import attributions

    return attributions(model, model.matrix(inputs))
