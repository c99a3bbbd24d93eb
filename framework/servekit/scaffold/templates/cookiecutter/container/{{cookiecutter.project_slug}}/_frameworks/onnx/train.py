"""Train version 1 of {{ cookiecutter.model_name }}: python train.py [VERSION_FOLDER] (default ./1).

Replace this with your own training and export (``torch.onnx.export``,
``tf2onnx``, ``skl2onnx``...); servekit only needs ``VERSION/model.onnx``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from skl2onnx import to_onnx
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression


def main(out: Path) -> Path:
    iris = load_iris()
    X = iris.data.astype(np.float32)
    model = LogisticRegression(max_iter=1000).fit(X, iris.target)
    # zipmap off: probabilities as a plain [rows, 3] tensor rather than a list of dicts
    graph = to_onnx(model, X[:1], options={id(model): {"zipmap": False}}, target_opset=15)
    out.mkdir(parents=True, exist_ok=True)
    (out / "model.onnx").write_bytes(graph.SerializeToString())
    return out / "model.onnx"


if __name__ == "__main__":
    print("wrote", main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "1"))
