"""servekit's own .proto files against the public ones: same names, same field numbers.

The reference descriptors come from the installed ``tensorflow``,
``tensorflow-serving-api`` and ``tritonclient`` packages; our stubs live in a
private descriptor pool, so both sets load in this one process.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from lazy_modules import lazy_module
from servekit.protocols.grpc.protos.inference import grpc_service_pb2
from servekit.protocols.grpc.protos.tensorflow.core.framework import types_pb2
from servekit.protocols.grpc.protos.tensorflow.core.protobuf import meta_graph_pb2
from servekit.protocols.grpc.protos.tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    model_service_pb2,
    predict_pb2,
    prediction_service_pb2,
)

# needs torch or TensorFlow (or TF Serving's protos, which import TensorFlow): out of the quick lane
pytestmark = pytest.mark.slow
# imported by the first test that reads them, not at collection (every worker of a parallel run collects)
tf_metadata = lazy_module("tensorflow_serving.apis.get_model_metadata_pb2")
tf_status = lazy_module("tensorflow_serving.apis.get_model_status_pb2")
tf_inference = lazy_module("tensorflow_serving.apis.inference_pb2")
tf_model_service = lazy_module("tensorflow_serving.apis.model_service_pb2")
tf_predict = lazy_module("tensorflow_serving.apis.predict_pb2")
tf_prediction_service = lazy_module("tensorflow_serving.apis.prediction_service_pb2")
triton = lazy_module("tritonclient.grpc.service_pb2")

#: Public fields our protos do not declare (a client sending them keeps them as unknown fields).
NEWER_OR_LEFT_OUT = {
    # needs tensorflow/core/protobuf/struct.proto; servekit never writes it
    "tensorflow.TensorInfo": ("composite_tensor",),
    # newer than the predict.proto servekit implements (disaggregated serving only)
    "tensorflow.serving.PredictRequest.RequestOptions": ("return_all_stoptokens", "handshake"),
}

PAIRS = [
    pytest.param(predict_pb2, tf_predict, id="predict_pb2"),
    # imports classification, regression, input, model, example, feature
    pytest.param(inference_pb2, tf_inference, id="inference_pb2"),
    # SignatureDef, TensorInfo, TensorProto
    pytest.param(get_model_metadata_pb2, tf_metadata, id="get_model_metadata_pb2"),
    pytest.param(get_model_status_pb2, tf_status, id="get_model_status_pb2"),
]


def messages(file_descriptor):
    """Every message and enum a file defines or imports, by full name."""
    seen = {}

    def walk(fd):
        if fd.name in done:
            return
        done.add(fd.name)
        for dep in fd.dependencies:
            walk(dep)

        def add(msg):
            seen[msg.full_name] = msg
            for nested in msg.nested_types:
                add(nested)
            for enum in msg.enum_types:
                seen[enum.full_name] = enum

        for msg in fd.message_types_by_name.values():
            add(msg)
        for enum in fd.enum_types_by_name.values():
            seen[enum.full_name] = enum

    done: set[str] = set()
    walk(file_descriptor)
    return seen


def field_table(msg):
    if not hasattr(msg, "fields"):  # an enum
        return {v.name: v.number for v in msg.values}
    return {
        f.name: (
            f.number,
            f.type,
            f.is_repeated,
            f.message_type.full_name if f.message_type else None,
            f.enum_type.full_name if f.enum_type else None,
            f.containing_oneof.name if f.containing_oneof else None,
        )
        for f in msg.fields
    }


@pytest.mark.parametrize(("ours", "theirs"), PAIRS)
def test_messages_match_tensorflow_serving(ours, theirs):
    mine, reference = messages(ours.DESCRIPTOR), messages(theirs.DESCRIPTOR)
    for name, msg in mine.items():
        if name.startswith("google.protobuf."):
            continue
        assert name in reference, f"{name} is not in the public API"
        expected = field_table(reference[name])
        for left_out in NEWER_OR_LEFT_OUT.get(name, ()):
            expected.pop(left_out, None)
        assert field_table(msg) == expected, name


def test_every_public_data_type_is_declared():
    import tensorflow.core.framework.types_pb2 as tf_types

    assert dict(types_pb2.DataType.items()) == dict(tf_types.DataType.items())


def methods(service):
    return {m.name: (m.input_type.full_name, m.output_type.full_name) for m in service.methods}


def test_services_match_tensorflow_serving():
    ours = prediction_service_pb2.DESCRIPTOR.services_by_name["PredictionService"]
    theirs = tf_prediction_service.DESCRIPTOR.services_by_name["PredictionService"]
    assert ours.full_name == theirs.full_name == "tensorflow.serving.PredictionService"
    mine = methods(ours)
    assert mine.pop("PredictStreamed") == (
        "tensorflow.serving.PredictRequest",
        "tensorflow.serving.PredictResponse",
    )
    assert mine == methods(theirs)
    model_service = model_service_pb2.DESCRIPTOR.services_by_name["ModelService"]
    reference = methods(tf_model_service.DESCRIPTOR.services_by_name["ModelService"])
    assert methods(model_service) == reference  # GetModelStatus and HandleReloadConfigRequest


def test_v2_matches_tritonclient():
    ours = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    theirs = triton.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert ours.full_name == theirs.full_name == "inference.GRPCInferenceService"
    reference = methods(theirs)
    assert methods(ours) == {name: reference[name] for name in methods(ours)}
    stream = ours.methods_by_name["ModelStreamInfer"]
    assert stream.client_streaming and stream.server_streaming
    reference_messages = messages(triton.DESCRIPTOR)
    for name, msg in messages(grpc_service_pb2.DESCRIPTOR).items():
        mine = field_table(msg)
        if msg.file.name.endswith("model_config.proto"):
            # Triton's whole model configuration, as its latest release has it: an older
            # tritonclient lacks the newest messages and fields, the ones it has must match
            if name not in reference_messages:
                continue
            mine = {k: v for k, v in mine.items() if k in field_table(reference_messages[name])}
        assert mine == field_table(reference_messages[name]), name


def test_messages_cross_parse_with_the_public_classes():
    mine = predict_pb2.PredictRequest()
    mine.model_spec.name = "m"
    mine.model_spec.version_label = "canary"
    mine.inputs["x"].dtype = types_pb2.DT_HALF
    mine.inputs["x"].half_val.extend([15360])
    mine.predict_streamed_options.request_state = predict_pb2.PredictStreamedOptions.SPLIT
    mine.predict_streamed_options.split_dimensions["x"] = 1
    theirs = tf_predict.PredictRequest.FromString(mine.SerializeToString())
    assert theirs.model_spec.version_label == "canary"
    assert list(theirs.inputs["x"].half_val) == [15360]
    assert theirs.predict_streamed_options.split_dimensions["x"] == 1
    assert predict_pb2.PredictRequest.FromString(theirs.SerializeToString()) == mine


def test_signature_def_map_any_unpacks_into_the_public_class():
    signatures = get_model_metadata_pb2.SignatureDefMap()
    info = signatures.signature_def["serving_default"].inputs["x"]
    info.name, info.dtype = "x:0", types_pb2.DT_FLOAT
    response = get_model_metadata_pb2.GetModelMetadataResponse()
    response.metadata["signature_def"].Pack(signatures)
    theirs = tf_metadata.GetModelMetadataResponse.FromString(response.SerializeToString())
    unpacked = tf_metadata.SignatureDefMap()
    assert theirs.metadata["signature_def"].Unpack(unpacked)
    assert unpacked.signature_def["serving_default"].inputs["x"].name == "x:0"
    assert isinstance(meta_graph_pb2.SignatureDef(), type(signatures.signature_def["a"]))


def test_generated_files_are_up_to_date():
    pytest.importorskip("grpc_tools")
    from importlib.metadata import version

    from servekit.protocols.grpc.protos.inference import grpc_service_pb2_grpc

    if version("grpcio-tools") != grpc_service_pb2_grpc.GRPC_GENERATED_VERSION:
        # another protoc writes other (equivalent) code; compare like with like
        pytest.skip(f"stubs were generated by grpcio-tools {grpc_service_pb2_grpc.GRPC_GENERATED_VERSION}")
    result = subprocess.run(
        [sys.executable, "-m", "servekit.protocols.grpc.compile_protos", "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_grpc_needs_no_tensorflow():
    """The server side imports neither tensorflow nor tensorflow_serving."""
    code = (
        "import sys, servekit.server.grpc_server, servekit.codecs.tensor_proto; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'tensorflow_serving')); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_tensorflow_first_then_ours_in_one_process():
    """The order the default pool would trip on: the public modules first, ours after."""
    code = (
        "import tensorflow_serving.apis.prediction_service_pb2, tensorflow_serving.apis.model_service_pb2; "
        "import tritonclient.grpc.service_pb2; "
        "import servekit.protocols.grpc.tf_serving, servekit.protocols.grpc.v2; print('ok')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]
