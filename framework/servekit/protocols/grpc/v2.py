"""The V2 / Open Inference Protocol over gRPC: ``inference.GRPCInferenceService``.

Wire-compatible with ``tritonclient.grpc`` (and KServe's V2 gRPC clients).
A ``ModelInferRequest`` decodes (:mod:`servekit.codecs.v2_grpc`) into the same
:class:`~servekit.codecs.infer_request.InferRequest` as an HTTP body, and
:meth:`DataPlane.infer` checks and runs it as it does for HTTP.  Outputs always
go back as ``raw_output_contents``, as Triton answers (tritonclient and MLServer's
client read them), and a request that sent typed ``contents`` gets typed contents
too (KServe's client reads only those).  A version
string that is not a number is ``INVALID_ARGUMENT``.  ``ModelStreamInfer`` answers each request in
order; an error becomes that request's ``error_message`` and the stream goes on,
and a streaming model answers with one response per item it yields.  Generate
requests (:mod:`.generate_stream`) run at once, as a decoupled Triton model's do.

Every document answers as over HTTP, built by the same code (:mod:`..v2_documents`):
server and model metadata, ``ModelConfig`` and ``ModelStatistics``, and the repository RPCs
(``RepositoryIndex``, ``RepositoryModelLoad``, ``RepositoryModelUnload``), whose
load and unload need ``--model-control-mode explicit`` (:mod:`servekit.protocols.model_control`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
from google.protobuf import json_format

from servekit.codecs import v2_grpc as codec
from servekit.codecs.infer_request import InferRequest
from servekit.dataplane import traffic
from servekit.dataplane.data_plane import DataPlane
from servekit.dataplane.repository import ModelVersion
from servekit.errors import BadRequest, ModelFailure, NotFound, NotImplementedByModel, NotReady, ServekitError
from servekit.observability import tracing
from servekit.protocols import v2_documents as documents
from servekit.protocols.generate_requests import NotGenerative
from servekit.protocols.grpc import generate_stream
from servekit.protocols.grpc.common import control_of, rpc, streaming_rpc
from servekit.protocols.grpc.protos.inference import grpc_service_pb2 as pb
from servekit.protocols.grpc.protos.inference import grpc_service_pb2_grpc as pb_grpc
from servekit.protocols.grpc.protos.inference import model_config_pb2
from servekit.protocols.model_control import require_model_control

#: Extensions this service implements: those of HTTP but the binary one (gRPC is binary
#: anyway); the shared-memory RPCs are in :mod:`.shared_memory`.
EXTENSIONS = [e for e in documents.EXTENSIONS if e != "binary_tensor_data"]

#: Triton's decoupled-model parameters for ModelStreamInfer.
_EMPTY_FINAL = "triton_enable_empty_final_response"
_FINAL = "triton_final_response"


def version_of(version: str) -> int | None:
    """A request's ``model_version``: empty for the latest, else a number (INVALID_ARGUMENT)."""
    return documents.version_number(version)


# -- the service ----------------------------------------------------------------------------


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, dataplane: DataPlane, *, model_control_mode: str | None = None, control: Any = None):
        self.dp = dataplane
        self.model_control_mode = model_control_mode
        self.control = control

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
            self.dp.resolve_now(request.name, version_of(request.version))
        except NotReady:
            return pb.ModelReadyResponse(ready=False)
        except NotFound:
            # a served model with no such (or, unloaded, no) version is not ready; an unknown one is NOT_FOUND
            self.dp.model(request.name)
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=True)

    @rpc
    def ServerMetadata(self, request, context):
        return pb.ServerMetadataResponse(**documents.server_metadata(EXTENSIONS))

    @rpc
    def ModelMetadata(self, request, context):
        document = documents.model_metadata(self.dp, request.name, version_of(request.version))
        return json_format.ParseDict(document, pb.ModelMetadataResponse())

    @rpc
    def ModelInfer(self, request: pb.ModelInferRequest, context):
        with traffic.serving(_ticket(context)):
            decoded, generation = self._generation(request)
            if isinstance(generation, generate_stream.Generation):
                try:
                    return generation.whole()
                except NotGenerative:
                    pass  # a model without ``complete`` takes ``text_input`` as an ordinary input
            return next(self._ordinary(request, decoded, generation, stream=False))

    @streaming_rpc
    def ModelStreamInfer(self, request_iterator, context) -> Iterator[pb.ModelStreamInferResponse]:
        """Ordinary requests answer in order; generate requests run at once, their responses interleaved."""
        interleave = generate_stream.Interleave(context)
        yield from interleave.run(request_iterator, lambda r: self._answer(r, context), self._concurrent)

    def _answer(self, request: pb.ModelInferRequest, context: Any) -> Iterator[pb.ModelStreamInferResponse]:
        """Every response to one request of a stream: an error as its ``error_message``, the final one when asked."""
        empty_final = codec.parameters_of(request.parameters).get(_EMPTY_FINAL) is True
        try:
            for response in self._stream(request, context):
                if empty_final:
                    codec.set_parameter(response.parameters, _FINAL, False)
                yield pb.ModelStreamInferResponse(infer_response=response)
        except ServekitError as exc:
            failed = pb.ModelInferResponse(model_name=request.model_name, id=request.id)
            yield pb.ModelStreamInferResponse(error_message=exc.message, infer_response=failed)
            return
        if empty_final and context.is_active():
            final = pb.ModelInferResponse(model_name=request.model_name, id=request.id)
            codec.set_parameter(final.parameters, _FINAL, True)
            yield pb.ModelStreamInferResponse(infer_response=final)

    def _concurrent(self, request: pb.ModelInferRequest) -> bool:
        """Whether the request is a generate request, which need not wait for those before it."""
        if not generate_stream.is_generate(request):
            return False
        try:
            mv = self.dp.resolve(request.model_name, version_of(request.model_version))
        except ServekitError:
            return False  # answered in order, with its error
        return generate_stream.may_generate(mv)

    def _stream(self, request: pb.ModelInferRequest, context: Any) -> Iterator[pb.ModelInferResponse]:
        """A generate request's pieces (:mod:`.generate_stream`), else the ordinary streamed inference."""
        decoded, generation = self._generation(request)
        if isinstance(generation, generate_stream.Generation):
            try:
                if generation.spec.stream is False:  # vLLM's ``stream`` input: one whole response
                    yield generation.whole()
                    return
                pieces = generation.pieces()
            except NotGenerative:
                pass
            else:
                yield from generation.stream(pieces, context)
                return
        yield from self._ordinary(request, decoded, generation, stream=True)

    def _generation(
        self, request: pb.ModelInferRequest
    ) -> tuple[InferRequest | None, generate_stream.Generation | BadRequest | None]:
        """The request as decoded (``None`` if it was not), and the generate request it makes
        to a model that may generate (``None`` for an ordinary inference).

        A model in a model host may or may not generate (its hooks run there): a request
        it cannot take as a generate request is tried as an ordinary one, and the
        generate error (returned here) is the answer if that fails for want of a hook.
        The ordinary inference then runs the request decoded here: it is decoded once.
        """
        if not generate_stream.is_generate(request):
            return None, None
        mv = self.dp.resolve(request.model_name, version_of(request.model_version))
        if not generate_stream.may_generate(mv):
            return None, None
        decoded = self._decode(request)
        try:
            return decoded, generate_stream.Generation(self.dp, mv, request, decoded)
        except BadRequest as exc:
            if generate_stream.surely_generates(mv):
                raise
            return decoded, exc

    def _ordinary(
        self, request: pb.ModelInferRequest, decoded: InferRequest | None, refused: Any, *, stream: bool
    ) -> Iterator[pb.ModelInferResponse]:
        try:
            yield from self._infer(request, decoded, stream=stream)
        except NotImplementedByModel:
            if isinstance(refused, BadRequest):
                raise refused from None
            raise

    def _decode(self, request: pb.ModelInferRequest) -> InferRequest:
        """The request's one decode: everything the answer needs is read from the message here."""
        with tracing.span("servekit.decode"):
            return codec.decode_infer_request(request, self.dp.shared_memory)

    def _infer(
        self, request: pb.ModelInferRequest, decoded: InferRequest | None, *, stream: bool
    ) -> Iterator[pb.ModelInferResponse]:
        """Run one request; a streaming model gives one response per item when ``stream``."""
        mv = self.dp.resolve(request.model_name, version_of(request.model_version))
        req = decoded if decoded is not None else self._decode(request)
        req.parameters.pop(_EMPTY_FINAL, None)
        if not stream:
            yield self._response(request, req, mv, self.dp.infer(mv, req))
            return
        for outputs in self.dp.infer_stream(mv, req):
            yield self._response(request, req, mv, outputs)

    def _response(
        self, request: Any, req: InferRequest, mv: ModelVersion, outputs: dict[str, Any]
    ) -> pb.ModelInferResponse:
        with tracing.span("servekit.encode"):
            response = pb.ModelInferResponse(
                model_name=request.model_name, model_version=str(mv.version), id=request.id
            )
            codec.encode_outputs(
                response, outputs, typed=req.typed_contents, regions=self.dp.shared_memory, placements=req.placements
            )
        return response

    # -- Triton's extensions --------------------------------------------------------------

    @rpc
    def ModelConfig(self, request: pb.ModelConfigRequest, context):
        document = documents.model_configuration(self.dp, request.name, request.version)
        try:
            config = json_format.ParseDict(document, model_config_pb2.ModelConfig())
        except json_format.ParseError as exc:  # a config.pbtxt field of the wrong kind
            raise ModelFailure(f"the configuration of {request.name!r} is not a Triton ModelConfig: {exc}") from None
        return pb.ModelConfigResponse(config=config)

    @rpc
    def ModelStatistics(self, request: pb.ModelStatisticsRequest, context):
        stats = documents.model_statistics(self.dp, request.name or None, request.version or None)
        return json_format.ParseDict({"model_stats": stats}, pb.ModelStatisticsResponse())

    @rpc
    def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context):
        _one_repository(request.repository_name)
        response = pb.RepositoryIndexResponse()
        for entry in documents.repository_index(self.dp, request.ready):
            response.models.add(
                name=entry["name"], version=entry.get("version", ""), state=entry["state"], reason=entry["reason"] or ""
            )
        return response

    @rpc
    def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest, context):
        require_model_control(self.model_control_mode)
        _one_repository(request.repository_name)
        parameters = {key: _parameter_value(value) for key, value in request.parameters.items()}
        config, files = documents.load_arguments(request.model_name, parameters)
        try:
            control_of(self).load(request.model_name, config, files)
        except NotFound as exc:  # Triton's gRPC wording: every failed load starts "failed to load"
            message = exc.message if "failed to load" in exc.message else f"failed to load: {exc.message}"
            raise BadRequest(message) from None
        return pb.RepositoryModelLoadResponse()

    @rpc
    def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest, context):
        require_model_control(self.model_control_mode)
        _one_repository(request.repository_name)
        parameters = {key: _parameter_value(value) for key, value in request.parameters.items()}
        control_of(self).unload(request.model_name, documents.unload_dependents(parameters))
        return pb.RepositoryModelUnloadResponse()


def _parameter_value(parameter: Any) -> Any:
    """A ``ModelRepositoryParameter``'s value: bool, int, string or bytes."""
    choice = parameter.WhichOneof("parameter_choice")
    return getattr(parameter, choice) if choice else None


def _one_repository(name: str) -> None:
    if name:
        raise BadRequest(f"repository_name {name!r}: servekit serves one model repository; leave it empty")


def add_to_server(
    server: grpc.Server, dataplane: DataPlane, *, model_control_mode: str | None = None, control: Any = None
) -> None:
    """Add the service; ``model_control_mode`` is ``--model-control-mode`` (load/unload), which
    ``control`` (the app's :class:`servekit.control.ControlPlane`) carries out."""
    servicer = InferenceServicer(dataplane, model_control_mode=model_control_mode, control=control)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)


def _ticket(context: Any) -> traffic.Ticket:
    """A call's place in its model's queue: cancelled (or past its deadline) while queued, it is never
    computed; a split sticks by its metadata (``authorization``: ``api_key``)."""

    def lookup(name: str) -> str | None:
        metadata = dict(context.invocation_metadata() or ())
        if name == "api_key":
            value = str(metadata.get("authorization") or "")
            return value.split(" ", 1)[-1] or None
        found = metadata.get(name.lower())
        return None if found is None else str(found)

    return traffic.Ticket(cancelled=lambda: not context.is_active(), lookup=lookup, source="request parameter")
