"""A classifier for the classification extension: INPUT FP32 [batch, 4] -> PROBS FP32 [batch, 5].

Each row's scores are its four inputs and their sum, divided by that sum's double,
so a test knows which class wins; ``config.pbtxt`` names the classes' label file.
"""

import numpy as np
import servekit
from servekit.types import ModelMetadata, Signature, TensorSpec


@servekit.hookimpl
def load(path):
    return "classifier"


@servekit.hookimpl
def metadata():
    signature = Signature(
        inputs=[TensorSpec("INPUT", "FP32", [-1, 4])],
        outputs=[TensorSpec("PROBS", "FP32", [-1, 5]), TensorSpec("COUNTS", "INT32", [-1, 5])],
    )
    return ModelMetadata(signatures={"serving_default": signature}, platform="python")


@servekit.hookimpl
def predict(inputs):
    x = inputs["INPUT"].astype(np.float32)
    total = x.sum(axis=1, keepdims=True)
    scores = np.concatenate([x, total], axis=1) / (2 * total)
    return {"PROBS": scores.astype(np.float32), "COUNTS": np.round(scores * 100).astype(np.int32)}
