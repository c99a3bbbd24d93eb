"""Triton's `simple_sequence` example model: INPUT INT32 [1, 1] -> OUTPUT, the sequence's running sum.

The first request of a sequence (``sequence_start``) starts the sum at its input;
each later one adds to it.  The answer also says which process holds the state,
so a test sees that every request of a sequence reached the same one.
"""

import os

import numpy as np
import servekit
from servekit.types import ModelMetadata, Signature, TensorSpec


@servekit.hookimpl
def load(path):
    return "simple_sequence"


@servekit.hookimpl
def metadata():
    signature = Signature(
        inputs=[TensorSpec("INPUT", "INT32", [1, 1])],
        outputs=[TensorSpec("OUTPUT", "INT32", [1, 1]), TensorSpec("PID", "INT64", [1])],
    )
    return ModelMetadata(signatures={"serving_default": signature}, platform="python")


@servekit.hookimpl
def predict(inputs, sequence):
    value = int(inputs["INPUT"].reshape(-1)[0])
    if sequence is None:  # outside a sequence: the input itself
        total = value
    else:
        if sequence.start:
            sequence.state["total"] = 0
        sequence.state["total"] += value
        total = sequence.state["total"]
    return {"OUTPUT": np.array([[total]], dtype=np.int32), "PID": np.array([os.getpid()], dtype=np.int64)}
