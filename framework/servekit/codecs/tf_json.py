"""TF Serving's JSON tensor mapping (V1 REST), both ways.

Row (``instances``) and columnar (``inputs``) requests, named and unnamed
tensors, ``{"b64": ...}`` binary values and ``_bytes`` output names.  Numeric
tensors go through ``numpy.asarray`` in one C call; only strings, binary values
and malformed input take the Python walk that checks every element.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import numpy as np

from servekit.codecs import bounds, dtypes
from servekit.errors import BadRequest

_NUMERIC_KINDS = "biuf"


def is_b64(value: Any) -> bool:
    return type(value) is dict and len(value) == 1 and "b64" in value


def decode_b64(value: dict, where: str) -> bytes:
    data = value["b64"]
    if not isinstance(data, str):
        raise BadRequest(f"{where}: 'b64' must hold a base64 string, found {_kind(data)}")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(f"{where}: 'b64' holds invalid base64 data") from None


def to_tensor(value: Any, where: str) -> np.ndarray:
    """One JSON value (scalar or nested list) as a numpy array, checked for shape and type."""
    if type(value) in (int, float, bool):
        return np.asarray(value)
    if isinstance(value, list):
        try:
            arr = np.asarray(value)
        except (ValueError, OverflowError):
            arr = None  # ragged, or objects inside: the walk below says which
        if arr is not None and arr.dtype.kind in _NUMERIC_KINDS:
            if dtypes.holds_boolean(value, arr):
                raise BadRequest(f"{where}: a tensor mixes boolean and number values")
            return arr
    shape, leaves, kind = _walk(value, where)
    if kind == "number":
        try:
            return np.asarray(leaves).reshape(shape)
        except OverflowError:
            raise BadRequest(f"{where}: integer out of the 64-bit range") from None
    arr = np.empty(len(leaves), dtype=object)
    arr[:] = leaves
    return arr.reshape(shape)


def _walk(value: Any, where: str) -> tuple[tuple[int, ...], list[Any], str]:
    """Flatten a nested list, checking it is rectangular and holds one kind of value."""
    leaves: list[Any] = []
    kinds: set[str] = set()

    def shape_of(node: Any, depth: int) -> tuple[int, ...]:
        if depth > 64:
            raise BadRequest(f"{where}: nesting too deep")
        if isinstance(node, list):
            if not node:
                return (0,)
            first = shape_of(node[0], depth + 1)
            for child in node[1:]:
                if shape_of(child, depth + 1) != first:
                    raise BadRequest(f"{where}: ragged nested list; every row must have the same shape")
            return (len(node), *first)
        if is_b64(node):
            leaves.append(decode_b64(node, where))
            kinds.add("string")
        elif isinstance(node, str):
            leaves.append(node)
            kinds.add("string")
        elif isinstance(node, bool):
            leaves.append(node)
            kinds.add("boolean")
        elif isinstance(node, (int, float)):
            leaves.append(node)
            kinds.add("number")
        else:
            raise BadRequest(f'{where}: expected numbers, booleans, strings or {{"b64": ...}}, found {_kind(node)}')
        if len(kinds) > 1:
            raise BadRequest(f"{where}: a tensor mixes {' and '.join(sorted(kinds))} values")
        return ()

    shape = shape_of(value, 0)
    kind = kinds.pop() if kinds else "number"
    return shape, leaves, "string" if kind == "string" else "number"


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    names: dict[type, str] = {dict: "an object", list: "a list", str: "a string"}
    return names.get(type(value), type(value).__name__)


# ---------------------------------------------------------------------------
# Requests
# ---------------------------------------------------------------------------


def decode_predict_request(body: Any) -> tuple[Any, bool]:
    """The inputs of a ``:predict`` body, and whether it used the row format.

    :returns: ``(tensors, row_format)``; tensors is a ``dict`` of named arrays or one array.
    """
    if not isinstance(body, dict):
        raise BadRequest(f"request body must be a JSON object, found {_kind(body)}")
    has_rows, has_cols = "instances" in body, "inputs" in body
    if has_rows and has_cols:
        raise BadRequest("request has both 'instances' and 'inputs'; send exactly one of them")
    if not (has_rows or has_cols):
        raise BadRequest("request has neither 'instances' nor 'inputs'")
    if has_rows:
        return decode_instances(body["instances"]), True
    return decode_columns(body["inputs"]), False


def decode_instances(instances: Any) -> Any:
    if not isinstance(instances, list):
        raise BadRequest(f"'instances' must be a list, found {_kind(instances)}")
    if not instances:  # TF Serving's words; a batch of nothing has no shape to infer
        raise BadRequest("No values in 'instances' array; expected at least one instance")
    if not isinstance(instances[0], dict) or is_b64(instances[0]):
        return to_tensor(instances, "instances")
    names = list(instances[0])
    bounds.check_input_count(len(names))
    if not names:
        raise BadRequest("'instances' holds an empty object; expected named input values")
    keys = set(names)
    for i, row in enumerate(instances):
        if not isinstance(row, dict) or is_b64(row):
            raise BadRequest(
                f"instances[{i}]: expected an object of named inputs like instances[0], found {_kind(row)}"
            )
        if row.keys() != keys:
            raise BadRequest(
                f"instances[{i}]: has inputs {sorted(row)}, but instances[0] has {sorted(keys)}; "
                "every instance must name the same inputs"
            )
    return {name: to_tensor([row[name] for row in instances], f"instances[*].{name}") for name in names}


def decode_columns(inputs: Any) -> Any:
    if isinstance(inputs, dict) and not is_b64(inputs):
        if not inputs:
            raise BadRequest("'inputs' is an empty object; expected named input tensors")
        bounds.check_input_count(len(inputs))
        return {name: to_tensor(value, f"inputs.{name}") for name, value in inputs.items()}
    if is_b64(inputs):
        return to_tensor([inputs], "inputs").reshape(())
    return to_tensor(inputs, "inputs")


def decode_examples(body: Any) -> list[dict[str, list[Any]]]:
    """``examples`` plus ``context`` of a ``:classify``/``:regress`` body as feature dicts."""
    if not isinstance(body, dict):
        raise BadRequest(f"request body must be a JSON object, found {_kind(body)}")
    examples = body.get("examples")
    if not isinstance(examples, list) or not examples:
        raise BadRequest("'examples' must be a non-empty list of objects")
    context = body.get("context", {})
    if not isinstance(context, dict):
        raise BadRequest(f"'context' must be an object, found {_kind(context)}")
    shared = {name: _feature(value, f"context.{name}") for name, value in context.items()}
    decoded = []
    for i, example in enumerate(examples):
        if not isinstance(example, dict):
            raise BadRequest(f"examples[{i}] must be an object, found {_kind(example)}")
        features = dict(shared)
        for name, value in example.items():
            if name in shared:
                raise BadRequest(f"examples[{i}].{name}: feature also appears in 'context'")
            features[name] = _feature(value, f"examples[{i}].{name}")
        decoded.append(features)
    return decoded


def _feature(value: Any, where: str) -> list[Any]:
    values = value if isinstance(value, list) else [value]
    out: list[Any] = []
    kinds = set()
    for item in values:
        if is_b64(item):
            out.append(decode_b64(item, where))
            kinds.add("bytes")
        elif isinstance(item, str):
            out.append(item.encode())
            kinds.add("bytes")
        elif isinstance(item, bool):  # TF Serving stores booleans as int64 0/1
            out.append(int(item))
            kinds.add("int")
        elif isinstance(item, int):
            out.append(item)
            kinds.add("int")
        elif isinstance(item, float):
            out.append(item)
            kinds.add("float")
        else:
            raise BadRequest(f'{where}: expected numbers, strings or {{"b64": ...}}, found {_kind(item)}')
    if "bytes" in kinds and len(kinds) > 1:
        raise BadRequest(f"{where}: a feature mixes strings and numbers")
    if kinds == {"int", "float"}:
        out = [float(v) for v in out]
    return out


# ---------------------------------------------------------------------------
# Responses
# ---------------------------------------------------------------------------


def encode_tensor(value: Any, name: str = "") -> Any:
    """A JSON-ready value for one output; binary values become ``{"b64": ...}``."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "OSU":
            return _encode_objects(value.tolist(), name.endswith("_bytes"))
        if value.dtype.kind == "V" or value.dtype.byteorder == ">":
            return value.tolist()
        return value if value.flags.c_contiguous else np.ascontiguousarray(value)
    if isinstance(value, (bytes, list)):
        return _encode_objects(value, name.endswith("_bytes"))
    return value


def _encode_objects(value: Any, binary: bool) -> Any:
    if isinstance(value, list):
        return [_encode_objects(v, binary) for v in value]
    if isinstance(value, bytes):
        if not binary:
            try:
                return value.decode("utf-8")
            except UnicodeDecodeError:
                pass
        return {"b64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, np.generic):
        return value.item()
    return value


def encode_predict_response(outputs: Any, row_format: bool) -> dict[str, Any]:
    """``{"predictions": ...}`` (row) or ``{"outputs": ...}`` (columnar), as TF Serving writes them."""
    key = "predictions" if row_format else "outputs"
    if isinstance(outputs, dict):
        if len(outputs) == 1:
            ((name, value),) = outputs.items()
            return {key: encode_tensor(value, name)}
        if not row_format:
            return {key: {name: encode_tensor(v, name) for name, v in outputs.items()}}
        return {key: _rows(outputs)}
    return {key: encode_tensor(outputs)}


def _rows(outputs: dict[str, Any]) -> list[dict[str, Any]]:
    arrays = {name: v if isinstance(v, (np.ndarray, list)) else np.asarray(v) for name, v in outputs.items()}
    sizes = {name: len(v) if np.ndim(v) else None for name, v in arrays.items()}
    distinct = set(sizes.values())
    if len(distinct) != 1 or None in distinct:
        raise BadRequest(
            "outputs have different 0-th dimensions "
            f"({', '.join(f'{n}: {s}' for n, s in sizes.items())}); use the columnar 'inputs' format"
        )
    encoded = {name: encode_tensor(v, name) for name, v in arrays.items()}
    (size,) = distinct
    return [{name: v[i] for name, v in encoded.items()} for i in range(size or 0)]  # None was refused above


def encode_explain_response(explanations: Any, row_format: bool) -> dict[str, Any]:
    """``{"explanations": ...}``: per instance for row requests, like predictions."""
    if isinstance(explanations, (dict, np.ndarray)):
        try:
            (value,) = encode_predict_response(explanations, row_format).values()
        except BadRequest:  # tensors without a shared batch dimension: keep them columnar
            (value,) = encode_predict_response(explanations, False).values()
        return {"explanations": value}
    return {"explanations": encode_tensor(explanations)}
