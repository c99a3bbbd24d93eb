"""Triton's `simple` example model: element-wise sum and difference of two INT32 [1, 16] inputs."""

import servekit
from servekit.types import ModelMetadata, Signature, TensorSpec

SHAPE = [1, 16]


@servekit.hookimpl
def load(path):
    return "simple"


@servekit.hookimpl
def metadata():
    inputs = [TensorSpec("INPUT0", "INT32", SHAPE), TensorSpec("INPUT1", "INT32", SHAPE)]
    outputs = [TensorSpec("OUTPUT0", "INT32", SHAPE), TensorSpec("OUTPUT1", "INT32", SHAPE)]
    signature = Signature(inputs=inputs, outputs=outputs)
    return ModelMetadata(signatures={"serving_default": signature}, platform="python")


@servekit.hookimpl
def predict(inputs):
    a, b = inputs["INPUT0"], inputs["INPUT1"]
    return {"OUTPUT0": a + b, "OUTPUT1": a - b}
