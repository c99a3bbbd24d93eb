"""Shared fixtures: tiny real models fitted once per session, and shared servers.

The servekit pytest plugin (``servekit.testing``) supplies ``servekit_app`` and
``servekit_server``; these fixtures add the models the suite serves.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
TF_DATA = DATA / "tf_serving"


def fit_iris(folder: Path, version: int = 1, *, named: bool = True, fmt: str = "joblib") -> Path:
    """A LogisticRegression on iris, saved as BASE/iris/VERSION/model.<fmt>."""
    import joblib
    import pandas as pd
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    iris = load_iris(as_frame=True)
    X = iris.data.rename(columns=lambda c: c.replace(" (cm)", "").replace(" ", "_"))
    y = pd.Series(iris.target_names[iris.target])
    model = LogisticRegression(max_iter=1000).fit(X if named else X.to_numpy(), y)
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


ECHO_MODEL = """
import numpy as np
import servekit
from servekit.types import ModelMetadata, Signature, TensorSpec


@servekit.hookimpl
def load(path):
    return "echo"


@servekit.hookimpl
def metadata(model):
    # a declared input: one V2/gRPC tensor arrives by name (a dict), so the answer keeps its name
    return ModelMetadata(signatures={"serving_default": Signature(inputs=[TensorSpec("x", "FP32", None)])})


@servekit.hookimpl
def predict(inputs, parameters):
    # doubles numbers, echoes strings; a parameter 'fail' makes it raise
    if parameters.get("fail"):
        raise RuntimeError("asked to fail")
    if isinstance(inputs, dict):
        return {k: v * 2 if v.dtype.kind in "iuf" else v for k, v in inputs.items()}
    return inputs * 2 if inputs.dtype.kind in "iuf" else inputs
"""


@pytest.fixture(scope="session")
def tiny_gpt2(tmp_path_factory) -> Path:
    """The tiny random-weight GPT-2 folder of :mod:`generative_models`."""
    from generative_models import build_tiny_gpt2

    return build_tiny_gpt2(tmp_path_factory.mktemp("gpt") / "gpt")


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """The tiny random-weight Llama-style folder of :mod:`generative_models`."""
    from generative_models import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("llama") / "llama")


@pytest.fixture(scope="session")
def sklearn_repo(tmp_path_factory) -> Path:
    """A repository: iris (versions 1 and 2, labels), a regressor, a model.py echo model, a broken model."""
    base = tmp_path_factory.mktemp("repo")
    fit_iris(base / "iris", 1)
    fit_iris(base / "iris", 2)
    (base / "iris" / "servekit.yaml").write_text("version_policy: all\nlabels: {stable: 1, canary: 2}\n")
    fit_regressor(base / "linear")
    echo = base / "echo"
    echo.mkdir()
    (echo / "model.py").write_text(ECHO_MODEL)
    broken = base / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "model.joblib").write_bytes(b"not a pickle")
    return base


@pytest.fixture(scope="session")
def sklearn_server(sklearn_repo):
    """One real gunicorn server over ``sklearn_repo`` shared by the session's tests."""
    from servekit.testing import ServerProcess

    # 'broken' fails on purpose: readiness must not wait for it
    with ServerProcess(sklearn_repo, workers=1, threads=8, strict_readiness=False) as server:
        yield server


@pytest.fixture(scope="session")
def tf_models(tmp_path_factory) -> Path:
    """A writable copy of TF Serving's test SavedModels."""
    base = tmp_path_factory.mktemp("tf")
    for name in ("saved_model_half_plus_three", "saved_model_half_plus_two_2_versions"):
        shutil.copytree(TF_DATA / name, base / name)
    return base
