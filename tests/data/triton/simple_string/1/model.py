"""Triton's `simple_string` example model: sum and difference of decimal numbers held as BYTES."""

import numpy as np
import servekit
from servekit.types import ModelMetadata, Signature, TensorSpec

SHAPE = [1, 16]


@servekit.hookimpl
def load(path):
    return "simple_string"


@servekit.hookimpl
def metadata():
    inputs = [TensorSpec("INPUT0", "BYTES", SHAPE), TensorSpec("INPUT1", "BYTES", SHAPE)]
    outputs = [TensorSpec("OUTPUT0", "BYTES", SHAPE), TensorSpec("OUTPUT1", "BYTES", SHAPE)]
    signature = Signature(inputs=inputs, outputs=outputs)
    return ModelMetadata(signatures={"serving_default": signature}, platform="python")


def _numbers(tensor):
    return np.vectorize(lambda v: int(v.decode() if isinstance(v, bytes) else v))(tensor)


def _text(values):
    return np.vectorize(lambda v: str(v).encode(), otypes=[object])(values)


@servekit.hookimpl
def predict(inputs):
    a, b = _numbers(inputs["INPUT0"]), _numbers(inputs["INPUT1"])
    return {"OUTPUT0": _text(a + b), "OUTPUT1": _text(a - b)}
