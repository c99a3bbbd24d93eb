"""Tiny TF Lite models built at test time with TensorFlow's own converter.

``half_plus_two`` (y = 0.5 * x + 2) in TF Serving's two TF Lite layouts: one
written with the model's SignatureDef (``serving_default``: ``x`` -> ``y``) and
one without any (served by tensor name), and ``sum_of_two`` (a matrix product over
rows of two features), each as ``BASE/123/model.tflite``.
Run as a script (``python tests/support/tflite_models.py OUT``) so that the test
process need not import TensorFlow.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

VERSION = "123"


def build(out: Path) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    class HalfPlusTwo(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")], autograph=False)
        def __call__(self, x):
            return {"y": tf.identity(x * 0.5 + 2.0, name="y")}

    module = HalfPlusTwo()
    concrete = module.__call__.get_concrete_function()
    with_sigdef = tf.lite.TFLiteConverter.from_concrete_functions([concrete], module).convert()
    (out / "half_plus_two_tflite_with_sigdef" / VERSION).mkdir(parents=True, exist_ok=True)
    (out / "half_plus_two_tflite_with_sigdef" / VERSION / "model.tflite").write_bytes(with_sigdef)

    # a TF1 graph converted from its session: no SignatureDef, tensors named x and y, as
    # TF Serving's own saved_model_half_plus_two_tflite test model
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None], name="x")
        y = tf.add(tf.multiply(x, 0.5), 2.0, name="y")
        with tf.compat.v1.Session(graph=graph) as session:
            without = tf.compat.v1.lite.TFLiteConverter.from_session(session, [x], [y]).convert()
    (out / "half_plus_two_tflite" / VERSION).mkdir(parents=True, exist_ok=True)
    (out / "half_plus_two_tflite" / VERSION / "model.tflite").write_bytes(without)

    # a matrix product over two features: a row of any other width cannot run
    class SumOfTwo(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")], autograph=False)
        def __call__(self, x):
            return {"y": tf.matmul(x, tf.constant([[1.0], [1.0]]))}

    module = SumOfTwo()
    dense = tf.lite.TFLiteConverter.from_concrete_functions([module.__call__.get_concrete_function()], module).convert()
    (out / "sum_of_two_tflite" / VERSION).mkdir(parents=True, exist_ok=True)
    (out / "sum_of_two_tflite" / VERSION / "model.tflite").write_bytes(dense)


if __name__ == "__main__":
    build(Path(sys.argv[1]))
