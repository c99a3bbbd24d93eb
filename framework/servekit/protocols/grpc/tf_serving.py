"""TF Serving's gRPC API: ``PredictionService`` and ``ModelService``.

Wire-compatible with the ``tensorflow-serving-api`` client: the same service and
message names and field numbers (see ``protos/``).  Each RPC resolves its
``ModelSpec`` (name, version or version label, signature), calls the data plane,
and answers with the effective ``ModelSpec`` (the version that ran, and the
signature, ``serving_default`` when none was named), as ``tensorflow_model_server``
does.  ``PredictStreamed`` is in :mod:`.predict_stream`.

Output tensors carry their values in the dtype's typed field (``float_val``,
``int64_val``...), as ``tensorflow_model_server`` answers by default: clients
read ``result.outputs["y"].float_val``.  ``--grpc-tensor-content`` (TF Serving's
``--enable_serialization_as_tensor_content``) answers in ``tensor_content``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
from google.protobuf import json_format

from servekit.codecs import bounds, tensor_proto
from servekit.codecs.infer_request import InferRequest, RequestedOutput
from servekit.dataplane.data_plane import DataPlane
from servekit.dataplane.repository import ModelVersion
from servekit.errors import BadRequest
from servekit.folders.tf_serving_config import served_model
from servekit.protocols import tf_documents as documents
from servekit.protocols.grpc.common import control_of, rpc, streaming_rpc
from servekit.protocols.grpc.predict_stream import PredictStream, Turn
from servekit.protocols.grpc.protos.tensorflow.core.protobuf import meta_graph_pb2
from servekit.protocols.grpc.protos.tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    model_management_pb2,
    model_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
    status_pb2,
)
from servekit.protocols.model_control import require_model_control
from servekit.types import CLASSIFY_METHOD, REGRESS_METHOD, Signature

log = logging.getLogger("servekit.grpc")

SIGNATURE_DEF = "signature_def"


# -- model specs ----------------------------------------------------------------------


def resolve(dp: DataPlane, spec: model_pb2.ModelSpec) -> ModelVersion:
    """The version a ModelSpec addresses: a number, a label, or the latest."""
    if not spec.name:
        raise BadRequest("Missing ModelSpec: set model_spec.name")
    choice = spec.WhichOneof("version_choice")
    if choice == "version":
        return dp.resolve(spec.name, spec.version.value)
    if choice == "version_label":
        return dp.resolve(spec.name, None, spec.version_label)
    return dp.resolve(spec.name)


def effective_spec(out: model_pb2.ModelSpec, mv: ModelVersion, signature_name: str | None) -> None:
    """Fill a response's ModelSpec with what answered; ``signature_name=None`` leaves it empty."""
    out.name = mv.name
    out.version.value = mv.version
    if signature_name is not None:
        out.signature_name = signature_name or mv.metadata.default_signature


# -- tensors --------------------------------------------------------------------------


#: ``PredictRequest`` fields servekit does not honour (the LLM decoding options of
#: ``RequestOptions``): refused when set.  ``client_id`` only names the caller.
UNHONOURED_PREDICT_FIELDS = ("request_options",)


def decode_inputs(request: predict_pb2.PredictRequest) -> dict[str, np.ndarray]:
    for field in UNHONOURED_PREDICT_FIELDS:
        if request.HasField(field):
            raise BadRequest(f"PredictRequest field {field!r} is not supported by this server")
    bounds.check_input_count(len(request.inputs))
    if not request.inputs:
        raise BadRequest("PredictRequest has no inputs")
    return {name: tensor_proto.to_numpy(t, f"input {name!r}") for name, t in request.inputs.items()}


def output_filter(request: predict_pb2.PredictRequest) -> list[str] | None:
    names = list(request.output_filter)
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise BadRequest(f"output_filter names {', '.join(duplicates)} more than once")
    return names or None


def predict_responses(
    dp: DataPlane, turn: Turn, *, single: bool = True, tensor_content: bool = False
) -> Iterator[predict_pb2.PredictResponse]:
    """Run one logical Predict; a streaming model yields one response per item unless ``single``.

    The turn runs as the request type every tensor wire shares (:meth:`DataPlane.infer`).
    :param tensor_content: outputs as raw bytes rather than typed fields.
    """
    mv = resolve(dp, turn.model_spec)
    signature = turn.model_spec.signature_name or None
    wanted = [RequestedOutput(name) for name in turn.output_filter or ()]  # checked by output_filter
    request = InferRequest(turn.inputs, outputs=wanted or None, signature_name=signature, check_shapes=False)
    results = [dp.infer(mv, request)] if single else dp.infer_stream(mv, request)
    for result in results:
        yield _response(mv, signature, result, tensor_content)


def _response(mv: ModelVersion, signature: str | None, outputs: dict[str, Any], tensor_content: bool):
    response = predict_pb2.PredictResponse()
    effective_spec(response.model_spec, mv, signature or "")
    for name, value in outputs.items():
        tensor_proto.from_numpy(value, response.outputs[name], use_tensor_content=tensor_content, name=name)
    return response


# -- tf.Example input -------------------------------------------------------------------


def examples_of(input_: Any) -> list[dict[str, list[Any]]]:
    """Classify/Regress input as ``{feature: [values]}`` per example, context merged in."""
    kind = input_.WhichOneof("kind")
    if kind is None:
        raise BadRequest("Input is empty: set example_list or example_list_with_context")
    if kind == "example_list":
        examples, context = input_.example_list.examples, {}
    else:
        examples = input_.example_list_with_context.examples
        context = _features(input_.example_list_with_context.context)
    if not examples:
        raise BadRequest("Input has no examples")
    # an example's own feature wins over a context feature of the same name
    return [{**context, **_features(example)} for example in examples]


def _features(example: Any) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for name, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        out[name] = list(getattr(feature, kind).value) if kind else []
    return out


def classification_result(results: list[list[tuple[str, float]]], out: Any) -> None:
    for classes in results:
        entry = out.classifications.add()
        for label, score in classes:
            entry.classes.add(label=str(label), score=float(score))


def regression_result(values: list[float], out: Any) -> None:
    for value in values:
        out.regressions.add(value=float(value))


# -- metadata ---------------------------------------------------------------------------


def signature_def(signature: Signature, out: meta_graph_pb2.SignatureDef, where: str) -> None:
    """The REST document's ``SignatureDef`` (:mod:`..tf_documents`), with defaults as tensors."""
    json_format.ParseDict(documents.signature_def(signature), out)
    for name, value in (signature.defaults or {}).items():
        try:
            tensor_proto.from_numpy(np.asarray(value), out.defaults[name], name=name)
        except Exception:  # a plugin's default no tensor can hold: describe the rest
            del out.defaults[name]
            log.warning(
                "%s: default %r of a signature is not a tensor; left out of the metadata",
                where,
                name,
            )


# -- services ---------------------------------------------------------------------------


class PredictionServicer(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, dataplane: DataPlane, *, tensor_content: bool = False):
        self.dp = dataplane
        self.tensor_content = tensor_content

    @rpc
    def Predict(self, request: predict_pb2.PredictRequest, context: grpc.ServicerContext):
        # A lone NONE or END_SPLIT is an ordinary request; SPLIT needs the stream.
        state = request.predict_streamed_options.request_state
        if state not in (PredictStream.NONE, PredictStream.END_SPLIT):
            name = predict_pb2.PredictStreamedOptions.RequestState.Name(state)
            raise BadRequest(f"request_state {name} needs the streaming RPC PredictionService/PredictStreamed")
        resolve(self.dp, request.model_spec)  # as TF Serving: an unknown servable before the inputs
        turn = Turn(request.model_spec, decode_inputs(request), output_filter(request))
        return next(predict_responses(self.dp, turn, tensor_content=self.tensor_content))

    @streaming_rpc
    def PredictStreamed(self, request_iterator, context: grpc.ServicerContext):
        stream = PredictStream(decode_inputs, output_filter)
        for request in request_iterator:
            turn = stream.feed(request)
            if stream.cancelled:
                return
            if turn is not None:
                yield from predict_responses(
                    self.dp, turn, single=stream.single_response, tensor_content=self.tensor_content
                )
        stream.finish()

    @rpc
    def Classify(self, request: classification_pb2.ClassificationRequest, context: grpc.ServicerContext):
        mv = resolve(self.dp, request.model_spec)
        signature = request.model_spec.signature_name or None
        results = self.dp.classify(mv, examples_of(request.input), signature_name=signature)
        response = classification_pb2.ClassificationResponse()
        effective_spec(response.model_spec, mv, signature or "")
        classification_result(results, response.result)
        return response

    @rpc
    def Regress(self, request: regression_pb2.RegressionRequest, context: grpc.ServicerContext):
        mv = resolve(self.dp, request.model_spec)
        signature = request.model_spec.signature_name or None
        values = self.dp.regress(mv, examples_of(request.input), signature_name=signature)
        response = regression_pb2.RegressionResponse()
        effective_spec(response.model_spec, mv, signature or "")
        regression_result(values, response.result)
        return response

    @rpc
    def MultiInference(self, request: inference_pb2.MultiInferenceRequest, context: grpc.ServicerContext):
        if not request.tasks:
            raise BadRequest("MultiInferenceRequest has no tasks")
        names = {task.model_spec.name for task in request.tasks}
        if len(names) > 1:
            raise BadRequest(f"all tasks must use the same model; found {', '.join(sorted(names))}")
        versions = [resolve(self.dp, task.model_spec) for task in request.tasks]
        if len({mv.version for mv in versions}) > 1:
            raise BadRequest("all tasks must address the same model version")
        signatures = [
            task.model_spec.signature_name or versions[0].metadata.default_signature for task in request.tasks
        ]
        repeated = sorted({s for s in signatures if signatures.count(s) > 1})
        if repeated:
            raise BadRequest(f"Duplicate evaluation of signature: {', '.join(repeated)}")
        examples = examples_of(request.input)
        response = inference_pb2.MultiInferenceResponse()
        for task, mv, signature in zip(request.tasks, versions, signatures):
            result = response.results.add()
            effective_spec(result.model_spec, mv, signature)
            if task.method_name == CLASSIFY_METHOD:
                classes = self.dp.classify(mv, examples, signature_name=signature)
                classification_result(classes, result.classification_result)
            elif task.method_name == REGRESS_METHOD:
                values = self.dp.regress(mv, examples, signature_name=signature)
                regression_result(values, result.regression_result)
            else:
                raise BadRequest(
                    f"Unsupported signature method_name: {task.method_name!r}; "
                    f"expected {CLASSIFY_METHOD!r} or {REGRESS_METHOD!r}"
                )
        return response

    @rpc
    def GetModelMetadata(self, request: get_model_metadata_pb2.GetModelMetadataRequest, context):
        fields = list(request.metadata_field)
        if not fields:
            raise BadRequest(f"GetModelMetadataRequest must name a metadata_field ({SIGNATURE_DEF!r})")
        unknown = [f for f in fields if f != SIGNATURE_DEF]
        if unknown:
            raise BadRequest(f"Metadata field {unknown[0]} is not supported; the one field is {SIGNATURE_DEF!r}")
        mv = resolve(self.dp, request.model_spec)
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        effective_spec(response.model_spec, mv, None)
        signatures = get_model_metadata_pb2.SignatureDefMap()
        for name, signature in self.dp.metadata(mv).signatures.items():
            signature_def(signature, signatures.signature_def[name], f"{mv.name} version {mv.version}")
        response.metadata[SIGNATURE_DEF].Pack(signatures)
        return response


class ModelServicer(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, dataplane: DataPlane, control: Any = None, model_control_mode: str | None = None):
        self.dp = dataplane
        self.control = control
        self.model_control_mode = model_control_mode

    @rpc
    def GetModelStatus(self, request: get_model_status_pb2.GetModelStatusRequest, context):
        spec = request.model_spec
        if not spec.name:
            raise BadRequest("Missing ModelSpec: set model_spec.name")
        choice = spec.WhichOneof("version_choice")
        version = spec.version.value if choice == "version" else None
        label = spec.version_label if choice == "version_label" else None
        statuses = [documents.version_status(mv) for mv in self.dp.statuses(spec.name, version, label)]
        return json_format.ParseDict({"model_version_status": statuses}, get_model_status_pb2.GetModelStatusResponse())

    @rpc
    def HandleReloadConfigRequest(self, request: model_management_pb2.ReloadConfigRequest, context):
        """Serve exactly the models of the new config: added ones load, missing ones unload.

        Answers once every worker applied it (servekit.control); a model that fails
        to load is an error naming it, as TF Serving's reload reports it.
        """
        require_model_control(self.model_control_mode)
        control_of(self).reload_config(served_models(request.config))
        return model_management_pb2.ReloadConfigResponse(status=status_pb2.StatusProto(error_code="OK"))


def served_models(config: Any) -> list[dict[str, Any]]:
    """A ``ModelServerConfig``'s models as the control plane takes them."""
    if config.WhichOneof("config") != "model_config_list":
        raise BadRequest("ReloadConfigRequest: config must hold a model_config_list")
    models = [served_model(entry) for entry in config.model_config_list.config]
    names = [m["name"] for m in models]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise BadRequest(f"ReloadConfigRequest: model {repeated[0]!r} is configured twice")
    return models


def add_to_server(
    server: grpc.Server,
    dataplane: DataPlane,
    *,
    tensor_content: bool = False,
    control: Any = None,
    model_control_mode: str | None = None,
) -> None:
    """Add both services; ``tensor_content`` is ``--grpc-tensor-content``; ``control`` (the app's
    :class:`servekit.control.ControlPlane`) carries out config reloads."""
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
        PredictionServicer(dataplane, tensor_content=tensor_content), server
    )
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(
        ModelServicer(dataplane, control, model_control_mode), server
    )
