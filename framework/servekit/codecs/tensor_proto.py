"""TensorFlow's ``TensorProto`` <-> numpy, in every dtype numpy can hold.

A ``TensorProto`` carries its values either as ``tensor_content`` (the raw
little-endian bytes of the C-order array) or in the typed repeated field of its
dtype (``float_val``, ``int_val``, ``half_val``...).  :func:`to_numpy` reads
both, with TensorFlow's rules: ``tensor_content`` wins; a typed field holding
fewer values than the shape needs is filled with its last value (one value fills
the whole tensor), and an empty one means zeros.  :func:`from_numpy` writes
``tensor_content`` for numbers, as ``tf.make_tensor_proto`` does, or the typed
field when asked; strings always go in ``string_val``.

``bfloat16``, the 8-bit floats and ``int4``/``uint4`` need ``ml_dtypes`` (which
TensorFlow and JAX install); without it those dtypes are refused, never
converted.  Quantized, resource and variant tensors are refused: a model could
not tell them from plain integers.

Works on any message with TensorProto's fields (ours or TensorFlow's own class).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from servekit.codecs import bounds
from servekit.errors import BadRequest, ModelFailure

try:  # optional: bfloat16, float8 and int4 dtypes
    import ml_dtypes
except ImportError:  # pragma: no cover - depends on the environment
    ml_dtypes = None  # type: ignore[assignment]


@dataclass(frozen=True)
class DType:
    """One TensorFlow DataType: its enum number, numpy dtype and typed value field."""

    name: str
    number: int
    numpy: np.dtype
    field: str
    #: how a typed-field value relates to the numpy value
    kind: str = "plain"  # plain | bits16 (half_val) | complex (pairs) | bytes8 (float8_val)


def _table() -> list[DType]:
    rows = [
        DType("DT_FLOAT", 1, np.dtype(np.float32), "float_val"),
        DType("DT_DOUBLE", 2, np.dtype(np.float64), "double_val"),
        DType("DT_INT32", 3, np.dtype(np.int32), "int_val"),
        DType("DT_UINT8", 4, np.dtype(np.uint8), "int_val"),
        DType("DT_INT16", 5, np.dtype(np.int16), "int_val"),
        DType("DT_INT8", 6, np.dtype(np.int8), "int_val"),
        DType("DT_STRING", 7, np.dtype(object), "string_val"),
        DType("DT_COMPLEX64", 8, np.dtype(np.complex64), "scomplex_val", "complex"),
        DType("DT_INT64", 9, np.dtype(np.int64), "int64_val"),
        DType("DT_BOOL", 10, np.dtype(np.bool_), "bool_val"),
        DType("DT_UINT16", 17, np.dtype(np.uint16), "int_val"),
        DType("DT_COMPLEX128", 18, np.dtype(np.complex128), "dcomplex_val", "complex"),
        DType("DT_HALF", 19, np.dtype(np.float16), "half_val", "bits16"),
        DType("DT_UINT32", 22, np.dtype(np.uint32), "uint32_val"),
        DType("DT_UINT64", 23, np.dtype(np.uint64), "uint64_val"),
    ]
    if ml_dtypes is not None:
        rows += [
            DType("DT_BFLOAT16", 14, np.dtype(ml_dtypes.bfloat16), "half_val", "bits16"),
            DType("DT_FLOAT8_E5M2", 24, np.dtype(ml_dtypes.float8_e5m2), "float8_val", "bytes8"),
            DType("DT_FLOAT8_E4M3FN", 25, np.dtype(ml_dtypes.float8_e4m3fn), "float8_val", "bytes8"),
            DType(
                "DT_FLOAT8_E4M3FNUZ",
                26,
                np.dtype(ml_dtypes.float8_e4m3fnuz),
                "float8_val",
                "bytes8",
            ),
            DType(
                "DT_FLOAT8_E4M3B11FNUZ",
                27,
                np.dtype(ml_dtypes.float8_e4m3b11fnuz),
                "float8_val",
                "bytes8",
            ),
            DType(
                "DT_FLOAT8_E5M2FNUZ",
                28,
                np.dtype(ml_dtypes.float8_e5m2fnuz),
                "float8_val",
                "bytes8",
            ),
            DType("DT_INT4", 29, np.dtype(ml_dtypes.int4), "int_val"),
            DType("DT_UINT4", 30, np.dtype(ml_dtypes.uint4), "int_val"),
        ]
    return rows


_DTYPES = _table()
BY_NUMBER: dict[int, DType] = {d.number: d for d in _DTYPES}
BY_NAME: dict[str, DType] = {d.name: d for d in _DTYPES}
_BY_NUMPY: dict[np.dtype, DType] = {d.numpy: d for d in _DTYPES}

#: TensorFlow dtypes a client may send that no numpy dtype stands for.
_REFUSED = {
    11: "DT_QINT8",
    12: "DT_QUINT8",
    13: "DT_QINT32",
    15: "DT_QINT16",
    16: "DT_QUINT16",
    20: "DT_RESOURCE",
    21: "DT_VARIANT",
    31: "DT_INT2",
    32: "DT_UINT2",
    33: "DT_FLOAT4_E2M1FN",
}


def dtype_for_number(number: int) -> DType:
    found = BY_NUMBER.get(number)
    if found is not None:
        return found
    if number in _REFUSED:
        raise BadRequest(f"tensor dtype {_REFUSED[number]} is not supported; send a numeric, bool or string tensor")
    if number in (14, 24, 25, 26, 27, 28, 29, 30):
        raise BadRequest(f"tensor dtype {number} needs the ml_dtypes package on the server")
    if number == 0:
        raise BadRequest("tensor dtype is DT_INVALID (0); set TensorProto.dtype")
    raise BadRequest(f"unknown or reference tensor dtype {number}")


def dtype_for_numpy(dtype: np.dtype) -> DType:
    dtype = np.dtype(dtype)
    if dtype.kind in "OSU":
        return BY_NAME["DT_STRING"]
    found = _BY_NUMPY.get(dtype.newbyteorder("="))
    if found is None:
        raise ModelFailure(f"numpy dtype {dtype} has no TensorFlow DataType")
    return found


# ---------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------


def shape_of(proto: Any, where: str = "tensor") -> tuple[int, ...]:
    shape = proto.tensor_shape
    if shape.unknown_rank:
        raise BadRequest(f"{where}: tensor_shape has unknown_rank; a request tensor needs a known shape")
    dims = tuple(int(d.size) for d in shape.dim)
    if any(d < 0 for d in dims):
        raise BadRequest(f"{where}: tensor_shape {list(dims)} has a negative dimension")
    return dims


def to_numpy(proto: Any, where: str = "tensor") -> np.ndarray:
    """Decode one ``TensorProto`` into a writable numpy array of its dtype and shape.

    :raises BadRequest: an unsupported dtype, a shape the values do not fit.
    """
    dt = dtype_for_number(int(proto.dtype))
    shape = shape_of(proto, where)
    count = bounds.element_count(shape, where)
    if dt.name == "DT_STRING":
        return _strings(list(proto.string_val), shape, count, where)
    if proto.tensor_content:
        return _from_content(proto.tensor_content, dt, shape, count, where)
    return _from_field(proto, dt, shape, count, where)


def _from_content(content: bytes, dt: DType, shape: tuple[int, ...], count: int, where: str) -> np.ndarray:
    little = dt.numpy.newbyteorder("<")
    expected = count * little.itemsize
    if len(content) != expected:
        raise BadRequest(
            f"{where}: tensor_content holds {len(content)} bytes; a {dt.name} tensor of shape "
            f"{list(shape)} needs {expected}"
        )
    if dt.name == "DT_BOOL" and count and bool((np.frombuffer(content, np.uint8) > 1).any()):
        raise BadRequest(f"{where}: DT_BOOL tensor_content bytes must be 0 or 1")
    # astype copies into native byte order, so the model gets a writable array
    return np.frombuffer(content, dtype=little).astype(dt.numpy).reshape(shape)


def _from_field(proto: Any, dt: DType, shape: tuple[int, ...], count: int, where: str) -> np.ndarray:
    if dt.kind == "bytes8":
        values = np.frombuffer(proto.float8_val, dtype=np.uint8).view(dt.numpy)
    elif dt.kind == "bits16":
        bits = np.asarray(getattr(proto, dt.field), dtype=np.int64)
        if bits.size and (bits.min() < 0 or bits.max() > 0xFFFF):
            raise BadRequest(f"{where}: {dt.field} values must be 16-bit patterns (0..65535)")
        values = bits.astype(np.uint16).view(dt.numpy)
    elif dt.kind == "complex":
        pairs = np.asarray(getattr(proto, dt.field), dtype=dt.numpy.type(0).real.dtype)
        if pairs.size % 2:
            raise BadRequest(f"{where}: {dt.field} needs real and imaginary parts in pairs, found {pairs.size} values")
        values = pairs.view(dt.numpy)
    else:
        values = _checked_ints(getattr(proto, dt.field), dt, where)
    return _fill(values, dt, shape, count, where)


_NARROW_INTS = {"DT_INT8", "DT_UINT8", "DT_INT16", "DT_UINT16", "DT_INT4", "DT_UINT4"}


def _checked_ints(raw: Any, dt: DType, where: str) -> np.ndarray:
    """Typed values as the tensor's dtype; an integer too wide for it is refused, never wrapped."""
    if dt.name not in _NARROW_INTS:
        return np.asarray(raw, dtype=dt.numpy)
    wide = np.asarray(raw, dtype=np.int64)
    if wide.size:
        info = ml_dtypes.iinfo(dt.numpy) if dt.name in ("DT_INT4", "DT_UINT4") else np.iinfo(dt.numpy)
        if wide.min() < int(info.min) or wide.max() > int(info.max):
            raise BadRequest(f"{where}: a value in {dt.field} is out of range for {dt.name}")
    return wide.astype(dt.numpy)


def _fill(values: np.ndarray, dt: DType, shape: tuple[int, ...], count: int, where: str) -> np.ndarray:
    given = values.size
    if given == count:
        return values.reshape(shape).copy()
    if given > count:
        raise BadRequest(f"{where}: {dt.field} holds {given} values; shape {list(shape)} has room for {count}")
    if given == 0:
        return np.zeros(shape, dtype=dt.numpy)
    # TensorFlow's rule: the last value fills the rest (one value fills the tensor)
    out = np.empty(count, dtype=dt.numpy)
    out[:given] = values
    out[given:] = values[-1]
    return out.reshape(shape)


def _strings(values: list[bytes], shape: tuple[int, ...], count: int, where: str) -> np.ndarray:
    if len(values) > count:
        raise BadRequest(f"{where}: string_val holds {len(values)} values; shape {list(shape)} has room for {count}")
    out = np.empty(count, dtype=object)
    if values:
        out[: len(values)] = values
        out[len(values) :] = values[-1]
    else:
        out[:] = b""
    return out.reshape(shape)


# ---------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------


def from_numpy(array: Any, into: Any, *, use_tensor_content: bool = True, name: str = "output") -> Any:
    """Write ``array`` into the ``TensorProto`` message ``into`` (e.g. ``response.outputs[name]``).

    :param use_tensor_content: numbers as raw bytes (``True``) or in the dtype's
        typed field (``False``).  Strings always use ``string_val``.
    :returns: ``into``.
    """
    arr = np.asarray(array)
    dt = dtype_for_numpy(arr.dtype) if arr.dtype.kind != "O" else _object_dtype(arr, name)
    into.Clear()
    into.dtype = dt.number
    dims = into.tensor_shape.dim
    for size in arr.shape:
        dims.add().size = size
    if dt.name == "DT_STRING":
        into.string_val.extend(_as_bytes(v, name) for v in arr.reshape(-1))
    elif use_tensor_content:
        into.tensor_content = np.ascontiguousarray(arr, dtype=dt.numpy.newbyteorder("<")).tobytes()
    else:
        _to_field(arr.astype(dt.numpy, copy=False).reshape(-1), dt, into)
    return into


def _object_dtype(arr: np.ndarray, name: str) -> DType:
    """An object array is a string tensor if it holds str/bytes, else its values decide."""
    flat = arr.reshape(-1)
    if all(isinstance(v, (bytes, str, np.bytes_, np.str_)) for v in flat):
        return BY_NAME["DT_STRING"]
    numeric = np.asarray(flat.tolist())
    if numeric.dtype.kind == "O":
        raise ModelFailure(f"output {name!r} mixes strings and other values; no TensorFlow dtype holds it")
    return dtype_for_numpy(numeric.dtype)


def _as_bytes(value: Any, name: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise ModelFailure(f"string output {name!r} holds a {type(value).__name__}")


def _to_field(flat: np.ndarray, dt: DType, into: Any) -> None:
    if dt.kind == "bytes8":
        into.float8_val = flat.view(np.uint8).tobytes()
    elif dt.kind == "bits16":
        into.half_val.extend(flat.view(np.uint16).astype(np.int32).tolist())
    elif dt.kind == "complex":
        getattr(into, dt.field).extend(flat.view(flat.real.dtype).tolist())
    elif dt.name in ("DT_INT4", "DT_UINT4"):
        into.int_val.extend(flat.astype(np.int32).tolist())
    else:
        getattr(into, dt.field).extend(flat.tolist())


__all__ = ["BY_NAME", "BY_NUMBER", "DType", "dtype_for_numpy", "from_numpy", "shape_of", "to_numpy"]
