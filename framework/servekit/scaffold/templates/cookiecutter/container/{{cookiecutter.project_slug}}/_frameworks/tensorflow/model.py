"""{{ cookiecutter.project_name }}: a TensorFlow SavedModel served by servekit.

servekit calls these hooks (see servekit's docs/hooks.md); each names only the
arguments it needs:

- ``load``      once per version folder (``1/``, ``2/``...): the loaded SavedModel
- ``metadata``  read from the SavedModel's signatures, for ``/v1/models/NAME/metadata`` and V2
- ``predict``   calls the requested signature (``serving_default`` unless the request names another)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

import servekit
from servekit import BadRequest, ModelMetadata, Signature, TensorSpec

DEFAULT_SIGNATURE = "serving_default"
_V2_TYPES = {tf.float32: "FP32", tf.float64: "FP64", tf.int32: "INT32", tf.int64: "INT64", tf.string: "BYTES", tf.bool: "BOOL"}


@servekit.hookimpl
def load(path: Path) -> Any:
    return tf.saved_model.load(str(path))


def _spec(name: str, spec: tf.TensorSpec) -> TensorSpec:
    # servekit refuses NaN and infinity in float inputs before predict runs (a 400);
    # add allow_nan=True, allow_infinity=True for a graph that computes with them.
    shape = None if spec.shape.rank is None else [-1 if d is None else int(d) for d in spec.shape.as_list()]
    return TensorSpec(name, _V2_TYPES.get(spec.dtype, spec.dtype.name.upper()), shape)


@servekit.hookimpl
def metadata(model: Any) -> ModelMetadata:
    signatures = {}
    for key, function in model.signatures.items():
        inputs = function.structured_input_signature[1]
        outputs = function.structured_outputs
        signatures[key] = Signature(
            inputs=[_spec(n, s) for n, s in sorted(inputs.items())],
            outputs=[_spec(n, tf.TensorSpec(t.shape, t.dtype)) for n, t in sorted(outputs.items())],
        )
    return ModelMetadata(signatures=signatures, platform="tensorflow")


@servekit.hookimpl
def predict(inputs: Any, model: Any, signature_name: str | None) -> dict[str, np.ndarray]:
    key = signature_name or DEFAULT_SIGNATURE
    if key not in model.signatures:
        raise BadRequest(f"unknown signature {key!r}; this model has {sorted(model.signatures)}")
    function = model.signatures[key]
    expected = function.structured_input_signature[1]
    if not isinstance(inputs, dict):  # one unnamed tensor: give it to the only input
        if len(expected) != 1:
            raise BadRequest(f"name the inputs: the signature takes {sorted(expected)}")
        inputs = {next(iter(expected)): inputs}
    if set(inputs) != set(expected):
        raise BadRequest(f"expected inputs {sorted(expected)}, found {sorted(inputs)}")
    tensors = {}
    for name, spec in expected.items():
        try:
            tensors[name] = tf.constant(np.asarray(inputs[name]), dtype=spec.dtype)
        except (TypeError, ValueError) as exc:
            raise BadRequest(f"input {name!r}: {exc}") from None
        if not spec.shape.is_compatible_with(tensors[name].shape):
            raise BadRequest(f"input {name!r}: expected shape {spec.shape.as_list()}, found {tensors[name].shape.as_list()}")
    return {name: value.numpy() for name, value in function(**tensors).items()}
