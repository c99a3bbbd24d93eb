"""Train version 1 of {{ cookiecutter.model_name }}: python train.py [VERSION_FOLDER] (default ./1).

Replace this with your own training; servekit only needs ``VERSION/model.txt``
(or ``model.bst``), written by ``Booster.save_model``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightgbm as lgb
from sklearn.datasets import load_iris

FEATURES = ["sepal_length", "sepal_width", "petal_length", "petal_width"]


def main(out: Path) -> Path:
    iris = load_iris()
    data = lgb.Dataset(iris.data, label=iris.target, feature_name=FEATURES)
    params = {"objective": "multiclass", "num_class": 3, "num_leaves": 7, "min_data_in_leaf": 5, "verbose": -1}
    booster = lgb.train(params, data, num_boost_round=20)
    out.mkdir(parents=True, exist_ok=True)
    booster.save_model(str(out / "model.txt"))
    return out / "model.txt"


if __name__ == "__main__":
    print("wrote", main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "1"))
