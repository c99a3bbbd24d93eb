"""Triton's `simple_sequence` example model, as a model.py: its tensors come from config.pbtxt.

As Triton feeds its model, the server sets the control inputs that
``sequence_batching`` declares: START is 1 on a sequence's first request, READY
1 on every request.  OUTPUT is ``(INPUT + START) * READY``: the input, plus one
on a sequence's first request, which is what Triton's sequence example clients
expect of this model.  COUNT is the state the sequence keeps (how many of its
requests the model has seen, in order); PID says which process holds that
state, so a test sees that every request of a sequence reached the same one.
"""

import os

import numpy as np
import servekit


@servekit.hookimpl
def load(path):
    return "simple_sequence"


@servekit.hookimpl
def predict(inputs, sequence):
    start, ready = inputs["START"], inputs["READY"]  # [batch, 1] INT32, as Triton shapes them
    if start.reshape(-1)[0]:
        sequence.state["count"] = 0
    sequence.state["count"] += 1
    rows = inputs["INPUT"].shape[0]
    return {
        "OUTPUT": ((inputs["INPUT"] + start) * ready).astype(np.int32),
        "COUNT": np.full((rows, 1), sequence.state["count"], dtype=np.int32),
        "PID": np.full((rows, 1), os.getpid(), dtype=np.int64),
    }
