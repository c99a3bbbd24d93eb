"""Tiny real models of the framework plugins (XGBoost, LightGBM, ONNX, MLflow), built in a test's folder.

Each trains in milliseconds on a fixed random data set, so every test can
compare the server's answers with the library's own on the same rows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

FEATURES = ["age", "income", "score", "tenure"]


def data(n: int = 120, classes: int = 2, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, len(FEATURES)))
    margin = X[:, 0] + 0.5 * X[:, 1] - X[:, 2]
    y = np.digitize(margin, np.quantile(margin, np.linspace(0, 1, classes + 1)[1:-1]))
    return X, y


def xgboost_booster(objective: str = "binary:logistic", *, named: bool = False, classes: int = 2):
    import xgboost as xgb

    X, y = data(classes=classes if objective.startswith("multi") else 2)
    params: dict = {"objective": objective, "max_depth": 3, "nthread": 1}
    if objective.startswith("multi"):
        params["num_class"] = classes
    target = X[:, 0] * 2 + X[:, 1] if objective.startswith("reg") else y
    matrix = xgb.DMatrix(X, label=target, feature_names=FEATURES if named else None)
    return xgb.train(params, matrix, num_boost_round=5)


def save_xgboost(folder: Path, name: str = "model.json", **kwargs) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    booster = xgboost_booster(**kwargs)
    booster.save_model(str(folder / name))
    return folder / name


def lightgbm_booster(objective: str = "binary", *, named: bool = False, classes: int = 3):
    import lightgbm as lgb

    X, y = data(classes=classes if objective == "multiclass" else 2)
    params: dict = {"objective": objective, "num_leaves": 7, "verbose": -1, "num_threads": 1, "min_data_in_leaf": 5}
    if objective == "multiclass":
        params["num_class"] = classes
    target = X[:, 0] * 2 + X[:, 1] if objective == "regression" else y
    names = FEATURES if named else "auto"
    return lgb.train(params, lgb.Dataset(X, label=target, feature_name=names), num_boost_round=5)


def save_lightgbm(folder: Path, name: str = "model.txt", **kwargs) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    booster = lightgbm_booster(**kwargs)
    booster.save_model(str(folder / name))
    return folder / name


def sklearn_onnx(folder: Path, name: str = "model.onnx") -> tuple[Path, object]:
    """A LogisticRegression as ONNX (skl2onnx, probabilities as a plain tensor); returns the estimator too."""
    from skl2onnx import to_onnx
    from sklearn.linear_model import LogisticRegression

    X, y = data(classes=3)
    model = LogisticRegression(max_iter=500).fit(X, y)
    onnx_model = to_onnx(model, X[:1].astype(np.float32), options={id(model): {"zipmap": False}}, target_opset=15)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(onnx_model.SerializeToString())
    return folder / name, model


def graph_onnx(folder: Path, name: str = "model.onnx") -> Path:
    """A hand-built graph: ``doubled = x * 2`` (float32, ``[batch, 3]``), ``counts = n + 1`` (int64,
    ``[N]``) and ``words = Identity(text)`` (string, unknown length)."""
    import onnx
    from onnx import TensorProto, helper

    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    one = helper.make_tensor("one", TensorProto.INT64, [], [1])
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "two"], ["doubled"]),
            helper.make_node("Add", ["n", "one"], ["counts"]),
            helper.make_node("Identity", ["text"], ["words"]),
        ],
        "graph",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3]),
            helper.make_tensor_value_info("n", TensorProto.INT64, ["N"]),
            helper.make_tensor_value_info("text", TensorProto.STRING, [None]),
        ],
        [
            helper.make_tensor_value_info("doubled", TensorProto.FLOAT, ["batch", 3]),
            helper.make_tensor_value_info("counts", TensorProto.INT64, ["N"]),
            helper.make_tensor_value_info("words", TensorProto.STRING, [None]),
        ],
        initializer=[two, one],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, folder / name)
    return folder / name


#: A pyfunc model no servekit plugin serves natively: ``total = (age + income) * factor``.
PYFUNC_CODE = """
import mlflow
import pandas as pd


class Scaled(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        factor = (params or {}).get("factor", 2.0)
        return pd.DataFrame({"total": (model_input["age"] + model_input["income"]) * factor})


mlflow.models.set_model(Scaled())
"""


def save_pyfunc(folder: Path) -> Path:
    """The :data:`PYFUNC_CODE` model, saved as MLflow "models from code" with a column signature."""
    import mlflow.pyfunc
    import pandas as pd
    from mlflow.models import infer_signature

    code = folder.parent / "scaled.py"
    folder.parent.mkdir(parents=True, exist_ok=True)
    code.write_text(PYFUNC_CODE)
    example = pd.DataFrame({"age": [1.0], "income": [2.0]})
    signature = infer_signature(example, pd.DataFrame({"total": [6.0]}), params={"factor": 2.0})
    # requirements given, so that save_model does not infer them (it loads the model in a subprocess to do so)
    mlflow.pyfunc.save_model(folder, python_model=str(code), signature=signature, pip_requirements=["mlflow"])
    code.unlink()  # the model folder holds its own copy
    return folder
