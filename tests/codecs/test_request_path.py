"""One request path per protocol, observability without re-parsing, and the layering around them.

- V2 over HTTP and over gRPC decode into the same :class:`InferRequest` through
  the same checks, and answer the same metadata; TF Serving's REST and gRPC
  answer the same metadata and status documents.
- The request log stores the predictions the protocols hand it, binary V2
  answers and OpenAI choices included, without reading the answers back.
- The batcher is the model version's; the tokenizer comes through the data plane.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import servekit
from generative_models import ECHO_MODEL_PY, write_model
from google.protobuf import json_format
from servekit.codecs import v2 as v2_json
from servekit.codecs import v2_grpc
from servekit.codecs.infer_request import InferRequest, RequestedOutput
from servekit.dataplane import batching
from servekit.errors import BadRequest
from servekit.protocols.grpc.protos.inference import grpc_service_pb2 as pb
from servekit.protocols.grpc.protos.tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_pb2,
)
from servekit.protocols.grpc.tf_serving import ModelServicer, PredictionServicer
from servekit.protocols.grpc.v2 import InferenceServicer
from servekit.streams import is_stream
from sklearn_models import fit_iris, fit_regressor

ROWS = [[1.0, 2.0], [0.0, 0.0], [1.0, 1.0]]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    base = tmp_path_factory.mktemp("request_path")
    fit_regressor(base / "linear")
    fit_iris(base / "iris")
    write_model(base / "echo", ECHO_MODEL_PY)
    return base


def http_request(**parameters) -> bytes:
    tensor = {"name": "x", "shape": [3, 2], "datatype": "FP64", "data": sum(ROWS, [])}
    if parameters:
        tensor["parameters"] = parameters
    return json.dumps(
        {"id": "r1", "inputs": [tensor], "parameters": {"signature_name": "predict"}, "outputs": [{"name": "predict"}]}
    ).encode()


def grpc_request(**parameters) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="linear", id="r1")
    tensor = request.inputs.add(name="x", datatype="FP64", shape=[3, 2])
    tensor.contents.fp64_contents.extend(sum(ROWS, []))
    for key, value in parameters.items():
        v2_grpc.set_parameter(tensor.parameters, key, value)
    v2_grpc.set_parameter(request.parameters, "signature_name", "predict")
    request.outputs.add(name="predict")
    return request


# -- one request type, one validation -----------------------------------------------------------


def test_v2_http_and_grpc_decode_into_the_same_request():
    over_http = v2_json.decode_infer_request(http_request())
    over_grpc = v2_grpc.decode_infer_request(grpc_request())
    for req in (over_http, over_grpc):
        assert isinstance(req, InferRequest)
        assert req.id == "r1" and req.signature_name == "predict" and req.output_names == ["predict"]
        np.testing.assert_array_equal(req.inputs["x"], np.array(ROWS))


@pytest.mark.parametrize("value, refused", [("", False), (0, False), (False, False), ("region0", True), (8, True)])
def test_both_wires_agree_on_what_leaves_a_triton_parameter_unset(value, refused):
    for decode, request in (
        (v2_json.decode_infer_request, http_request(shared_memory_region=value)),
        (v2_grpc.decode_infer_request, grpc_request(shared_memory_region=value)),
    ):
        if refused:
            with pytest.raises(BadRequest, match="shared_memory_"):
                decode(request)
        else:
            assert decode(request).inputs["x"].shape == (3, 2)


def test_both_wires_refuse_a_signature_name_that_is_not_a_string_and_an_output_named_twice():
    body = json.loads(http_request())
    body["parameters"]["signature_name"] = 3
    with pytest.raises(BadRequest, match="signature_name"):
        v2_json.decode_infer_request(json.dumps(body).encode())
    request = grpc_request()
    v2_grpc.set_parameter(request.parameters, "signature_name", 3)
    with pytest.raises(BadRequest, match="signature_name"):
        v2_grpc.decode_infer_request(request)
    twice = grpc_request()
    twice.outputs.add(name="predict")
    with pytest.raises(BadRequest, match="requested twice"):
        v2_grpc.decode_infer_request(twice)


def test_the_grpc_decode_keeps_how_the_tensors_came_so_the_answer_never_rereads_the_message():
    typed = grpc_request()
    raw = pb.ModelInferRequest(model_name="linear", id="r1")
    raw.inputs.add(name="x", datatype="FP64", shape=[3, 2])
    raw.raw_input_contents.append(np.array(ROWS).tobytes())
    for request, expected in ((typed, True), (raw, False)):
        assert v2_grpc.decode_infer_request(request).typed_contents is expected
        assert v2_grpc.used_typed_contents(request) is expected
    assert v2_json.decode_infer_request(http_request()).typed_contents is False


def test_the_data_plane_checks_shapes_for_v2_and_not_for_tf_serving(servekit_app, repo):
    dp = servekit_app(repo / "linear").application.extensions["servekit"]
    mv = dp.resolve("linear")
    name = mv.metadata.signature().inputs[0].name
    wrong = {name: np.ones((2, 3))}  # the regressor declares [-1, 2]
    with pytest.raises(BadRequest, match="does not match the model's shape"):
        dp.infer(mv, InferRequest(wrong))
    right = dp.infer(mv, InferRequest({name: np.array(ROWS)}, outputs=[RequestedOutput("predict")]))
    np.testing.assert_allclose(right["predict"], [9.0, 1.0, 6.0])
    with pytest.raises(Exception) as info:  # unchecked: the model itself refuses it
        dp.infer(mv, InferRequest(wrong, check_shapes=False))
    assert "does not match the model's shape" not in str(info.value)


# -- one metadata builder per protocol ---------------------------------------------------------


def test_v2_model_metadata_is_the_same_document_on_both_wires(servekit_app, repo):
    client = servekit_app(repo / "iris")
    dp = client.application.extensions["servekit"]
    over_http = client.get("/v2/models/iris").get_json()
    message = InferenceServicer(dp).ModelMetadata(pb.ModelMetadataRequest(name="iris"), None)
    over_grpc = json_format.MessageToDict(message, preserving_proto_field_name=True)
    for tensor in over_grpc["inputs"] + over_grpc["outputs"]:
        tensor["shape"] = [int(d) for d in tensor["shape"]]  # int64 is a string in proto JSON
    assert over_grpc == over_http and over_http["inputs"]


def test_tf_serving_metadata_and_status_are_the_same_documents_on_both_wires(servekit_app, repo):
    client = servekit_app(repo / "iris")
    dp = client.application.extensions["servekit"]
    rest = client.get("/v1/models/iris/metadata").get_json()
    request = get_model_metadata_pb2.GetModelMetadataRequest(
        model_spec=model_pb2.ModelSpec(name="iris"), metadata_field=["signature_def"]
    )
    response = PredictionServicer(dp).GetModelMetadata(request, None)
    signatures = get_model_metadata_pb2.SignatureDefMap()
    response.metadata["signature_def"].Unpack(signatures)
    over_grpc = json_format.MessageToDict(signatures, preserving_proto_field_name=True)["signature_def"]
    over_rest = rest["metadata"]["signature_def"]["signature_def"]
    assert set(over_grpc) == set(over_rest)
    for name, sig in over_rest.items():
        sig.pop("defaults", None)
        for tensors in (sig["inputs"], sig["outputs"]):
            for info in tensors.values():
                info["tensor_shape"].pop("unknown_rank")  # proto JSON leaves a false bool out
                for dim in info["tensor_shape"]["dim"]:
                    dim.pop("name")
        assert over_grpc[name] == sig
    status = ModelServicer(dp).GetModelStatus(
        get_model_status_pb2.GetModelStatusRequest(model_spec=model_pb2.ModelSpec(name="iris")), None
    )
    rest_status = client.get("/v1/models/iris").get_json()["model_version_status"]
    assert json_format.MessageToDict(status)["model_version_status"][0]["state"] == rest_status[0]["state"]
    assert [str(s.version) for s in status.model_version_status] == [s["version"] for s in rest_status]


# -- observability: the protocols hand their predictions over --------------------------------------


class Recorder:
    def __init__(self):
        self.records = []

    @servekit.hookimpl
    def log_request(self, record):
        self.records.append(record)


def logged_client(servekit_app, *paths):
    client = servekit_app(*paths, request_log_url="off")
    recorder = Recorder()
    client.application.extensions["servekit"].repository.pm.register(recorder, name="recorder")
    return client, recorder


def test_a_binary_v2_answer_is_logged_row_by_row(servekit_app, repo):
    client, recorder = logged_client(servekit_app, repo / "linear")
    body = {
        "inputs": [{"name": "x", "shape": [3, 2], "datatype": "FP64", "data": sum(ROWS, [])}],
        "parameters": {"binary_data_output": True},
    }
    r = client.post("/v2/models/linear/infer", json=body)
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/octet-stream"
    (record,) = recorder.records
    ids = r.headers["X-Prediction-Log-Ids"].split(",")
    assert [p.prediction_log_id for p in record.predictions] == ids and len(ids) == 3
    rows = [json.loads(p.output) for p in record.predictions]
    assert [list(row) for row in rows] == [["predict"]] * 3
    assert [row["predict"] for row in rows] == [pytest.approx([9.0]), pytest.approx([1.0]), pytest.approx([6.0])]


def test_openai_choices_are_the_logged_predictions_and_the_body_names_the_model(servekit_app, repo):
    client, recorder = logged_client(servekit_app, repo / "echo")
    r = client.post("/v1/completions", json={"model": "echo", "prompt": "hi", "n": 2, "max_tokens": 3})
    assert r.status_code == 200, r.get_json()
    (record,) = recorder.records
    assert record.model == "echo"
    choices = r.get_json()["choices"]
    assert [json.loads(p.output) for p in record.predictions] == choices
    assert [p.prediction_log_id for p in record.predictions] == r.headers["X-Prediction-Log-Ids"].split(",")


def test_an_answer_no_protocol_split_is_stored_whole(servekit_app, repo):
    client, recorder = logged_client(servekit_app, repo / "iris")
    row = {"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2}
    r = client.post("/v1/models/iris:classify", json={"examples": [row, row]})
    assert r.status_code == 200
    (record,) = recorder.records
    (prediction,) = record.predictions
    assert json.loads(prediction.output) == r.get_json()


def test_without_a_log_v2_hands_no_ids(servekit_app, repo):
    client = servekit_app(repo / "linear", request_log_url="off")
    body = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP64", "data": [1.0, 2.0]}]}
    r = client.post("/v2/models/linear/infer", json=body)
    assert r.status_code == 200 and "X-Prediction-Log-Ids" not in r.headers


# -- layering -------------------------------------------------------------------------------------


def test_the_batcher_is_the_model_versions(servekit_app, repo):
    dp = servekit_app(repo / "linear", max_batch_size=8).application.extensions["servekit"]
    mv = dp.resolve("linear")
    assert mv.batcher is None  # made on first use
    batcher = batching.batcher_for(mv)
    assert batcher is not None and mv.batcher is batcher and batching.batcher_for(mv) is batcher
    assert batcher in batching.active()
    off = servekit_app(repo / "linear").application.extensions["servekit"].resolve("linear")
    assert batching.batcher_for(off) is None and off.batcher == batching.OFF


def test_the_tokenizer_comes_through_the_data_plane(servekit_app, repo):
    dp = servekit_app(repo / "echo").application.extensions["servekit"]
    assert dp.tokenizer(dp.resolve("echo")) is None


def generator():
    yield 1


@pytest.mark.parametrize(
    "value, streams",
    [
        (generator(), True),
        (iter([1]), True),
        (np.zeros(2), False),
        ({"a": 1}, False),
        ([1], False),
        ("text", False),
        (b"raw", False),
        (3.0, False),
    ],
)
def test_one_test_says_what_a_stream_is(value, streams):
    assert is_stream(value) is streams
