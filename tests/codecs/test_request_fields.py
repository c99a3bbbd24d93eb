"""Every V2 and TF Serving request field is honoured or refused with a 400 naming it.

The field names come from the protocols' own schemas: the V2 gRPC messages
(``grpc_service.proto``, whose JSON form the REST protocol writes with ``data``
for ``contents``) and TF Serving's ``PredictRequest`` (``predict.proto``).  The
lists of what servekit reads are the ones the refusals read
(:mod:`servekit.codecs.v2`, :mod:`servekit.codecs.infer_request`,
:mod:`servekit.protocols.grpc.tf_serving`), so the two cannot drift apart.
"""

from __future__ import annotations

import json

import pytest
from servekit.codecs import infer_request, v2, v2_grpc
from servekit.errors import BadRequest
from servekit.protocols import generate_requests
from servekit.protocols.grpc import tf_serving
from servekit.protocols.grpc.protos.inference import grpc_service_pb2 as pb
from servekit.protocols.grpc.protos.tensorflow_serving.apis import predict_pb2

#: how the V2 gRPC fields are spelled in the REST protocol's JSON, or where they travel instead
#: (the model's name and version travel in the path; KServe's client repeats the name in the body)
REST_SPELLING = {"contents": "data", "raw_input_contents": None}


def rest_names(message) -> set[str]:
    names = {REST_SPELLING.get(f.name, f.name) for f in message.DESCRIPTOR.fields}
    return names - {None}


def test_every_v2_field_is_read():
    assert rest_names(pb.ModelInferRequest) == set(v2.REQUEST_KEYS)
    assert rest_names(pb.ModelInferRequest.InferInputTensor) == set(v2.INPUT_KEYS)
    assert rest_names(pb.ModelInferRequest.InferRequestedOutputTensor) == set(v2.OUTPUT_KEYS)


def test_every_tf_serving_predict_field_is_read_or_refused():
    honoured = {"model_spec", "inputs", "output_filter", "predict_streamed_options", "client_id"}
    fields = {f.name for f in predict_pb2.PredictRequest.DESCRIPTOR.fields}
    assert fields == honoured | set(tf_serving.UNHONOURED_PREDICT_FIELDS)


# -- V2 over HTTP and gRPC ------------------------------------------------------------------

INPUT = {"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}

#: (case, the REST body, the field the 400 names)
V2_REFUSED = [
    *[
        (f"request-parameter-{key}", {"inputs": [INPUT], "parameters": {key: -5}}, key)  # the model's queue reads them
        for key in infer_request.UNHONOURED_REQUEST_PARAMETERS
    ],
    ("request-field", {"inputs": [INPUT], "model_spec": {"name": "x"}}, "model_spec"),
    ("single-tensor-field", {**INPUT, "instances": [1]}, "instances"),
    ("input-field", {"inputs": [{**INPUT, "content_type": "np"}]}, "content_type"),
    ("input-parameter", {"inputs": [{**INPUT, "parameters": {"top_k": "1"}}]}, "top_k"),
    ("input-content-type", {"inputs": [{**INPUT, "parameters": {"content_type": "base64"}}]}, "content_type"),
    ("output-field", {"inputs": [INPUT], "outputs": [{"name": "y", "datatype": "FP32"}]}, "datatype"),
    ("output-parameter", {"inputs": [INPUT], "outputs": [{"name": "y", "parameters": {"top_k": 1}}]}, "top_k"),
]


@pytest.mark.parametrize(("body", "field"), [c[1:] for c in V2_REFUSED], ids=[c[0] for c in V2_REFUSED])
def test_a_v2_rest_field_servekit_does_not_read_is_a_400_naming_it(body, field):
    with pytest.raises(BadRequest) as info:
        v2.decode_infer_request(json.dumps(body).encode())
    assert repr(field) in info.value.message


def grpc_request(body: dict) -> pb.ModelInferRequest:
    """The gRPC form of a REST body's parameters (its unknown JSON members have no gRPC spelling)."""
    request = pb.ModelInferRequest(model_name="m")
    for key, value in body.get("parameters", {}).items():
        request.parameters[key].int64_param = value
    for spec in body["inputs"]:
        tensor = request.inputs.add(name=spec["name"], datatype=spec["datatype"], shape=spec["shape"])
        tensor.contents.fp32_contents.extend(spec["data"])
        for key, value in spec.get("parameters", {}).items():
            tensor.parameters[key].string_param = value
    for spec in body.get("outputs", []):
        output = request.outputs.add(name=spec["name"])
        for key, value in spec.get("parameters", {}).items():
            output.parameters[key].int64_param = value
    return request


V2_GRPC_REFUSED = [c for c in V2_REFUSED if "parameter" in c[0]]


@pytest.mark.parametrize(("body", "field"), [c[1:] for c in V2_GRPC_REFUSED], ids=[c[0] for c in V2_GRPC_REFUSED])
def test_a_v2_grpc_parameter_servekit_does_not_read_is_a_400_naming_it(body, field):
    with pytest.raises(BadRequest) as info:  # INVALID_ARGUMENT on the wire
        v2_grpc.decode_infer_request(grpc_request(body))
    assert repr(field) in info.value.message


def test_mlservers_numpy_content_type_says_what_servekit_does_and_passes():
    body = {"inputs": [{**INPUT, "parameters": {"content_type": "np"}}]}  # MLServer's NumpyCodec
    assert v2.decode_infer_request(json.dumps(body).encode()).inputs["x"].tolist() == [1.0]
    assert v2_grpc.decode_infer_request(grpc_request(body)).inputs["x"].tolist() == [1.0]
    text = {
        "inputs": [
            {"name": "x", "shape": [1], "datatype": "BYTES", "data": ["a"], "parameters": {"content_type": "np"}}
        ]
    }
    with pytest.raises(BadRequest, match="'content_type' 'np' is not supported by this server for a BYTES tensor"):
        v2.decode_infer_request(json.dumps(text).encode())


def test_the_model_a_kserve_client_names_in_the_body_must_be_the_paths():
    body = {"id": "1", "model_name": "m", "inputs": [INPUT]}  # as KServe's InferRequest.to_rest writes it
    decoded = v2.decode_infer_request(json.dumps(body).encode())
    decoded.check_addressed("m", "1")
    with pytest.raises(BadRequest, match="'model_name' is 'm', but it was sent to model 'other'"):
        decoded.check_addressed("other", "1")
    versioned = v2.decode_infer_request(json.dumps({**body, "model_version": "2"}).encode())
    with pytest.raises(BadRequest, match="'model_version' is '2', but version 1 answers it"):
        versioned.check_addressed("m", "1")


def test_the_parameters_servekit_reads_and_unset_scheduling_pass():
    body = {
        "inputs": [{**INPUT, "parameters": {"binary_data_size": None}}],
        "outputs": [{"name": "y", "parameters": {"binary_data": False, "classification": 0}}],
        "parameters": {"priority": 0, "timeout": None, "anything": "for the model"},
    }
    decoded = v2.decode_infer_request(json.dumps(body).encode())
    assert decoded.parameters["anything"] == "for the model"  # request parameters reach the model
    assert decoded.scheduling == (None, None)


def test_scheduling_parameters_go_to_the_queue_not_the_model_on_both_wires():
    body = {"inputs": [INPUT], "parameters": {"priority": 2, "timeout": 1500, "anything": 1}}
    for decoded in (
        v2.decode_infer_request(json.dumps(body).encode()),
        v2_grpc.decode_infer_request(grpc_request(body)),
    ):
        assert decoded.scheduling == (2, 1500)
        assert decoded.parameters == {"anything": 1}


@pytest.mark.parametrize("key", infer_request.UNHONOURED_REQUEST_PARAMETERS)
def test_a_scheduling_parameter_on_generate_is_a_400_naming_it(key):
    with pytest.raises(BadRequest) as info:
        generate_requests.read("hello", {}, {key: 7})
    assert f"'{key}'" in info.value.message
    assert generate_requests.read("hello", {}, {key: 0}).prompt == "hello"


def test_tf_serving_request_options_are_a_400_naming_them():
    request = predict_pb2.PredictRequest()
    request.inputs["x"].dtype = 1
    request.request_options.max_cache_length = 64
    with pytest.raises(BadRequest) as info:
        tf_serving.decode_inputs(request)
    assert "'request_options'" in info.value.message
