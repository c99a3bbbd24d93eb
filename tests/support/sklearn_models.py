"""Tiny scikit-learn models the suite fits, and a ``model.py`` that echoes what it is sent."""

from __future__ import annotations

import functools
import textwrap
from pathlib import Path
from typing import Any

import yaml


@functools.cache
def iris_classifier(named: bool = True) -> Any:
    """A LogisticRegression fitted on iris (with its feature names, or on bare arrays), fitted once per process."""
    import pandas as pd
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    iris = load_iris(as_frame=True)
    X = iris.data.rename(columns=lambda c: c.replace(" (cm)", "").replace(" ", "_"))
    y = pd.Series(iris.target_names[iris.target])
    return LogisticRegression(max_iter=1000).fit(X if named else X.to_numpy(), y)


def fit_iris(folder: Path, version: int = 1, *, named: bool = True, fmt: str = "joblib") -> Path:
    """:func:`iris_classifier`, saved as BASE/iris/VERSION/model.<fmt>."""
    import joblib

    model = iris_classifier(named)
    target = folder / str(version) / f"model.{fmt}"
    target.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "skops":
        import skops.io

        skops.io.dump(model, target)
    else:
        joblib.dump(model, target)
    return target


def fit_regressor(folder: Path, version: int = 1) -> Path:
    """A LinearRegression y = 2*x0 + 3*x1 + 1 without feature names."""
    import joblib
    import numpy as np
    from sklearn.linear_model import LinearRegression

    X = np.array([[0, 0], [1, 0], [0, 1], [1, 1], [2, 3]], dtype=float)
    y = 2 * X[:, 0] + 3 * X[:, 1] + 1
    target = folder / str(version) / "model.joblib"
    target.parent.mkdir(parents=True, exist_ok=True)
    joblib.dump(LinearRegression().fit(X, y), target)
    return target


#: a ``model.py`` that answers its input times FACTOR (replace FACTOR: each version folder writes its own)
SCALING_MODEL = """
import servekit


@servekit.hookimpl
def load(path):
    return FACTOR


@servekit.hookimpl
def predict(model, inputs):
    return inputs * model
"""


ECHO_MODEL = """
import numpy as np
import servekit
from servekit.types import ModelMetadata, Signature, TensorSpec


@servekit.hookimpl
def load(path):
    return "echo"


@servekit.hookimpl
def metadata(model):
    # a declared input: one V2/gRPC tensor arrives by name (a dict), so the answer keeps its name;
    # of no datatype, as it echoes every one (a declared FP32 would refuse strings, booleans and NaN)
    return ModelMetadata(signatures={"serving_default": Signature(inputs=[TensorSpec("x", "", None)])})


@servekit.hookimpl
def predict(inputs, parameters):
    # doubles numbers, echoes strings; a parameter 'fail' makes it raise
    if parameters.get("fail"):
        raise RuntimeError("asked to fail")
    if isinstance(inputs, dict):
        return {k: v * 2 if v.dtype.kind in "iuf" else v for k, v in inputs.items()}
    return inputs * 2 if inputs.dtype.kind in "iuf" else inputs
"""


SLOW_WARMUP = textwrap.dedent("""
    import time
    import numpy as np
    import servekit

    @servekit.hookimpl
    def preprocess(inputs):
        first = inputs.iloc[0, 0] if hasattr(inputs, "iloc") else np.ravel(next(iter(inputs.values())) if isinstance(inputs, dict) else inputs)[0]
        if float(first) < 0:  # the warm-up sample: slow, as a first call often is
            time.sleep(2)
        return None
""")


def write_config(folder, **settings) -> None:
    (folder / "servekit.yaml").write_text(yaml.safe_dump(settings))
