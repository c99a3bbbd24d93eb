"""The V2 protocol's gRPC messages (``ModelInferRequest`` / ``ModelInferResponse``) and numpy.

A ``ModelInferRequest`` decodes into the same :class:`~servekit.codecs.infer_request.InferRequest`
as an HTTP body (:func:`servekit.codecs.v2.decode_infer_request`), through the
same checks: tensors arrive as typed ``contents`` or as ``raw_input_contents``
(the binary layout of :mod:`.v2`); outputs go back as ``raw_output_contents``,
as Triton answers, and also as typed ``contents`` when the request used those
(:func:`encode_outputs`).  :func:`decode_infer_request` reads everything the
protocol needs from the message in one call, so the protocol never goes back to
the message between decoding and answering.  Like :mod:`.tensor_proto`, this
module reads the messages by their field names and imports no generated code.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from servekit.codecs import bounds
from servekit.codecs import v2 as codec
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
from servekit.codecs.shared_memory import Regions, SharedTensor, placement_of, write_outputs
from servekit.errors import BadRequest

#: The typed ``InferTensorContents`` field of each datatype; FP16 has none.
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


# -- parameters ---------------------------------------------------------------------------


def parameters_of(params: Any) -> dict[str, Any]:
    """A ``map<string, InferParameter>`` as plain values (``None`` where no choice is set)."""
    if not params:  # most maps are empty, and a protobuf map's items() is dear to start
        return {}
    out = {}
    for key, value in params.items():
        choice = value.WhichOneof("parameter_choice")
        out[key] = getattr(value, choice) if choice else None
    return out


def set_parameter(params: Any, key: str, value: Any) -> None:
    if isinstance(value, bool):
        params[key].bool_param = value
    elif isinstance(value, int):
        params[key].int64_param = value
    elif isinstance(value, float):
        params[key].double_param = value
    else:
        params[key].string_param = str(value)


# -- requests ------------------------------------------------------------------------------


def decode_infer_request(request: Any, regions: Regions | None = None) -> InferRequest:
    """A ``ModelInferRequest`` as the request every V2 wire decodes into (``regions``: the
    registered shared-memory regions inputs may name).

    Everything the protocol needs from the message is read here, once: the inputs, the
    requested outputs, the parameters, and whether the answer carries typed contents.
    """
    parameters = parameters_of(request.parameters)
    scheduling = check_request_parameters(parameters)
    outputs: list[RequestedOutput] = []
    for output in request.outputs:
        params = parameters_of(output.parameters)
        check_tensor_parameters(params, f"requested output {output.name!r}", OUTPUT_PARAMETERS)
        add_output(outputs, output.name, params=params)
    inputs, typed = _read_inputs(request, regions)
    return InferRequest(
        inputs,
        request.id or None,
        parameters,
        outputs or None,
        signature_of(parameters),
        typed_contents=typed,
        scheduling=scheduling,
    )


def decode_inputs(request: Any, regions: Regions | None = None) -> dict[str, np.ndarray]:
    """A ``ModelInferRequest``'s inputs by name, from raw or typed contents or shared memory."""
    return _read_inputs(request, regions)[0]


def _read_inputs(request: Any, regions: Regions | None) -> tuple[dict[str, np.ndarray], bool]:
    """The inputs, and whether they came as typed contents (as :func:`used_typed_contents` says)."""
    tensors = request.inputs
    bounds.check_input_count(len(tensors))
    if not tensors:
        raise BadRequest("ModelInferRequest has no inputs")
    raw = request.raw_input_contents
    # each input's parameters are read once, for its placement and its refusals alike
    params = [parameters_of(t.parameters) for t in tensors]
    for tensor, tensor_params in zip(tensors, params):
        check_tensor_parameters(tensor_params, f"input {tensor.name!r}", INPUT_PARAMETERS, tensor.datatype)
    placements = [placement_of(p, f"input {t.name!r}") for t, p in zip(tensors, params)]
    if raw:
        _check_raw_contents(request, [t for t, p in zip(tensors, placements) if p is None])
    inputs: dict[str, np.ndarray] = {}
    typed = False  # an input in shared memory carries no contents (refused below), so the carried ones tell
    carried_index = 0
    for i, (tensor, placement) in enumerate(zip(tensors, placements)):
        where = f"input {tensor.name!r}"
        if not tensor.name:
            raise BadRequest(f"input {i} has no name")
        if tensor.name in inputs:
            raise BadRequest(f"{where} is given twice")
        if placement is not None:
            if tensor.HasField("contents"):
                raise BadRequest(f"{where} names a shared memory region and carries contents too; send one")
            codec.check_datatype(tensor.datatype, where)
            shape = tuple(_shape_of(tensor, where))
            inputs[tensor.name] = codec.shared_input(regions, where, tensor.datatype, shape, placement)
            continue
        if raw:
            inputs[tensor.name] = _decode_input(tensor, raw[carried_index], where)
            carried_index += 1
        else:
            typed = typed or tensor.HasField("contents")
            inputs[tensor.name] = _decode_input(tensor, None, where)
    return inputs, typed


def _check_raw_contents(request: Any, carried: list[Any]) -> None:
    """``raw_input_contents``: one entry for each input not in shared memory, and no typed contents beside."""
    raw = request.raw_input_contents
    for tensor in carried:
        if tensor.HasField("contents"):
            raise BadRequest(
                f"contents field must not be specified when using raw_input_contents for "
                f"{tensor.name!r} for model {request.model_name!r}"
            )
    # tritonclient sends raw contents for the inputs not in shared memory only
    if len(raw) != len(carried):
        raise BadRequest(
            f"raw_input_contents has {len(raw)} entries for {len(carried)} inputs; "
            "send one per input, or typed contents for all"
        )


def _shape_of(tensor: Any, where: str) -> list[int]:
    shape = [int(d) for d in tensor.shape]
    if any(d < 0 for d in shape):
        raise BadRequest(f"{where}: shape {shape} has a negative dimension")
    return shape


def _decode_input(tensor: Any, raw: bytes | None, where: str) -> np.ndarray:
    codec.check_datatype(tensor.datatype, where)
    shape = _shape_of(tensor, where)
    if raw is None:
        return typed_to_numpy(tensor, shape, where)
    try:
        return codec.tensor_from_checked_bytes(tensor.datatype, tuple(shape), raw)
    except BadRequest as exc:
        raise BadRequest(f"{where}: {exc.message}") from None


def typed_to_numpy(tensor: Any, shape: list[int], where: str) -> np.ndarray:
    datatype = tensor.datatype
    field = CONTENTS_FIELD.get(datatype)
    if field is None:
        raise BadRequest(f"{where}: {datatype} has no typed contents field; send it in raw_input_contents")
    values = getattr(tensor.contents, field)
    count = codec.element_count(tuple(shape))
    if len(values) != count:
        raise BadRequest(f"{where}: {field} holds {len(values)} values; shape {shape} needs {count}")
    if datatype == "BYTES":
        arr = np.empty(count, dtype=object)
        arr[:] = list(values)
        return arr.reshape(shape)
    dtype = codec.v2_to_numpy(datatype)
    if dtype.kind in "iu" and dtype.itemsize < 4 and count:
        wide = np.asarray(values, dtype=np.int64)
        info = np.iinfo(dtype)
        if wide.min() < info.min or wide.max() > info.max:
            raise BadRequest(f"{where}: a value in {field} is out of range for {datatype}")
    return np.asarray(values, dtype=dtype).reshape(shape)


# -- responses -----------------------------------------------------------------------------


def encode_outputs(
    response: Any,
    outputs: dict[str, np.ndarray],
    *,
    typed: bool = False,
    regions: Regions | None = None,
    placements: dict[str, SharedTensor] | None = None,
) -> None:
    """The outputs in ``raw_output_contents`` (one entry per output, in order, as Triton answers
    and tritonclient reads), and with ``typed`` in typed ``contents`` as well.

    A request that sent typed ``contents`` gets both forms: KServe's client reads an
    answer's data from ``contents`` only, while Triton's own explicit-content examples,
    which send typed contents too, read ``raw_output_contents``; tritonclient prefers
    the raw form when both are there.  An output with no typed field (FP16, BF16)
    leaves every output raw only.  An output the request placed in shared memory
    (``placements``, in the ``regions`` registered) is written there and answered with
    where it went and an empty raw entry, which keeps the entries in step with the outputs.
    """
    arrays = {name: codec.as_v2_array(value, name) for name, value in outputs.items()}
    shared = write_outputs(regions, arrays, placements, codec.tensor_to_bytes) if regions and placements else None
    datatypes = {name: codec.datatype_of(arr) for name, arr in arrays.items()}
    typed = typed and all(d in CONTENTS_FIELD for d in datatypes.values())
    for name, arr in arrays.items():
        tensor = response.outputs.add(name=name, datatype=datatypes[name], shape=list(arr.shape))
        if shared and name in shared:
            for key, value in shared[name].items():
                set_parameter(tensor.parameters, key, value)
            response.raw_output_contents.append(b"")
            continue
        if typed:
            _fill_typed(tensor.contents, datatypes[name], arr)
        response.raw_output_contents.append(codec.tensor_to_bytes(arr))


def used_typed_contents(request: Any) -> bool:
    """Whether a ``ModelInferRequest`` sent its tensors as typed ``contents``
    (:func:`decode_infer_request` keeps it as :attr:`InferRequest.typed_contents`)."""
    return not request.raw_input_contents and any(t.HasField("contents") for t in request.inputs)


def _fill_typed(contents: Any, datatype: str, arr: np.ndarray) -> None:
    values = getattr(contents, CONTENTS_FIELD[datatype])
    flat = arr.reshape(-1)
    if datatype == "BYTES":
        values.extend(codec.tensor_to_bytes_items(flat))
    else:
        values.extend(flat.tolist())
