"""One table of tensor datatypes: numpy, V2 (KServe/Triton) and TensorFlow names."""

from __future__ import annotations

from typing import Any

import numpy as np

from servekit.errors import BadRequest

# (V2 name, numpy dtype, TensorFlow DataType name)
_TABLE: list[tuple[str, np.dtype[Any], str]] = [
    ("BOOL", np.dtype(np.bool_), "DT_BOOL"),
    ("UINT8", np.dtype(np.uint8), "DT_UINT8"),
    ("UINT16", np.dtype(np.uint16), "DT_UINT16"),
    ("UINT32", np.dtype(np.uint32), "DT_UINT32"),
    ("UINT64", np.dtype(np.uint64), "DT_UINT64"),
    ("INT8", np.dtype(np.int8), "DT_INT8"),
    ("INT16", np.dtype(np.int16), "DT_INT16"),
    ("INT32", np.dtype(np.int32), "DT_INT32"),
    ("INT64", np.dtype(np.int64), "DT_INT64"),
    ("FP16", np.dtype(np.float16), "DT_HALF"),
    ("FP32", np.dtype(np.float32), "DT_FLOAT"),
    ("FP64", np.dtype(np.float64), "DT_DOUBLE"),
    ("BYTES", np.dtype(object), "DT_STRING"),
]

V2_TO_NUMPY = {v2: np_dt for v2, np_dt, _ in _TABLE}
V2_TO_TF = {v2: tf for v2, _, tf in _TABLE}
TF_TO_V2 = {tf: v2 for v2, _, tf in _TABLE}
_NUMPY_TO_V2 = {np_dt: v2 for v2, np_dt, _ in _TABLE}


def numpy_to_v2(dtype: np.dtype) -> str:
    """The V2 datatype name for a numpy dtype (strings and bytes are ``BYTES``)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "OSU":
        return "BYTES"
    try:
        return _NUMPY_TO_V2[dtype.newbyteorder("=")]
    except KeyError:
        raise BadRequest(f"unsupported tensor dtype {dtype}") from None


def v2_to_numpy(datatype: str) -> np.dtype:
    try:
        return V2_TO_NUMPY[datatype]
    except KeyError:
        raise BadRequest(f"unsupported datatype {datatype!r}; expected one of {', '.join(V2_TO_NUMPY)}") from None


def holds_boolean(data: Any, arr: np.ndarray) -> bool:
    """Whether JSON ``data``, which numpy read as the numbers ``arr``, held a ``true`` or ``false``.

    numpy reads ``[true, 5.1]`` as ``[1.0, 5.1]``, so a boolean among numbers would
    pass as a number.  Only values equal to 0 or 1 can have been booleans: the
    list is walked only when the array holds one.
    """
    if arr.dtype.kind not in "iuf" or not bool(((arr == 0) | (arr == 1)).any()):
        return False
    stack = [data]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif type(node) is bool:
            return True
    return False
