"""The one request type of the tensor protocols, and what every wire checks the same way.

V2 over HTTP (:func:`servekit.codecs.v2.decode_infer_request`) and over gRPC
(:func:`servekit.codecs.v2_grpc.decode_infer_request`) both decode into an
:class:`InferRequest`, which :meth:`servekit.dataplane.data_plane.DataPlane.infer` runs;
the wire only decides how tensors travel.  What a request may ask for is
decided here once: the ``signature_name`` parameter, the Triton parameters
servekit refuses (and what counts as leaving them unset), requested outputs
named twice.

This module imports nothing from servekit but the error tree and the
shared-memory parameters (:mod:`.shared_memory`), so codecs and the
data plane both build on it (KServe's ``InferRequest``, ``infer_type.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from servekit.codecs.shared_memory import PARAMETERS as SHARED_MEMORY_PARAMETERS
from servekit.codecs.shared_memory import SharedTensor, placement_of
from servekit.errors import BadRequest

#: The parameters an input tensor may carry (Triton's binary data and shared memory
#: extensions); any other is refused, naming it, instead of silently answered without it.
INPUT_PARAMETERS = ("binary_data_size", *SHARED_MEMORY_PARAMETERS)
#: The parameters a requested output may carry (binary data, classification, shared memory).
OUTPUT_PARAMETERS = ("binary_data", "classification", *SHARED_MEMORY_PARAMETERS)
#: The V2 scheduling parameters: Triton's ``priority`` and server-side queue ``timeout``
#: in microseconds (tritonclient's ``infer(priority=, timeout=)``).  An inference request
#: hands them to the model's queue (:attr:`InferRequest.scheduling`); a model without
#: one refuses them, and so does every endpoint that has no queue to honour them (Triton's
#: generate).  Every other request parameter reaches the model's hooks as ``parameters``.
UNHONOURED_REQUEST_PARAMETERS = ("priority", "timeout")
#: What leaves a parameter unset: JSON's null, false, 0 and "", and proto3's
#: defaults for every ``InferParameter`` choice (a gRPC map entry may hold one).
UNSET = (None, False, 0, "")


@dataclass
class RequestedOutput:
    name: str
    #: ``True``/``False`` from the output's ``binary_data`` parameter (HTTP), ``None`` if unset
    binary: bool | None = None
    #: Triton's ``classification`` parameter: answer the top N classes (0: the tensor itself)
    classification: int = 0
    #: where the answer goes instead of the response (the shared-memory extension)
    placement: SharedTensor | None = None


@dataclass
class InferRequest:
    """A decoded V2 inference request, whichever wire it came on."""

    inputs: dict[str, np.ndarray]
    id: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    outputs: list[RequestedOutput] | None = None
    #: the ``signature_name`` parameter: a signature other than the model's default
    signature_name: str | None = None
    #: hold inputs to the shapes the model declares (V2, as Triton does); TF Serving's
    #: Predict does not, and a model there may take what its signature does not say
    check_shapes: bool = True
    #: gRPC: the client sent typed ``contents``, so the answer carries them too (KServe's
    #: client reads only those); the decoder reads it from the message, the encoder obeys it
    typed_contents: bool = False
    #: the model name and version the body itself names, if any (KServe's client writes
    #: ``model_name``); the protocol holds them to the path's (:meth:`check_addressed`)
    addressed: tuple[str | None, str | None] = (None, None)
    #: the ``priority`` and ``timeout`` (microseconds) parameters, ``None`` where unset; the data
    #: plane hands them to the model's queue, or refuses them for a model without one
    scheduling: tuple[int | None, int | None] = (None, None)

    def check_addressed(self, name: str, version: str, *aliases: str) -> None:
        """Refuse a body that names another model or version than the one it was sent to."""
        model_name, model_version = self.addressed
        if model_name is not None and model_name not in (name, *aliases):
            raise BadRequest(f"the request's 'model_name' is {model_name!r}, but it was sent to model {name!r}")
        if model_version not in (None, "", version):
            raise BadRequest(f"the request's 'model_version' is {model_version!r}, but version {version} answers it")

    @property
    def output_names(self) -> list[str] | None:
        return [o.name for o in self.outputs] if self.outputs else None

    @property
    def placements(self) -> dict[str, SharedTensor]:
        """The outputs the client placed in shared memory, by name."""
        return {o.name: o.placement for o in self.outputs or () if o.placement is not None}

    @property
    def binary_output(self) -> bool:
        """The request-level ``binary_data_output`` parameter (HTTP's binary extension)."""
        return self.parameters.get("binary_data_output") is True


def signature_of(parameters: dict[str, Any]) -> str | None:
    """The ``signature_name`` parameter, checked: a string, or unset."""
    name = parameters.get("signature_name")
    if name is not None and not isinstance(name, str):
        raise BadRequest(f"parameter 'signature_name' must be a string, found {name!r}")
    return name or None


#: MLServer's content types that say what servekit does anyway, by the tensor's datatype
#: (its ``NumpyCodec`` marks each input ``"np"``): a numeric tensor reaches the model as a
#: numpy array.  Any other content type (``str``, ``base64``, ``datetime``, ``pd`` on an
#: input, ...) would ask for a decoding servekit does not do, so it is refused.
HONOURED_CONTENT_TYPES = {"np": lambda datatype: datatype != "BYTES"}


def check_tensor_parameters(
    params: dict[str, Any], where: str, known: tuple[str, ...], datatype: str | None = None
) -> None:
    """Refuse a tensor parameter servekit does not read: it would be answered as if not sent.

    An input's ``content_type`` (MLServer's codecs) passes where it names what servekit does
    for the input's ``datatype`` (:data:`HONOURED_CONTENT_TYPES`).
    """
    for key in params:
        if key == "content_type" and datatype is not None:
            value = params[key]
            fits = HONOURED_CONTENT_TYPES.get(value) if isinstance(value, str) else None
            if fits is None or not fits(datatype):
                raise BadRequest(
                    f"{where}: parameter 'content_type' {value!r} is not supported by this server for a {datatype} tensor; "
                    "it decodes numeric tensors as numpy arrays ('np')"
                )
        elif key not in known:
            raise BadRequest(f"{where}: parameter {key!r} is not supported by this server; it reads {', '.join(known)}")


def check_request_parameters(params: dict[str, Any]) -> tuple[int | None, int | None]:
    """Take the scheduling parameters (``priority``, ``timeout``) out of a request's parameters.

    Returns them checked (``None`` where unset); they are for the server's queue, not the model.
    """
    found: list[int | None] = []
    for key in UNHONOURED_REQUEST_PARAMETERS:
        value = params.pop(key, None)
        if value in UNSET:
            found.append(None)
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            what = "a priority level (1 first)" if key == "priority" else "microseconds"
            raise BadRequest(f"request parameter {key!r} must be {what}, a whole number from 0, found {value!r}")
        found.append(value)
    return found[0], found[1]


def add_output(
    outputs: list[RequestedOutput], name: str, binary: bool | None = None, params: dict[str, Any] | None = None
) -> RequestedOutput:
    """Add a requested output; the same name twice is a client error on every wire.

    ``params`` are the output's parameters: ``classification`` is read from them.
    """
    if any(o.name == name for o in outputs):
        raise BadRequest(f"output {name!r} is requested twice")
    where = f"requested output {name!r}"
    count = class_count((params or {}).get("classification"), where)
    placement = placement_of(params, where)
    if placement is not None and count:
        raise BadRequest(f"{where}: 'classification' cannot be answered into shared memory")
    outputs.append(RequestedOutput(name, binary, count, placement))
    return outputs[-1]


def class_count(value: Any, where: str) -> int:
    """The ``classification`` parameter: a positive integer (unset or 0: the tensor itself)."""
    if value in UNSET:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadRequest(f"{where}: 'classification' must be a positive integer, found {value!r}")
    return value
