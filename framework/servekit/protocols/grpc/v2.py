"""The V2 / Open Inference Protocol over gRPC: ``inference.GRPCInferenceService``.

Wire-compatible with ``tritonclient.grpc`` (and KServe's V2 gRPC clients).
Tensors arrive as typed ``contents`` or as ``raw_input_contents`` (the binary
layout of :mod:`servekit.codecs.v2`, which this module reuses); outputs always
go back as ``raw_output_contents``, as Triton answers whatever the request used:
tritonclient, KServe's and MLServer's clients read the raw form.  A version
string that is not a number is ``INVALID_ARGUMENT``.  ``ModelStreamInfer`` answers each request in
order; an error becomes that request's ``error_message`` and the stream goes on,
and a streaming model answers with one response per item it yields.

Triton's extensions answer as over HTTP, from the same code: ``ModelConfig``
and ``ModelStatistics`` (:mod:`..v2_extensions`), and the repository RPCs
(``RepositoryIndex``, ``RepositoryModelLoad``, ``RepositoryModelUnload``), whose
load and unload need ``--model-control-mode explicit`` (:mod:`servekit.model_control`).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
from google.protobuf import json_format

from ... import __version__
from ...codecs import v2 as codec
from ...dataplane import DataPlane, filter_outputs, join_stream, named_outputs
from ...errors import BadRequest, NotFound, NotReady, ServekitError
from ...model_control import require_model_control
from ...repository import ModelVersion
from .. import v2 as http_v2
from .. import v2_extensions
from .common import rpc, streaming_rpc
from .protos.inference import grpc_service_pb2 as pb
from .protos.inference import grpc_service_pb2_grpc as pb_grpc
from .protos.inference import model_config_pb2

#: Extensions this service implements (the shared-memory RPCs are not offered).
EXTENSIONS = ["parameters", "model_repository", *v2_extensions.EXTENSIONS]

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

#: Tensor parameters of Triton extensions servekit does not implement.
_REFUSED_PARAMETERS = (
    "shared_memory_region",
    "shared_memory_byte_size",
    "shared_memory_offset",
    "classification",
)

#: Triton's decoupled-model parameters for ModelStreamInfer.
_EMPTY_FINAL = "triton_enable_empty_final_response"
_FINAL = "triton_final_response"


# -- parameters ---------------------------------------------------------------------------


def parameters_of(params: Any) -> dict[str, Any]:
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


def _refuse_unsupported(params: dict[str, Any], where: str) -> None:
    for key in _REFUSED_PARAMETERS:
        if params.get(key) not in (None, False, 0, ""):
            raise BadRequest(
                f"{where}: parameter {key!r} needs a Triton extension servekit does not implement"
            )


# -- tensors --------------------------------------------------------------------------------


def decode_inputs(request: pb.ModelInferRequest) -> dict[str, np.ndarray]:
    if not request.inputs:
        raise BadRequest("ModelInferRequest has no inputs")
    raw = request.raw_input_contents
    for tensor in request.inputs if raw else ():
        if tensor.HasField("contents"):
            raise BadRequest(
                f"contents field must not be specified when using raw_input_contents for "
                f"{tensor.name!r} for model {request.model_name!r}"
            )
    if raw and len(raw) != len(request.inputs):
        raise BadRequest(
            f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs; "
            "send one per input, or typed contents for all"
        )
    inputs: dict[str, np.ndarray] = {}
    for i, tensor in enumerate(request.inputs):
        where = f"input {tensor.name!r}"
        if not tensor.name:
            raise BadRequest(f"input {i} has no name")
        if tensor.name in inputs:
            raise BadRequest(f"{where} is given twice")
        _refuse_unsupported(parameters_of(tensor.parameters), where)
        codec.check_datatype(tensor.datatype, where)
        shape = [int(d) for d in tensor.shape]
        if any(d < 0 for d in shape):
            raise BadRequest(f"{where}: shape {shape} has a negative dimension")
        if raw:
            try:
                inputs[tensor.name] = codec.tensor_from_bytes(tensor.datatype, shape, raw[i])
            except BadRequest as exc:
                raise BadRequest(f"{where}: {exc.message}") from None
        else:
            inputs[tensor.name] = typed_to_numpy(tensor, shape, where)
    return inputs


def typed_to_numpy(tensor: Any, shape: list[int], where: str) -> np.ndarray:
    datatype = tensor.datatype
    field = CONTENTS_FIELD.get(datatype)
    if field is None:
        raise BadRequest(
            f"{where}: {datatype} has no typed contents field; send it in raw_input_contents"
        )
    values = getattr(tensor.contents, field)
    count = math.prod(shape)
    if len(values) != count:
        raise BadRequest(
            f"{where}: {field} holds {len(values)} values; shape {shape} needs {count}"
        )
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


def encode_outputs(response: pb.ModelInferResponse, outputs: dict[str, np.ndarray]) -> None:
    """Every output in ``raw_output_contents``, one entry per output, in order (as Triton)."""
    for name, value in outputs.items():
        arr = codec.as_v2_array(value, name)
        response.outputs.add(name=name, datatype=codec.datatype_of(arr), shape=list(arr.shape))
        response.raw_output_contents.append(codec.tensor_to_bytes(arr))


def version_of(version: str) -> str | None:
    """A request's ``model_version``: empty for the latest, else a number (INVALID_ARGUMENT)."""
    if not version:
        return None
    if not version.isdigit() or int(version) < 1:
        raise BadRequest(
            f"invalid model version {version!r}: expected a positive integer, or none for the latest"
        )
    return version


def signature_name(parameters: dict[str, Any]) -> str | None:
    """The ``signature_name`` parameter, as over HTTP: a signature other than the default."""
    name = parameters.get("signature_name")
    if name is not None and not isinstance(name, str):
        raise BadRequest(f"parameter 'signature_name' must be a string, found {name!r}")
    return name or None


# -- the service ----------------------------------------------------------------------------


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, dataplane: DataPlane, *, model_control_mode: str | None = None):
        self.dp = dataplane
        self.model_control_mode = model_control_mode

    @rpc
    def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=self.dp.live)

    @rpc
    def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=self.dp.ready)

    @rpc
    def ModelReady(self, request, context):
        try:
            # the repository, not the data plane: a probe must not wait for a load to finish
            self.dp.repository.resolve(request.name, version_of(request.version))
        except NotReady:
            return pb.ModelReadyResponse(ready=False)
        except NotFound:
            # a served model with no such (or, unloaded, no) version is not ready; an unknown one is NOT_FOUND
            self.dp.repository.get_model(request.name)
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=True)

    @rpc
    def ServerMetadata(self, request, context):
        return pb.ServerMetadataResponse(
            name="servekit", version=__version__, extensions=EXTENSIONS
        )

    @rpc
    def ModelMetadata(self, request, context):
        mv = self.dp.resolve(request.name, version_of(request.version))
        meta = self.dp.metadata(mv)
        signature = meta.signature()
        response = pb.ModelMetadataResponse(
            name=request.name,
            versions=[
                str(v.version) for v in self.dp.repository.get_model(request.name).available()
            ],
            platform=meta.platform,
        )
        for spec in signature.inputs if signature else []:
            response.inputs.add(name=spec.name, datatype=spec.datatype, shape=_shape(spec.shape))
        for spec in signature.outputs if signature else []:
            response.outputs.add(name=spec.name, datatype=spec.datatype, shape=_shape(spec.shape))
        return response

    @rpc
    def ModelInfer(self, request: pb.ModelInferRequest, context):
        return next(self._infer(request, stream=False))

    @streaming_rpc
    def ModelStreamInfer(self, request_iterator, context) -> Iterator[pb.ModelStreamInferResponse]:
        for request in request_iterator:
            empty_final = parameters_of(request.parameters).get(_EMPTY_FINAL) is True
            try:
                for response in self._infer(request, stream=True):
                    if empty_final:
                        set_parameter(response.parameters, _FINAL, False)
                    yield pb.ModelStreamInferResponse(infer_response=response)
            except ServekitError as exc:
                failed = pb.ModelInferResponse(model_name=request.model_name, id=request.id)
                yield pb.ModelStreamInferResponse(error_message=exc.message, infer_response=failed)
                continue
            if empty_final:
                final = pb.ModelInferResponse(model_name=request.model_name, id=request.id)
                set_parameter(final.parameters, _FINAL, True)
                yield pb.ModelStreamInferResponse(infer_response=final)

    def _infer(
        self, request: pb.ModelInferRequest, *, stream: bool
    ) -> Iterator[pb.ModelInferResponse]:
        """Run one request; a streaming model gives one response per item when ``stream``."""
        mv = self.dp.resolve(request.model_name, version_of(request.model_version))
        parameters = parameters_of(request.parameters)
        parameters.pop(_EMPTY_FINAL, None)
        signature = signature_name(parameters)
        inputs = decode_inputs(request)
        http_v2.check_inputs(mv, inputs, signature)
        wanted = []
        for output in request.outputs:
            _refuse_unsupported(parameters_of(output.parameters), f"output {output.name!r}")
            wanted.append(output.name)
        result = self.dp.predict(
            mv, inputs, parameters=parameters, signature_name=signature, output_names=wanted or None
        )
        if not inspect.isgenerator(result):
            yield self._response(request, mv, named_outputs(mv, result, signature), wanted)
            return
        items = (named_outputs(mv, item, signature) for item in result)
        if not stream:
            yield self._response(request, mv, join_stream(items), wanted)
            return
        for item in items:
            yield self._response(request, mv, item, wanted)

    @staticmethod
    def _response(request: Any, mv: ModelVersion, outputs: dict[str, Any], wanted: list[str]):
        response = pb.ModelInferResponse(
            model_name=request.model_name, model_version=str(mv.version), id=request.id
        )
        encode_outputs(response, filter_outputs(outputs, wanted or None))
        return response


    # -- Triton's extensions --------------------------------------------------------------

    @rpc
    def ModelConfig(self, request: pb.ModelConfigRequest, context):
        document = v2_extensions.model_configuration(
            self.dp, request.name, version_of(request.version)
        )
        return pb.ModelConfigResponse(config=json_format.ParseDict(document, model_config_pb2.ModelConfig()))

    @rpc
    def ModelStatistics(self, request: pb.ModelStatisticsRequest, context):
        stats = v2_extensions.model_statistics(
            self.dp, request.name or None, version_of(request.version)
        )
        return json_format.ParseDict({"model_stats": stats}, pb.ModelStatisticsResponse())

    @rpc
    def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context):
        _one_repository(request.repository_name)
        repository = self.dp.repository
        response = pb.RepositoryIndexResponse()
        for name in sorted(repository.models):
            for entry in http_v2._index_entries(repository.models[name]):
                if request.ready and entry["state"] != "READY":
                    continue
                response.models.add(
                    name=entry["name"],
                    version=entry.get("version", ""),
                    state=entry["state"],
                    reason=entry["reason"] or "",
                )
        return response

    @rpc
    def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest, context):
        require_model_control(self.model_control_mode)
        _one_repository(request.repository_name)
        overrides = sorted(
            k for k in request.parameters if k == "config" or k.startswith("file:")
        )
        if overrides:
            raise BadRequest(
                f"failed to load {request.model_name!r}: load parameters {', '.join(overrides)} "
                "are not supported; servekit loads a model from its folder (edit servekit.yaml)"
            )
        try:
            model = self.dp.repository.load_model(request.model_name)
        except NotFound as exc:  # Triton's wording: every failed load starts "failed to load"
            raise BadRequest(f"failed to load {request.model_name!r}: {exc.message}") from None
        if not model.available():
            errors = [f"version {mv.version}: {mv.error}" for mv in model.versions.values() if mv.error]
            detail = "; ".join(errors) or model.config_error or "no version folder found"
            raise BadRequest(f"failed to load model {request.model_name!r}: {detail}")
        return pb.RepositoryModelLoadResponse()

    @rpc
    def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest, context):
        require_model_control(self.model_control_mode)
        _one_repository(request.repository_name)
        self.dp.repository.unload_model(request.model_name)
        return pb.RepositoryModelUnloadResponse()


def _one_repository(name: str) -> None:
    if name:
        raise BadRequest(
            f"repository_name {name!r}: servekit serves one model repository; leave it empty"
        )


def _shape(shape: list[int] | None) -> list[int]:
    # V2 has no "unknown rank"; a single -1 is the closest it can say (as over HTTP)
    return list(shape) if shape is not None else [-1]


def add_to_server(
    server: grpc.Server, dataplane: DataPlane, *, model_control_mode: str | None = None
) -> None:
    """Add the service; ``model_control_mode`` is ``--model-control-mode`` (load/unload)."""
    servicer = InferenceServicer(dataplane, model_control_mode=model_control_mode)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
