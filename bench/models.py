"""Fit the benchmark's models once and lay them out for every server.

Run with servekit's Python (it has scikit-learn); the peers' virtualenvs pin
the same scikit-learn version, so all servers load the very same joblib files.

    python bench/models.py OUT_DIR

Writes ``OUT_DIR/models/{iris,rf}/1/model.joblib`` (TF Serving layout, also
read by the KServe peer), ``OUT_DIR/models/echo/model.py`` (the 1M-element
tensor round trip), ``OUT_DIR/mlserver[-batch]/...`` model settings, and the request
bodies under ``OUT_DIR/bodies``.  Where xgboost and lightgbm are installed, also
100-round boosters on rf's data: ``OUT_DIR/models/xgb/1/model.json``,
``OUT_DIR/models/lgb/1/model.txt``, ``OUT_DIR/mlserver-trees[-batch]/`` settings for
MLServer's mlserver-xgboost and mlserver-lightgbm runtimes, and ``OUT_DIR/kserve-lgb/model.bst``
for KServe's lgbserver (the same LightGBM file under the name it reads).  Where skl2onnx is
installed, also the iris and rf models converted to ONNX (FP64 input ``input``, no ZipMap):
``OUT_DIR/onnx/{iris,rf}/1/model.onnx``, for servekit_onnx beside servekit_sklearn.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import joblib
import numpy as np
from sklearn.datasets import load_iris
from sklearn.ensemble import RandomForestClassifier
from sklearn.linear_model import LogisticRegression

ECHO_MODEL_PY = '''"""Returns its input unchanged: a transport benchmark."""
import servekit


@servekit.hookimpl
def load():
    return "echo"


@servekit.hookimpl
def predict(inputs):
    return inputs
'''


def fit(out: Path) -> dict[str, np.ndarray]:
    X, y = load_iris(return_X_y=True)
    iris = LogisticRegression(max_iter=1000).fit(X, y)
    rng = np.random.default_rng(0)
    Xr = rng.normal(size=(2000, 20))
    yr = (Xr[:, :5].sum(axis=1) > 0).astype(int) + (Xr[:, 5] > 1).astype(int)
    rf = RandomForestClassifier(n_estimators=100, random_state=0).fit(Xr, yr)
    for name, model in (("iris", iris), ("rf", rf)):
        path = out / "models" / name / "1" / "model.joblib"
        path.parent.mkdir(parents=True, exist_ok=True)
        joblib.dump(model, path)
        settings = {
            "name": name,
            "implementation": "mlserver_sklearn.SKLearnModel",
            "parameters": {"uri": str(path), "version": "1"},
        }
        batched = {**settings, "max_batch_size": 32, "max_batch_time": 0.002}  # MLServer's adaptive batching
        for folder, doc in (("mlserver", settings), ("mlserver-batch", batched)):
            (out / folder / name).mkdir(parents=True, exist_ok=True)
            (out / folder / name / "model-settings.json").write_text(json.dumps(doc))
    data = {"iris": X, "rf": Xr}
    data.update(fit_boosters(out, Xr, yr))
    to_onnx(out, {"iris": (iris, X), "rf": (rf, Xr)})
    echo = out / "models" / "echo"
    echo.mkdir(parents=True, exist_ok=True)
    (echo / "model.py").write_text(ECHO_MODEL_PY)
    return data


#: MLServer's runtime for each booster, and the file both servers load
BOOSTERS = {
    "xgb": ("mlserver_xgboost.XGBoostModel", "model.json"),
    "lgb": ("mlserver_lightgbm.LightGBMModel", "model.txt"),
}


def fit_boosters(out: Path, X: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """An XGBoost and a LightGBM 3-class booster (100 rounds, depth 6 / 31 leaves), if the libraries are here."""
    try:
        import lightgbm as lgb
        import xgboost as xgb
    except ImportError:
        return {}
    boosters = {
        "xgb": xgb.train({"objective": "multi:softprob", "num_class": 3, "max_depth": 6}, xgb.DMatrix(X, label=y), 100),
        "lgb": lgb.train({"objective": "multiclass", "num_class": 3, "verbose": -1}, lgb.Dataset(X, label=y), 100),
    }
    for name, booster in boosters.items():
        implementation, file = BOOSTERS[name]
        path = out / "models" / name / "1" / file
        path.parent.mkdir(parents=True, exist_ok=True)
        booster.save_model(str(path))
        settings = {"name": name, "implementation": implementation, "parameters": {"uri": str(path), "version": "1"}}
        batched = {**settings, "max_batch_size": 32, "max_batch_time": 0.002}  # MLServer's adaptive batching
        for folder, doc in (("mlserver-trees", settings), ("mlserver-trees-batch", batched)):
            (out / folder / name).mkdir(parents=True, exist_ok=True)
            (out / folder / name / "model-settings.json").write_text(json.dumps(doc))
    # KServe's lgbserver reads a ``*.bst`` file only: the same LightGBM text file under that name
    (out / "kserve-lgb").mkdir(parents=True, exist_ok=True)
    boosters["lgb"].save_model(str(out / "kserve-lgb" / "model.bst"))
    return {name: X for name in boosters}


def to_onnx(out: Path, models: dict) -> None:
    """The scikit-learn models as ONNX graphs that take the same FP64 rows (skl2onnx), if it is here."""
    try:
        from skl2onnx import to_onnx as convert
        from skl2onnx.common.data_types import DoubleTensorType
    except ImportError:
        return
    for name, (model, X) in models.items():
        graph = convert(
            model,
            initial_types=[("input", DoubleTensorType([None, X.shape[1]]))],
            options={id(model): {"zipmap": False}},  # label and probabilities as tensors
            target_opset={"": 17, "ai.onnx.ml": 3},
        )
        path = out / "onnx" / name / "1" / "model.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(graph.SerializeToString())


def bodies(out: Path, data: dict[str, np.ndarray]) -> None:
    """V2 and V1 JSON request bodies, 1 and 100 rows, for each model."""
    folder = out / "bodies"
    folder.mkdir(parents=True, exist_ok=True)
    for name, X in data.items():
        for rows in (1, 100):
            sample = X[:rows].round(4)
            v2 = {
                "inputs": [
                    {"name": "input", "shape": list(sample.shape), "datatype": "FP64", "data": sample.ravel().tolist()}
                ]
            }
            (folder / f"{name}-{rows}-v2.json").write_text(json.dumps(v2))
            (folder / f"{name}-{rows}-v1.json").write_text(json.dumps({"instances": sample.tolist()}))


if __name__ == "__main__":
    target = Path(sys.argv[1])
    bodies(target, fit(target))
