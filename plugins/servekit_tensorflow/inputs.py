"""Request tensors as a signature's feeds: matched by name and cast to its dtypes.

TF Serving parses each JSON value straight into the dtype its SignatureDef
declares.  Our codecs decode first (ints, floats, bools, strings), so the cast
happens here, and only when it keeps every value: ``1.5`` into an integer
input, a negative number into an unsigned one, ``true`` into a number or a
number into a string is a 400 naming the input, never a silent change.  Floats
narrow to ``DT_FLOAT`` as in TF Serving (its documentation's "Floating Point
Precision"), but a finite value that would become infinite is refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from servekit import V2_TO_NUMPY
from servekit.errors import BadRequest

from .metadata import tf_dtype_name, v2_datatype


def feeds_for(sig_name: str, sig_def: Any, inputs: Any) -> dict[str, np.ndarray]:
    """Graph tensor name -> value, for every input the request gives."""
    expected = dict(sig_def.inputs)
    if not isinstance(inputs, dict):
        if len(expected) != 1:
            raise BadRequest(
                f"signature {sig_name!r} takes {len(expected)} inputs "
                f"({', '.join(sorted(expected)) or 'none'}); send them by name"
            )
        inputs = {next(iter(expected)): inputs}
    unknown = sorted(set(inputs) - set(expected))
    if unknown:
        raise BadRequest(
            f"signature {sig_name!r} has no input(s) {', '.join(unknown)}; its inputs are {', '.join(sorted(expected))}"
        )
    with_default = set(getattr(sig_def, "defaults", {}) or {})
    missing = sorted(set(expected) - set(inputs) - with_default)
    if missing:
        raise BadRequest(f"signature {sig_name!r} is missing input(s) {', '.join(missing)}")
    feeds = {}
    for key, value in inputs.items():
        info = expected[key]
        if info.WhichOneof("encoding") != "name":
            raise BadRequest(f"input {key!r} is a sparse or composite tensor, which predict cannot feed")
        feeds[info.name] = cast(np.asarray(value), info.dtype, key)
    return feeds


def cast(value: np.ndarray, dtype: int, where: str) -> np.ndarray:
    """``value`` as the numpy equivalent of TensorFlow dtype ``dtype``, losing nothing."""
    datatype = v2_datatype(dtype)
    target = V2_TO_NUMPY.get(datatype)
    if target is None:
        raise BadRequest(f"input {where!r} has dtype {tf_dtype_name(dtype)}, which JSON cannot express")
    kind = value.dtype.kind
    name = tf_dtype_name(dtype)
    if datatype == "BYTES":
        return _as_bytes(value, where)
    if kind in "OSU":
        raise BadRequest(f"input {where!r} expects {name} numbers, found strings")
    if value.dtype == target:
        return value
    if target.kind == "b":
        if kind != "b":
            raise BadRequest(f"input {where!r} expects DT_BOOL (true/false), found numbers")
        return value.astype(target)
    if kind == "b":
        raise BadRequest(f"input {where!r} expects {name} numbers, found true/false")
    if target.kind == "f":
        # beyond the range a narrower float rounds to +/-inf, as TF Serving's JSON
        # decoding does (json_tensor test "FloatTensorThatExceedsMaxReturnsInf")
        with np.errstate(over="ignore"):
            return value.astype(target)
    return _as_integers(value, target, dtype, where)


def _as_integers(value: np.ndarray, target: np.dtype, dtype: int, where: str) -> np.ndarray:
    name = tf_dtype_name(dtype)
    fractional = value.dtype.kind == "f" and (not np.all(np.isfinite(value)) or np.any(value != np.round(value)))
    if fractional:
        raise BadRequest(f"input {where!r} expects {name} integers, found a fractional or non-finite value")
    info = np.iinfo(target)
    if value.size and (value.min() < info.min or value.max() > info.max):
        raise BadRequest(f"input {where!r}: a value is out of the range of {name} [{info.min}, {info.max}]")
    return value.astype(target)


def _as_bytes(value: np.ndarray, where: str) -> np.ndarray:
    if value.dtype.kind == "S":
        return value.astype(object)
    if value.dtype.kind not in "OU":
        raise BadRequest(f"input {where!r} expects DT_STRING values, found numbers")
    flat = value.reshape(-1)
    out = np.empty(flat.shape, dtype=object)
    for i, item in enumerate(flat):
        if isinstance(item, bytes):
            out[i] = item
        elif isinstance(item, str):
            out[i] = item.encode("utf-8")
        else:
            raise BadRequest(f"input {where!r} expects DT_STRING values, found {type(item).__name__}")
    return out.reshape(value.shape)
