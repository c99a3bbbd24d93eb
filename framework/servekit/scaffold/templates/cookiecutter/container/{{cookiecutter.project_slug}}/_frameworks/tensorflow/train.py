"""Train version 1 of {{ cookiecutter.model_name }}: python train.py [VERSION_FOLDER] (default ./1).

A linear model fitted to y = 2*x0 - x1 + 0.5*x2 + 1 stands in for your own; any
SavedModel with a ``serving_default`` signature works (Keras: ``model.export(folder)``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import tensorflow as tf


class Linear(tf.Module):
    def __init__(self, weights: np.ndarray, bias: float):
        super().__init__()
        self.w = tf.Variable(weights.reshape(-1, 1).astype(np.float32))
        self.b = tf.Variable(np.float32(bias))

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
    def serve(self, x):
        return {"y": tf.squeeze(tf.matmul(x, self.w), axis=1) + self.b}


def main(out: Path) -> Path:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 3))
    y = x @ np.array([2.0, -1.0, 0.5]) + 1.0
    coef, *_ = np.linalg.lstsq(np.column_stack([x, np.ones(len(x))]), y, rcond=None)
    module = Linear(coef[:3], coef[3])
    out.mkdir(parents=True, exist_ok=True)
    tf.saved_model.save(module, str(out), signatures={"serving_default": module.serve})
    return out


if __name__ == "__main__":
    print("wrote", main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "1"))
