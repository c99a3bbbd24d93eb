"""Classify and regress as TF Serving runs them: serialized ``tf.Example`` protos in.

TF Serving looks the signature up by name (``serving_default`` when none is
given), requires one input keyed ``inputs`` and, for regress, one output keyed
``outputs``; for classify, ``classes`` and/or ``scores``.  It does not require the
``tensorflow/serving/classify|regress`` method name (that check is off by
default, so TF2 exports, whose signatures all say ``predict``, work).  The
examples are serialized and fed, as one string vector, to the input tensor.  A
signature whose input tensor is not a string tensor (``regress_x2_to_y3`` takes
floats) cannot take examples: TF Serving fails it with INVALID_ARGUMENT, and so
do we, with a message that says why.  The graph tensor's dtype decides, not the
SignatureDef's: TF 1.0 exports (``half_plus_three``) declare their string input
as DT_FLOAT, and TF Serving serves them all the same.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from servekit.errors import BadRequest

from .metadata import tf_dtype_name
from .savedmodel import TFModel

INPUTS = "inputs"
OUTPUTS = "outputs"
CLASSES = "classes"
SCORES = "scores"
_INT64 = (-(2**63), 2**63 - 1)


def serialize(examples: list[dict[str, list[Any]]]) -> np.ndarray:
    """One serialized ``tf.Example`` per record, as a string vector.

    A feature's values decide its kind as in TF Serving's JSON parser: ints make
    an ``int64_list``, floats a ``float_list``, bytes a ``bytes_list``; an empty
    list makes a feature of no kind.
    """
    from tensorflow.core.example import example_pb2, feature_pb2

    out = np.empty(len(examples), dtype=object)
    for i, record in enumerate(examples):
        example = example_pb2.Example()
        features = example.features.feature
        for name, values in record.items():
            feature = features[name]
            if not values:
                feature.CopyFrom(feature_pb2.Feature())
            elif isinstance(values[0], bytes):
                feature.bytes_list.value.extend(values)
            elif isinstance(values[0], float):
                feature.float_list.value.extend(values)
            else:
                if any(not (_INT64[0] <= v <= _INT64[1]) for v in values):
                    raise BadRequest(f"examples[{i}].{name}: integer out of the int64 range")
                feature.int64_list.value.extend(values)
        out[i] = example.SerializeToString()
    return out


def _input_tensor(sig_name: str, sig_def: Any, verb: str, model: TFModel) -> str:
    if len(sig_def.inputs) != 1 or INPUTS not in sig_def.inputs:
        raise BadRequest(
            f"signature {sig_name!r} cannot {verb}: expected one input named {INPUTS!r}, "
            f"found {', '.join(sorted(sig_def.inputs)) or 'none'}{_suggest(model, verb)}"
        )
    info = sig_def.inputs[INPUTS]
    dtype = tf_dtype_name(model.graph_dtype(info.name))
    if dtype != "DT_STRING":
        raise BadRequest(
            f"signature {sig_name!r} cannot {verb} examples: its input {INPUTS!r} is a "
            f"{dtype} tensor, not a DT_STRING tensor of serialized tf.Example protos; "
            f'call :predict with {{"inputs": ...}} instead{_suggest(model, verb)}'
        )
    return info.name


def _suggest(model: TFModel, verb: str) -> str:
    usable = [n for n, s in sorted(model.signature_defs.items()) if _takes_examples(model, s, verb)]
    return f" (signatures that can: {', '.join(usable)})" if usable else ""


def _takes_examples(model: TFModel, sig_def: Any, verb: str) -> bool:
    if len(sig_def.inputs) != 1 or INPUTS not in sig_def.inputs:
        return False
    if tf_dtype_name(model.graph_dtype(sig_def.inputs[INPUTS].name)) != "DT_STRING":
        return False
    if verb == "regress":
        return set(sig_def.outputs) == {OUTPUTS}
    return bool(set(sig_def.outputs) & {CLASSES, SCORES}) and len(sig_def.outputs) <= 2


def regress(model: TFModel, examples: list[dict[str, list[Any]]], signature_name: str | None) -> list[float]:
    sig_name, sig_def = model.signature_def(signature_name)
    feed = _input_tensor(sig_name, sig_def, "regress", model)
    if len(sig_def.outputs) != 1 or OUTPUTS not in sig_def.outputs:
        raise BadRequest(
            f"signature {sig_name!r} cannot regress: expected one output named {OUTPUTS!r}, "
            f"found {', '.join(sorted(sig_def.outputs)) or 'none'}{_suggest(model, 'regress')}"
        )
    (values,) = model.run({feed: serialize(examples)}, [sig_def.outputs[OUTPUTS].name])
    n = len(examples)
    column = values.ndim == 1 or (values.ndim == 2 and values.shape[1] == 1)
    if not column or values.shape[0] != n:
        raise BadRequest(
            f"signature {sig_name!r} returned outputs of shape {list(values.shape)}; regress expects [{n}] or [{n}, 1]"
        )
    if values.dtype.kind != "f":
        raise BadRequest(f"signature {sig_name!r} returned {values.dtype} outputs; regress expects floats")
    return values.reshape(n).astype(float).tolist()


def classify(
    model: TFModel, examples: list[dict[str, list[Any]]], signature_name: str | None
) -> list[list[tuple[str, float]]]:
    sig_name, sig_def = model.signature_def(signature_name)
    feed = _input_tensor(sig_name, sig_def, "classify", model)
    wanted = [k for k in (CLASSES, SCORES) if k in sig_def.outputs]
    if not wanted or len(sig_def.outputs) > 2:
        raise BadRequest(
            f"signature {sig_name!r} cannot classify: expected outputs {CLASSES!r} "
            f"and/or {SCORES!r}, "
            f"found {', '.join(sorted(sig_def.outputs)) or 'none'}{_suggest(model, 'classify')}"
        )
    values = model.run({feed: serialize(examples)}, [sig_def.outputs[k].name for k in wanted])
    fetched = dict(zip(wanted, values))
    n = len(examples)
    for key, value in fetched.items():
        if value.ndim != 2 or value.shape[0] != n:
            raise BadRequest(
                f"signature {sig_name!r} returned {key} of shape {list(value.shape)}; "
                f"classify expects [{n}, num_classes]"
            )
    classes, scores = fetched.get(CLASSES), fetched.get(SCORES)
    if classes is not None and scores is not None and classes.shape[1] != scores.shape[1]:
        raise BadRequest(
            f"signature {sig_name!r} returned {classes.shape[1]} classes but {scores.shape[1]} scores per example"
        )
    if scores is not None and scores.dtype.kind != "f":
        raise BadRequest(f"signature {sig_name!r} returned {scores.dtype} scores; classify expects floats")
    width = next(iter(fetched.values())).shape[1]  # classes and scores agree (checked above)
    results = []
    for i in range(n):
        if classes is not None:
            labels = [_label(classes[i, c]) for c in range(width)]
        else:
            labels = [""] * width
        row_scores: list[float] = scores[i].astype(float).tolist() if scores is not None else [0.0] * width
        results.append(list(zip(labels, row_scores)))
    return results


def _label(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="backslashreplace")
    return str(value)
