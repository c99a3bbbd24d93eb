"""Train version 1 of {{ cookiecutter.model_name }}: python train.py [VERSION_FOLDER] (default ./1).

Replace this with your own training; servekit only needs ``VERSION/model.json``
(or ``model.ubj``), written by ``Booster.save_model``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import xgboost as xgb
from sklearn.datasets import load_iris

FEATURES = ["sepal_length", "sepal_width", "petal_length", "petal_width"]


def main(out: Path) -> Path:
    iris = load_iris()
    data = xgb.DMatrix(iris.data, label=iris.target, feature_names=FEATURES)
    booster = xgb.train({"objective": "multi:softprob", "num_class": 3, "max_depth": 3}, data, num_boost_round=20)
    out.mkdir(parents=True, exist_ok=True)
    booster.save_model(str(out / "model.json"))
    return out / "model.json"


if __name__ == "__main__":
    print("wrote", main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "1"))
