"""A loaded MLflow model: handed to the servekit plugin of its flavor, or run by ``mlflow.pyfunc``.

The native plugin is found by its entry point in the ``servekit`` group, as
the server finds every plugin (plugins never import each other), and called
through a plugin manager of its own, so its hooks take the same arguments as
when the server calls them.  Its ``load`` gets the flavor's data file as
``options.artifact`` (and, for skops files, the types the MLmodel trusts).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from servekit.errors import BadRequest
from servekit.types import ModelConfig, ModelMetadata, Signature

from .mlmodel import is_columns, signature_specs

log = logging.getLogger("servekit.mlflow")

#: flavor -> (servekit plugin, the flavor's key naming its data file), in the order tried
NATIVE: dict[str, list[tuple[str, str]]] = {
    "sklearn": [("sklearn", "pickled_model")],
    "xgboost": [("xgboost", "data")],
    # a LightGBM scikit-learn estimator (LGBMClassifier) is stored pickled or as skops
    "lightgbm": [("lightgbm", "data"), ("sklearn", "data")],
    "onnx": [("onnx", "data")],
}


@dataclass
class MlflowModel:
    doc: dict[str, Any]
    flavor: str
    served_by: str
    inner: Any = None
    hooks: Any = None  # the native plugin's hook relay
    pyfunc: PyfuncModel | None = None
    #: the temporary folder an ``options.model_uri`` model was downloaded into
    downloaded: Path | None = None

    def forward(self, hook: str, **kwargs: Any) -> Any:
        """The native plugin's ``hook`` on its own model; ``None`` (so 501) when it has none."""
        if self.hooks is None:
            return None
        return getattr(self.hooks, hook)(model=self.inner, **kwargs)

    def describe(self, name: str, version: int) -> ModelMetadata | None:
        if self.hooks is not None:
            return self.forward("metadata", name=name, version=version)
        signature = Signature(
            inputs=signature_specs(self.doc, "inputs") or [], outputs=signature_specs(self.doc, "outputs") or []
        )
        return ModelMetadata(signatures={"serving_default": signature}, platform="mlflow")


@dataclass
class PyfuncModel:
    """``mlflow.pyfunc`` on what the signature says it takes: a DataFrame of columns, or arrays."""

    model: Any
    columns: list[str] | None

    def predict(self, inputs: Any, parameters: dict[str, Any]) -> Any:
        from mlflow.exceptions import MlflowException

        data = self._data(inputs)
        params = parameters.get("params") if isinstance(parameters.get("params"), dict) else None
        try:
            result = self.model.predict(data, params=params) if params else self.model.predict(data)
        except MlflowException as exc:
            # schema enforcement: the input does not match the model's signature, the client's mistake
            if exc.error_code == "INVALID_PARAMETER_VALUE":
                raise BadRequest(f"the model's signature refuses the input: {exc.message}") from None
            raise
        return _answer(result)

    def _data(self, inputs: Any) -> Any:
        if self.columns is None:
            return inputs
        import pandas as pd

        if isinstance(inputs, dict) and set(inputs) >= set(self.columns):
            return pd.DataFrame({c: np.asarray(inputs[c]).reshape(-1) for c in self.columns})
        rows = np.asarray(next(iter(inputs.values())) if isinstance(inputs, dict) and len(inputs) == 1 else inputs)
        if rows.ndim != 2 or rows.shape[1] != len(self.columns):
            raise BadRequest(f"expected inputs {self.columns}, or rows of {len(self.columns)} values")
        return pd.DataFrame(rows, columns=self.columns)


def _answer(result: Any) -> Any:
    """pyfunc's answer as servekit outputs: a DataFrame's columns by name, anything else as an array."""
    if hasattr(result, "columns") and hasattr(result, "to_numpy"):
        return {str(c): result[c].to_numpy() for c in result.columns}
    if hasattr(result, "to_numpy"):
        return result.to_numpy()
    if isinstance(result, dict):
        return {str(k): np.asarray(v) for k, v in result.items()}
    return np.asarray(result)


def load_mlflow(path: Path, doc: dict[str, Any], config: ModelConfig, name: str, version: int) -> MlflowModel:
    flavors = doc["flavors"]
    for flavor, tries in NATIVE.items():
        if flavor not in flavors:
            continue
        for plugin, key in tries:
            loaded = _load_native(path, flavors[flavor], plugin, key, config, name, version)
            if loaded is not None:
                inner, hooks = loaded
                return MlflowModel(doc, flavor, plugin, inner=inner, hooks=hooks)
    return _load_pyfunc(path, doc, next(iter(flavors), "python_function"))


def _load_native(
    path: Path, flavor: dict[str, Any], plugin: str, key: str, config: ModelConfig, name: str, version: int
) -> tuple[Any, Any] | None:
    data = flavor.get(key)
    hooks = _plugin_hooks(plugin)
    if not data or hooks is None:
        return None
    options = {**config.options, "artifact": str(data)}
    if flavor.get("skops_trusted_types"):
        options.setdefault("trusted_types", list(flavor["skops_trusted_types"]))
    inner_config = dataclasses.replace(config, options=options, plugin=None)
    inner = hooks.load(path=path, config=inner_config, name=name, version=version)
    return None if inner is None else (inner, hooks)


def _plugin_hooks(plugin: str) -> Any:
    """The hook relay of the installed servekit plugin ``plugin`` alone; ``None`` when it is not installed."""
    from servekit import ENTRY_POINT_GROUP, new_manager

    found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=plugin)
    for entry_point in found:
        try:
            module = entry_point.load()
        except ImportError as exc:
            log.warning("servekit plugin %s cannot be imported (%s); trying mlflow.pyfunc", plugin, exc)
            return None
        pm = new_manager()
        pm.register(module, name=plugin)
        return pm.hook
    return None


def _load_pyfunc(path: Path, doc: dict[str, Any], flavor: str) -> MlflowModel:
    try:
        import mlflow.pyfunc
    except ImportError:
        raise ValueError(
            f"MLmodel: flavor {flavor!r} needs mlflow (pip install servekit[mlflow]); "
            "the sklearn, xgboost, lightgbm and onnx flavors load without it"
        ) from None
    model = mlflow.pyfunc.load_model(str(path))
    columns = None
    if is_columns(doc):
        columns = [s.name for s in signature_specs(doc, "inputs") or []]
    return MlflowModel(doc, flavor, "mlflow.pyfunc", pyfunc=PyfuncModel(model, columns))
