"""Triton's `simple_sequence` example model: INPUT INT32 [1, 1] -> OUTPUT, as Triton's examples check it.

OUTPUT is the input, plus one on the first request of a sequence
(``sequence_start``), which is what Triton's sequence example clients expect of
their model.  COUNT is the state the sequence keeps: how many of its requests
the model has seen, in order; PID says which process holds that state, so a
test sees that every request of a sequence reached the same one.
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
        outputs=[
            TensorSpec("OUTPUT", "INT32", [1, 1]),
            TensorSpec("COUNT", "INT32", [1]),
            TensorSpec("PID", "INT64", [1]),
        ],
    )
    return ModelMetadata(signatures={"serving_default": signature}, platform="python")


@servekit.hookimpl
def predict(inputs, sequence):
    value = int(inputs["INPUT"].reshape(-1)[0])
    if sequence is None:  # outside a sequence: the input itself
        output, count = value, 0
    else:
        if sequence.start:
            sequence.state["count"] = 0
        sequence.state["count"] += 1
        output, count = value + (1 if sequence.start else 0), sequence.state["count"]
    return {
        "OUTPUT": np.array([[output]], dtype=np.int32),
        "COUNT": np.array([count], dtype=np.int32),
        "PID": np.array([os.getpid()], dtype=np.int64),
    }
