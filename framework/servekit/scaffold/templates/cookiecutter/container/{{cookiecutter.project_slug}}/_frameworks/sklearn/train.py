"""Train version 1 of {{ cookiecutter.model_name }}: python train.py [VERSION_FOLDER] (default ./1).

Replace this with your own training; servekit only needs ``VERSION/model.joblib``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import joblib
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression


def main(out: Path) -> Path:
    iris = load_iris()
    model = LogisticRegression(max_iter=1000).fit(iris.data, iris.target_names[iris.target])
    out.mkdir(parents=True, exist_ok=True)
    joblib.dump(model, out / "model.joblib")
    return out / "model.joblib"


if __name__ == "__main__":
    print("wrote", main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "1"))
