"""``Booster.inplace_predict`` for a dense numpy array, without its per-call Python overhead.

``inplace_predict`` answers through XGBoost's C function ``XGBoosterPredictFromDense``,
but on the way (xgboost 2.x and 3.x) it checks the input against a dozen data
frame types, dumps its JSON arguments again, and wraps the answer in a class it
defines anew on every call; for one row that is about half the CPU time of a
prediction and, through the class objects, a garbage collection every few
hundred calls.  :class:`DensePredict` makes the same C call with the arguments
encoded once per prediction type and copies the answer out of XGBoost's
thread-local buffer, so the numbers are the very ones ``inplace_predict`` gives.
Where the C call cannot be reached (an xgboost whose internals differ) it is
``inplace_predict`` itself.
"""

from __future__ import annotations

import ctypes
import json
import math
from typing import Any

import numpy as np

#: the dtypes inplace_predict turns into float32 first; XGBoost reads every other numeric dtype as it is
AS_FLOAT32 = (np.dtype(np.float16), np.dtype(np.bool_), np.dtype(object))


class DensePredict:
    """``predict(X, margin)``: ``booster.inplace_predict(X, predict_type=...)`` for a 2-D numpy array."""

    def __init__(self, booster: Any):
        self.booster = booster
        self.c_call = _c_call()
        self.args = {margin: _arguments(margin) for margin in (False, True)}

    def __call__(self, X: np.ndarray, margin: bool = False) -> np.ndarray:
        if self.c_call is None or not len(X):
            # no rows: the library's own answer, whose shape differs between xgboost releases
            return self.booster.inplace_predict(X, predict_type="margin" if margin else "value")
        X = np.ascontiguousarray(X, dtype=np.float32 if X.dtype in AS_FLOAT32 else None)
        predict, check, ulong = self.c_call
        # numpy's __array_interface__ as XGBoost reads it, formatted directly (json.dumps costs more)
        shape_text = ",".join(map(str, X.shape))
        interface = f'{{"data":[{X.ctypes.data},true],"shape":[{shape_text}],"typestr":"{X.dtype.str}","version":3}}'
        shape = ctypes.POINTER(ulong)()
        dims = ulong()
        out = ctypes.POINTER(ctypes.c_float)()
        check(
            predict(
                self.booster.handle,
                interface.encode(),
                self.args[margin],
                ctypes.c_void_p(),  # no proxy DMatrix: no base margin
                ctypes.byref(shape),
                ctypes.byref(dims),
                ctypes.byref(out),
            )
        )
        answer_shape = tuple(int(shape[i]) for i in range(dims.value))
        size = math.prod(answer_shape)
        if size == 0:
            return np.empty(answer_shape, dtype=np.float32)
        # XGBoost's buffer is the calling thread's and is reused by its next call: copy it
        return np.ctypeslib.as_array(out, shape=(size,)).copy().reshape(answer_shape)


def _arguments(margin: bool) -> bytes:
    """``inplace_predict``'s JSON arguments for its defaults (all iterations, NaN missing, no strict shape)."""
    return json.dumps(
        {
            "type": 1 if margin else 0,
            "training": False,
            "iteration_begin": 0,
            "iteration_end": 0,
            "missing": math.nan,
            "strict_shape": False,
            "cache_id": 0,
        }
    ).encode()


def _c_call() -> tuple[Any, Any, Any] | None:
    try:
        from xgboost.core import _LIB, _check_call, c_bst_ulong
    except ImportError:
        return None
    predict = getattr(_LIB, "XGBoosterPredictFromDense", None)
    return None if predict is None else (predict, _check_call, c_bst_ulong)
