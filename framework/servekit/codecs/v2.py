"""The V2 / Open Inference Protocol tensor format, JSON and binary, both ways.

Two layers:

- Pure tensor functions, shared with the gRPC ``GRPCInferenceService`` (its
  ``raw_input_contents`` / ``raw_output_contents`` use the same binary layout):
  :func:`tensor_from_bytes`, :func:`tensor_to_bytes`, :func:`tensor_from_json`,
  :func:`tensor_to_json`, :func:`datatype_of`, :func:`as_v2_array`.
- Whole HTTP documents: :func:`decode_infer_request` (a JSON header, optionally
  followed by binary tensor data, as Triton's binary tensor data extension
  defines) and :func:`encode_infer_response`.

A protocol calls :func:`decode_infer_request` once and gets the whole
:class:`~servekit.codecs.infer_request.InferRequest` back.  It reads a request
in one pass: each tensor's header (name, shape, datatype, parameters) is
checked once and its data decoded with the checked values
(:func:`tensor_from_checked_bytes`), the hottest path of the server.

The binary layout: little-endian, row-major, no padding; ``BOOL`` one byte per
element (0 or 1); ``BYTES`` each element as a 4-byte little-endian length
followed by its bytes.  Fixed-size tensors are converted with ``numpy.frombuffer``
/ ``tobytes`` in one call each; only ``BYTES`` walks its elements, since their
lengths vary.

``BYTES`` tensors reach a model as ``numpy`` object arrays of ``bytes``, whether
the client sent JSON strings or binary data, so a model sees one type either way.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from servekit.codecs import bounds
from servekit.codecs import json as jsonc
from servekit.codecs.dtypes import V2_TO_NUMPY, holds_boolean, numpy_to_v2, v2_to_numpy
from servekit.codecs.infer_request import (
    INPUT_PARAMETERS,
    OUTPUT_PARAMETERS,
    InferRequest,
    RequestedOutput,
    add_output,
    check_request_parameters,
    check_tensor_parameters,
    signature_of,
)
from servekit.codecs.shared_memory import Regions, placement_of
from servekit.errors import BadRequest, ModelFailure

#: The header of the binary tensor data extension: the JSON part's length in bytes.
HEADER_LENGTH = "Inference-Header-Content-Length"

_LENGTH = struct.Struct("<I")
_INT_KINDS = "iu"


# ---------------------------------------------------------------------------
# Shapes and datatypes
# ---------------------------------------------------------------------------


def check_shape(shape: Any, where: str) -> tuple[int, ...]:
    """A request tensor's ``shape``: a list of non-negative integers."""
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise BadRequest(f"{where}: 'shape' must be a list of non-negative integers, found {shape!r}")
    return tuple(shape)


def element_count(shape: tuple[int, ...]) -> int:
    """Elements in ``shape``, refused (413) above ``--max-tensor-elements`` before any allocation."""
    return bounds.element_count(shape)


def check_datatype(datatype: Any, where: str) -> str:
    if not isinstance(datatype, str):
        raise BadRequest(f"{where}: 'datatype' must be a string, found {datatype!r}")
    if datatype not in V2_TO_NUMPY:
        raise BadRequest(f"{where}: unsupported datatype {datatype!r}; expected one of {', '.join(V2_TO_NUMPY)}")
    return datatype


def datatype_of(arr: np.ndarray) -> str:
    """The V2 datatype of an output array (strings, bytes and object arrays are ``BYTES``)."""
    return numpy_to_v2(arr.dtype)


def as_v2_array(value: Any, name: str) -> np.ndarray:
    """A model's output as an array of a V2 datatype, without changing its values.

    An object array holding only numbers (a list of Python floats that went
    through ``numpy.asarray`` with strings elsewhere, say) becomes numeric; an
    object array of anything but ``str``/``bytes`` is a model failure, since V2
    has no type for it.
    """
    arr = value if isinstance(value, np.ndarray) else np.asarray(value)
    if arr.dtype.kind != "O" or arr.size == 0:
        if arr.dtype.kind not in "OSUbiuf":
            raise ModelFailure(f"output {name!r} has dtype {arr.dtype}, which V2 cannot carry")
        return arr
    flat = arr.reshape(-1)
    if all(isinstance(v, (bytes, str)) for v in flat):
        return arr
    numeric = np.asarray(flat.tolist())
    if numeric.dtype.kind in "biuf":
        return numeric.reshape(arr.shape)
    kinds = sorted({type(v).__name__ for v in flat if not isinstance(v, (bytes, str))})
    raise ModelFailure(f"output {name!r} holds {', '.join(kinds)} values; V2 carries numbers, booleans and strings")


# ---------------------------------------------------------------------------
# Binary tensor data
# ---------------------------------------------------------------------------


def tensor_from_bytes(
    datatype: str, shape: list[int] | tuple[int, ...], raw: bytes | bytearray | memoryview
) -> np.ndarray:
    """Decode one tensor's binary data (V2 binary extension / gRPC raw contents).

    :param datatype: a V2 datatype name (``FP32``, ``BYTES``, ...).
    :param shape: the tensor's shape; the data must hold exactly its element count.
    :param raw: the tensor's bytes.  When ``raw`` is writable (a ``bytearray`` or
        a view of one) the array shares its memory, so no copy is made; otherwise
        the array is a writable copy, so a model may change its inputs in place.
    :raises BadRequest: unknown datatype, or a size that does not match the shape.
    """
    datatype = check_datatype(datatype, "binary tensor data")
    return tensor_from_checked_bytes(datatype, tuple(int(d) for d in shape), raw)


def tensor_from_checked_bytes(datatype: str, shape: tuple[int, ...], raw: bytes | bytearray | memoryview) -> np.ndarray:
    """:func:`tensor_from_bytes` for a request decoder that checked ``datatype`` and ``shape`` already.

    The request decoders (HTTP's and gRPC's) check a tensor's datatype and shape
    once, as they read its header, and hand them here as they are: the hottest
    path of the server does each check once.
    """
    where = "binary tensor data"
    count = element_count(shape)
    view = memoryview(raw).cast("B")
    if datatype == "BYTES":
        return _bytes_from_binary(view, shape, count)
    dtype = v2_to_numpy(datatype).newbyteorder("<")
    expected = count * dtype.itemsize
    if view.nbytes != expected:
        raise BadRequest(
            f"{where}: a {datatype} tensor of shape {list(shape)} needs {expected} bytes, found {view.nbytes}"
        )
    if datatype == "BOOL":
        as_bytes = np.frombuffer(view, dtype=np.uint8)
        if as_bytes.size and bool((as_bytes > 1).any()):
            raise BadRequest(f"{where}: BOOL elements must be bytes 0 or 1")
    arr = np.frombuffer(view, dtype=dtype)
    if view.readonly:
        arr = arr.copy()
    return arr.reshape(shape)


def _bytes_from_binary(view: memoryview, shape: tuple[int, ...], count: int) -> np.ndarray:
    items: list[bytes] = []  # grows with the data, never to a shape's word alone
    offset, size = 0, view.nbytes
    for i in range(count):
        if offset + 4 > size:
            raise BadRequest(f"binary tensor data: BYTES data ends after {i} of {count} elements (shape {list(shape)})")
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4
        if offset + length > size:
            raise BadRequest(f"binary tensor data: BYTES element {i} claims {length} bytes past the data's end")
        items.append(view[offset : offset + length].tobytes())
        offset += length
    if offset != size:
        raise BadRequest(
            f"binary tensor data: {size - offset} bytes left over after {count} BYTES elements (shape {list(shape)})"
        )
    out = np.empty(count, dtype=object)
    out[:] = items
    return out.reshape(shape)


def tensor_to_bytes(arr: np.ndarray) -> bytes:
    """Encode one tensor as V2 binary data (the inverse of :func:`tensor_from_bytes`).

    Numeric and ``BOOL`` arrays become their little-endian element bytes in
    row-major order; string, bytes and object arrays become length-prefixed
    ``BYTES`` elements (``str`` encoded as UTF-8).
    """
    if datatype_of(arr) == "BYTES":
        parts: list[bytes] = []
        for value in arr.reshape(-1):
            data = _as_bytes(value)
            parts.append(_LENGTH.pack(len(data)))
            parts.append(data)
        return b"".join(parts)
    little = arr.dtype.newbyteorder("<")
    return np.ascontiguousarray(arr, dtype=little).tobytes()


def tensor_to_bytes_items(arr: np.ndarray) -> list[bytes]:
    """A ``BYTES`` tensor's elements as ``bytes`` (``str`` encoded as UTF-8), flat."""
    return [_as_bytes(value) for value in arr.reshape(-1)]


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, np.bytes_):
        return bytes(value)
    raise ModelFailure(f"a BYTES output holds a {type(value).__name__}; expected str or bytes")


# ---------------------------------------------------------------------------
# JSON tensor data
# ---------------------------------------------------------------------------


def tensor_from_json(datatype: str, shape: list[int] | tuple[int, ...], data: Any, where: str = "tensor") -> np.ndarray:
    """Decode a tensor's JSON ``data``: flat row-major, or nested in the tensor's own shape.

    Values are checked, never coerced: a float for an ``INT32`` input, a value
    outside the datatype's range, a number for ``BOOL`` or for ``BYTES`` is a
    :class:`BadRequest`.  Numbers go through ``numpy.asarray`` in one call.
    """
    datatype = check_datatype(datatype, where)
    return _tensor_from_checked_json(datatype, tuple(int(d) for d in shape), data, where)


def _tensor_from_checked_json(datatype: str, shape: tuple[int, ...], data: Any, where: str) -> np.ndarray:
    """:func:`tensor_from_json` once the request decoder checked ``datatype`` and ``shape``."""
    count = element_count(shape)
    if not isinstance(data, list):
        if count == 1 and isinstance(data, (int, float, str, bool)):
            data = [data]  # a scalar for a one-element tensor
        else:
            raise BadRequest(f"{where}: 'data' must be a list, found {type(data).__name__}")
    if datatype == "BYTES":
        return _bytes_from_json(data, shape, count, where)
    try:
        arr = np.asarray(data)
    except (ValueError, OverflowError):
        raise BadRequest(
            f"{where}: 'data' is ragged, mixes types or holds integers beyond 64 bits; "
            f"expected {count} {datatype} values"
        ) from None
    _check_layout(arr, shape, count, where)
    if datatype != "BOOL" and holds_boolean(data, arr):
        raise BadRequest(f"{where}: {datatype} data must be numbers, found a boolean among them")
    if arr.dtype.kind == "f" and V2_TO_NUMPY[datatype].kind in _INT_KINDS:
        # numpy turns ints beyond int64 (UINT64's upper half) into floats; look again
        arr = _python_ints(arr, data, datatype, where)
    return _cast_checked(arr, datatype, where).reshape(shape)


def _python_ints(arr: np.ndarray, data: list, datatype: str, where: str) -> np.ndarray:
    flat = np.asarray(data, dtype=object).reshape(-1).tolist()
    if not all(type(v) is int for v in flat):
        raise BadRequest(f"{where}: {datatype} data must be integers, found floating-point values")
    info = np.iinfo(V2_TO_NUMPY[datatype])
    if min(flat) < info.min or max(flat) > info.max:
        raise BadRequest(f"{where}: value out of the {datatype} range [{info.min}, {info.max}]")
    return np.array(flat, dtype=V2_TO_NUMPY[datatype])


def _check_layout(arr: np.ndarray, shape: tuple[int, ...], count: int, where: str) -> None:
    if arr.ndim > 1 and arr.shape != shape:
        raise BadRequest(f"{where}: 'data' is nested as {list(arr.shape)} but 'shape' is {list(shape)}")
    if arr.size != count:
        raise BadRequest(f"{where}: 'shape' {list(shape)} needs {count} elements, but 'data' holds {arr.size}")


def _cast_checked(arr: np.ndarray, datatype: str, where: str) -> np.ndarray:
    target = V2_TO_NUMPY[datatype]
    kind = arr.dtype.kind
    if arr.size == 0:
        return arr.astype(target)
    if datatype == "BOOL":
        if kind != "b":
            raise BadRequest(f"{where}: BOOL data must be true/false, found {_found(arr)}")
        return arr
    if kind == "b" or kind not in "iuf":
        raise BadRequest(f"{where}: {datatype} data must be numbers, found {_found(arr)}")
    if target.kind in _INT_KINDS:
        if kind == "f":
            raise BadRequest(f"{where}: {datatype} data must be integers, found floating-point values")
        info = np.iinfo(target)
        low, high = arr.min(), arr.max()
        if int(low) < info.min or int(high) > info.max:
            raise BadRequest(f"{where}: value out of the {datatype} range [{info.min}, {info.max}]")
        return arr.astype(target, copy=False)
    with np.errstate(over="ignore"):  # overflow is reported below, as a client error
        cast = arr.astype(target, copy=False)
    # the cast's own check first: it settles the common case (every value fits) in one pass
    if cast.dtype.itemsize < arr.dtype.itemsize and not np.isfinite(cast).all() and np.isfinite(arr).all():
        raise BadRequest(f"{where}: value out of the {datatype} range (it would become infinite)")
    return cast


def _found(arr: np.ndarray) -> str:
    return {"b": "booleans", "U": "strings", "S": "strings", "O": "mixed or out-of-range values"}.get(
        arr.dtype.kind, "numbers"
    )


def _bytes_from_json(data: list, shape: tuple[int, ...], count: int, where: str) -> np.ndarray:
    flat = _flatten_strings(data, shape, where)
    if len(flat) != count:
        raise BadRequest(f"{where}: 'shape' {list(shape)} needs {count} elements, but 'data' holds {len(flat)}")
    out = np.empty(count, dtype=object)
    out[:] = [s.encode("utf-8") for s in flat]
    return out.reshape(shape)


def _flatten_strings(data: list, shape: tuple[int, ...], where: str) -> list[str]:
    if all(isinstance(v, str) for v in data):
        return data
    if not any(isinstance(v, list) for v in data):
        raise BadRequest(f"{where}: BYTES data must be strings")
    # Nested in the tensor's own shape: check it level by level.
    flat: list[str] = []

    def walk(node: Any, depth: int) -> None:
        if depth == len(shape):
            if not isinstance(node, str):
                raise BadRequest(f"{where}: BYTES data must be strings, found {type(node).__name__}")
            flat.append(node)
            return
        if not isinstance(node, list) or len(node) != shape[depth]:
            raise BadRequest(f"{where}: 'data' is not nested as 'shape' {list(shape)}")
        for child in node:
            walk(child, depth + 1)

    walk(data, 0)
    return flat


def tensor_to_json(arr: np.ndarray) -> np.ndarray | list[Any]:
    """A tensor's elements, flat, ready for :func:`servekit.codecs.json.dumps`.

    Numbers and booleans stay a flat numpy array (orjson writes it in one C call,
    each float in its shortest round-trip form); ``BYTES`` become UTF-8 strings.

    :raises BadRequest: a ``BYTES`` element that is not UTF-8 text; JSON cannot
        carry it, so the client must ask for that output as binary data.
    """
    flat = arr.reshape(-1)
    if datatype_of(arr) != "BYTES":
        return np.ascontiguousarray(flat)
    out = []
    for value in flat:
        if isinstance(value, (bytes, np.bytes_)):
            try:
                value = bytes(value).decode("utf-8")
            except UnicodeDecodeError:
                raise BadRequest(
                    "an output holds bytes that are not UTF-8 text, which JSON cannot carry; "
                    'request it with "binary_data": true'
                ) from None
        elif not isinstance(value, str):
            raise ModelFailure(f"a BYTES output holds a {type(value).__name__}; expected str or bytes")
        out.append(value)
    return out


# ---------------------------------------------------------------------------
# Inference requests and responses (HTTP)
# ---------------------------------------------------------------------------


def split_body(body: bytes | bytearray, header_length: str | None) -> tuple[memoryview, memoryview]:
    """The JSON part and the binary part of a request body.

    :param header_length: the ``Inference-Header-Content-Length`` header, if any.
    """
    view = memoryview(body)
    if header_length is None:
        return view, view[len(view) :]
    try:
        length = int(header_length)
    except ValueError:
        raise BadRequest(f"{HEADER_LENGTH} must be an integer, found {header_length!r}") from None
    if length < 0 or length > len(view):
        raise BadRequest(f"{HEADER_LENGTH} is {length} but the body has {len(view)} bytes")
    return view[:length], view[length:]


def decode_infer_request(
    body: bytes | bytearray, header_length: str | None = None, regions: Regions | None = None
) -> InferRequest:
    """Decode an HTTP inference request: JSON, then the binary tensor data if any.

    Accepts the standard ``{"inputs": [...]}`` document and the single-tensor
    form ``{"name", "shape", "datatype", "parameters", "data"}`` as a one-input
    request.  Pass a ``bytearray`` body to let binary inputs share its memory.
    An input may name a shared-memory region instead (``regions``: the
    registered ones, :mod:`servekit.codecs.shared_memory`).
    """
    head, binary = split_body(body, header_length)
    if not len(head):
        raise BadRequest("request body is empty; expected a JSON inference request")
    doc = jsonc.loads(body if header_length is None and isinstance(body, bytes) else head.tobytes())
    if not isinstance(doc, dict):
        raise BadRequest("the inference request must be a JSON object")
    parameters = _parameters(doc.get("parameters"), "request")
    if "inputs" in doc:
        raw_inputs = doc["inputs"]
        if not isinstance(raw_inputs, list) or not raw_inputs:
            raise BadRequest("'inputs' must be a non-empty list of tensors")
    elif "data" in doc or "datatype" in doc:
        raw_inputs = [doc]  # the single-tensor request form
    else:
        raise BadRequest('request has no \'inputs\'; expected {"inputs": [{"name", "shape", "datatype", "data"}]}')
    single = raw_inputs[0] is doc
    check_keys(doc, SINGLE_TENSOR_KEYS if single else REQUEST_KEYS, "the inference request")
    scheduling = check_request_parameters(parameters)

    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for i, spec in enumerate(bounds.limited_inputs(raw_inputs)):
        name, arr, used = _decode_input(spec, i, binary, offset, regions, single=single)
        if name in inputs:
            raise BadRequest(f"input {name!r} is given twice")
        inputs[name] = arr
        offset += used
    if offset != len(binary):
        raise BadRequest(
            f"the body has {len(binary)} bytes of binary tensor data but the inputs' binary_data_size add up to {offset}"
        )
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise BadRequest(f"'id' must be a string, found {request_id!r}")
    outputs = _requested_outputs(doc.get("outputs"))
    decoded = InferRequest(inputs, request_id, parameters, outputs, signature_of(parameters), scheduling=scheduling)
    for key in ("model_name", "model_version"):
        value = doc.get(key)
        if value is not None and not isinstance(value, str):
            raise BadRequest(f"'{key}' must be a string, found {value!r}")
    decoded.addressed = (doc.get("model_name"), doc.get("model_version"))
    return decoded


#: the members of the V2 JSON objects (the protocol's ``$inference_request``,
#: ``$request_input`` and ``$request_output``); any other is refused, naming it.
#: KServe's client also writes ``model_name`` (and KServe's types ``model_version``) into
#: the body: they must name the path's model (:attr:`InferRequest.addressed`)
REQUEST_KEYS = ("id", "parameters", "inputs", "outputs", "model_name", "model_version")
INPUT_KEYS = ("name", "shape", "datatype", "parameters", "data")
OUTPUT_KEYS = ("name", "parameters")
#: a one-input request: the input's members and the request's
SINGLE_TENSOR_KEYS = (*INPUT_KEYS, "id", "outputs")


def check_keys(doc: dict[str, Any], known: tuple[str, ...], where: str) -> None:
    """Refuse a member the protocol does not define: servekit would answer as if it were not sent."""
    for key in doc:
        if key not in known:
            raise BadRequest(f"{where} has an unknown field {key!r}; expected {', '.join(known)}")


def _decode_input(
    spec: Any, i: int, binary: memoryview, offset: int, regions: Regions | None = None, single: bool = False
) -> tuple[str, np.ndarray, int]:
    if not isinstance(spec, dict):
        raise BadRequest(f"inputs[{i}] must be an object with name, shape, datatype and data")
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest(f"inputs[{i}] needs a 'name' string")
    where = f"input {name!r}"
    if not single:  # the single-tensor form's members were checked as the request's
        check_keys(spec, INPUT_KEYS, where)
    for key in ("shape", "datatype"):
        if key not in spec:
            raise BadRequest(f"{where} has no '{key}'")
    shape = check_shape(spec["shape"], where)
    datatype = check_datatype(spec["datatype"], where)
    params = _parameters(spec.get("parameters"), where)
    if not single:  # the single-tensor form's parameters are the request's (they reach the model)
        check_tensor_parameters(params, where, INPUT_PARAMETERS, datatype)
    placement = placement_of(params, where)
    if placement is not None:
        if "data" in spec or params.get("binary_data_size") is not None:
            raise BadRequest(f"{where} names a shared memory region and carries data too; send one")
        return name, shared_input(regions, where, datatype, shape, placement), 0
    size = params.get("binary_data_size")
    if size is not None:
        if "data" in spec:
            raise BadRequest(f"{where} has both 'data' and 'binary_data_size'; send one")
        return name, _binary_input(where, datatype, shape, size, binary, offset), size
    if "data" not in spec:
        raise BadRequest(f"{where} has neither 'data' nor a 'binary_data_size' parameter")
    return name, _tensor_from_checked_json(datatype, shape, spec["data"], where), 0


def _binary_input(
    where: str, datatype: str, shape: tuple[int, ...], size: Any, binary: memoryview, offset: int
) -> np.ndarray:
    if type(size) is not int or size < 0:
        raise BadRequest(f"{where}: 'binary_data_size' must be a non-negative integer, found {size!r}")
    if offset + size > len(binary):
        raise BadRequest(
            f"{where}: binary_data_size {size} reaches past the {len(binary)} bytes of binary data "
            f"(is the {HEADER_LENGTH} header right?)"
        )
    try:
        return tensor_from_checked_bytes(datatype, shape, binary[offset : offset + size])
    except BadRequest as exc:
        raise BadRequest(f"{where}: {exc.message}") from None


def shared_input(regions: Regions | None, where: str, datatype: str, shape: tuple[int, ...], placement: Any) -> Any:
    """An input read from the shared-memory region its parameters name (a copy of its bytes)."""
    if regions is None:
        raise BadRequest(f"{where}: shared memory inputs are not served on this path")
    try:
        return tensor_from_bytes(datatype, shape, regions.read(where, placement))
    except BadRequest as exc:
        message = exc.message if exc.message.startswith(where) else f"{where}: {exc.message}"
        raise BadRequest(message) from None


def _requested_outputs(raw: Any) -> list[RequestedOutput] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise BadRequest("'outputs' must be a list of {\"name\": ...} objects")
    outputs: list[RequestedOutput] = []
    for i, spec in enumerate(raw):
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise BadRequest(f"outputs[{i}] must be an object with a 'name' string")
        where = f"requested output {spec['name']!r}"
        check_keys(spec, OUTPUT_KEYS, where)
        params = _parameters(spec.get("parameters"), where)
        check_tensor_parameters(params, where, OUTPUT_PARAMETERS)
        binary = params.get("binary_data")
        if binary is not None and not isinstance(binary, bool):
            raise BadRequest(f"{where}: 'binary_data' must be true or false, found {binary!r}")
        add_output(outputs, spec["name"], binary, params)
    return outputs or None


def _parameters(raw: Any, where: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise BadRequest(f"{where}: 'parameters' must be an object")
    return raw


def encode_infer_response(
    outputs: dict[str, np.ndarray],
    *,
    model_name: str,
    model_version: str | None = None,
    request_id: str | None = None,
    binary: dict[str, bool] | None = None,
    parameters: dict[str, Any] | None = None,
    shared: dict[str, dict[str, Any]] | None = None,
) -> tuple[bytes, int | None]:
    """Encode an inference response.

    :param outputs: named output arrays, already of V2 datatypes (see :func:`as_v2_array`).
    :param binary: per output name, whether to send it as binary data.
    :param shared: outputs already written to shared memory: their parameters, by name
        (the answer carries no data for them).
    :returns: ``(body, header_length)``; ``header_length`` is ``None`` when the
        whole body is JSON, else the value of ``Inference-Header-Content-Length``.
    """
    binary = binary or {}
    tensors = []
    blobs: list[bytes] = []
    for name, arr in outputs.items():
        tensor: dict[str, Any] = {"name": name, "datatype": datatype_of(arr), "shape": list(arr.shape)}
        if shared and name in shared:
            tensor["parameters"] = shared[name]
        elif binary.get(name):
            blob = tensor_to_bytes(arr)
            tensor["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            try:
                tensor["data"] = tensor_to_json(arr)
            except BadRequest as exc:
                raise BadRequest(f"output {name!r}: {exc.message}") from None
        tensors.append(tensor)
    doc: dict[str, Any] = {"model_name": model_name}
    if model_version is not None:
        doc["model_version"] = model_version
    if request_id is not None:
        doc["id"] = request_id
    if parameters:
        doc["parameters"] = parameters
    doc["outputs"] = tensors
    head = jsonc.dumps(doc)
    if not blobs:
        return head, None
    return b"".join([head, *blobs]), len(head)
