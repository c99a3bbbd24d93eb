"""Fit the example iris classifier into examples/models/iris/1/model.joblib.

The Quickstart runs this once; the iris data set ships with scikit-learn, so no
download is needed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import joblib
import pandas as pd
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression


def main(out: Path) -> Path:
    iris = load_iris(as_frame=True)
    X = iris.data.rename(columns=lambda c: c.replace(" (cm)", "").replace(" ", "_"))
    y = pd.Series(iris.target_names[iris.target], name="species")
    model = LogisticRegression(max_iter=1000).fit(X, y)
    target = out / "iris" / "1" / "model.joblib"
    target.parent.mkdir(parents=True, exist_ok=True)
    joblib.dump(model, target)
    return target


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "models"
    print(f"wrote {main(out)}")
