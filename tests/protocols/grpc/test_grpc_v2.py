"""V2 ``inference.GRPCInferenceService`` through ``tritonclient.grpc``."""

from __future__ import annotations

import queue

import grpc
import numpy as np
import pytest
from grpc_support import HALF_PLUS_TWO, shared_server, tf_plugin_installed

pytestmark = pytest.mark.slow  # starts real servers or subprocesses

tritonclient_grpc = pytest.importorskip("tritonclient.grpc")
from servekit import __version__
from tritonclient.grpc import (
    InferenceServerClient,
    InferInput,
    InferRequestedOutput,
    service_pb2,
    service_pb2_grpc,
)
from tritonclient.utils import InferenceServerException

IRIS = np.array([[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]])
IRIS_FEATURES = ("sepal_length", "sepal_width", "petal_length", "petal_width")


@pytest.fixture(scope="session")
def grpc_server(request, tmp_path_factory):
    return shared_server(request, tmp_path_factory)


@pytest.fixture(scope="session")
def client(grpc_server):
    with InferenceServerClient(f"127.0.0.1:{grpc_server.grpc_port}") as c:
        yield c


def tensor(name: str, value: np.ndarray, datatype: str) -> InferInput:
    out = InferInput(name, list(value.shape), datatype)
    out.set_data_from_numpy(value)
    return out


def iris_inputs(rows=IRIS):
    return [tensor(n, np.ascontiguousarray(rows[:, i]), "FP64") for i, n in enumerate(IRIS_FEATURES)]


# -- health and metadata ---------------------------------------------------------------------


def test_server_live_and_ready(client):
    assert client.is_server_live()
    assert client.is_server_ready()


def test_model_ready(client):
    assert client.is_model_ready("iris")
    assert client.is_model_ready("iris", "1")
    assert not client.is_model_ready("broken")


def test_model_ready_unknown(client):
    with pytest.raises(InferenceServerException) as info:
        client.is_model_ready("nope")
    assert info.value.status() == "StatusCode.NOT_FOUND"


def test_server_metadata(client):
    meta = client.get_server_metadata()
    assert meta.name == "servekit"
    assert meta.version == __version__
    assert "parameters" in meta.extensions


def test_model_metadata(client):
    meta = client.get_model_metadata("iris")
    assert meta.name == "iris"
    assert list(meta.versions) == ["1", "2"]
    assert meta.platform == "sklearn"
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [(n, "FP64", [-1]) for n in IRIS_FEATURES]
    assert [(t.name, t.datatype) for t in meta.outputs] == [("predict", "BYTES")]


def test_model_metadata_unknown(client):
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("nope")
    assert info.value.status() == "StatusCode.NOT_FOUND"


# -- ModelInfer ---------------------------------------------------------------------------------


def test_infer_sklearn(client):
    result = client.infer("iris", iris_inputs())
    assert result.as_numpy("predict").tolist() == [b"setosa", b"virginica"]
    response = result.get_response()
    assert response.model_name == "iris" and response.model_version == "2"


def test_infer_version_and_request_id(client):
    result = client.infer("iris", iris_inputs(), model_version="1", request_id="req-7")
    assert result.get_response().model_version == "1"
    assert result.get_response().id == "req-7"


def test_infer_signature_parameter_and_requested_output(client):
    result = client.infer(
        "iris",
        iris_inputs(),
        parameters={"signature_name": "predict_proba"},
        outputs=[InferRequestedOutput("predict_proba")],
    )
    proba = result.as_numpy("predict_proba")
    assert proba.shape == (2, 3) and proba[0].argmax() == 0 and proba[1].argmax() == 2


V2_DTYPES = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}


@pytest.mark.parametrize("datatype", list(V2_DTYPES))
def test_infer_raw_every_datatype(client, datatype):
    value = np.array([[0, 1, 2], [3, 4, 5]]).astype(V2_DTYPES[datatype])
    result = client.infer("echo", [tensor("x", value, datatype)])
    back = result.as_numpy("x")
    assert back.dtype == value.dtype
    np.testing.assert_array_equal(back, value)
    assert result.get_response().outputs[0].datatype == datatype


def test_infer_raw_bytes(client):
    value = np.array([[b"a", b"\x00\xff"], ["caf\u00e9".encode(), b""]], dtype=np.object_)
    back = client.infer("echo", [tensor("s", value, "BYTES")]).as_numpy("s")
    assert back.tolist() == value.tolist()


def test_infer_requested_outputs_filter(client):
    a, b = np.arange(3, dtype=np.int32), np.ones(2, np.float32)
    result = client.infer(
        "echo",
        [tensor("a", a, "INT32"), tensor("b", b, "FP32")],
        outputs=[InferRequestedOutput("b")],
    )
    assert [o.name for o in result.get_response().outputs] == ["b"]
    assert result.as_numpy("a") is None


# -- typed contents, through tritonclient's generated stubs ------------------------------------------

TYPED = [
    ("BOOL", "bool_contents", [True, False]),
    ("INT8", "int_contents", [-128, 127]),
    ("INT16", "int_contents", [-300, 300]),
    ("INT32", "int_contents", [-(2**31), 2**31 - 1]),
    ("INT64", "int64_contents", [-(2**63), 2**63 - 1]),
    ("UINT8", "uint_contents", [0, 255]),
    ("UINT16", "uint_contents", [0, 65535]),
    ("UINT32", "uint_contents", [0, 2**32 - 1]),
    ("UINT64", "uint64_contents", [0, 2**64 - 1]),
    ("FP32", "fp32_contents", [1.5, -2.25]),
    ("FP64", "fp64_contents", [1e300, -2.5]),
    ("BYTES", "bytes_contents", [b"x", b"\x00yz"]),
]


@pytest.fixture(scope="session")
def raw_stub(grpc_server):
    with grpc.insecure_channel(f"127.0.0.1:{grpc_server.grpc_port}") as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def typed_request(datatype, field, values, model="echo") -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model)
    tensor_ = request.inputs.add(name="x", datatype=datatype, shape=[len(values)])
    getattr(tensor_.contents, field).extend(values)
    return request


@pytest.mark.parametrize(("datatype", "field", "values"), TYPED, ids=[t[0] for t in TYPED])
def test_infer_typed_contents(raw_stub, datatype, field, values):
    response = raw_stub.ModelInfer(typed_request(datatype, field, values), timeout=30)
    (out,) = response.outputs
    assert (out.name, out.datatype, list(out.shape)) == ("x", datatype, [2])
    # answered in raw_output_contents, as Triton answers, and in the typed contents the request used
    assert len(response.raw_output_contents) == 1
    got = tritonclient_grpc.InferResult(response).as_numpy("x").tolist()
    assert got == pytest.approx(values) if datatype.startswith("FP") else got == values
    typed = list(getattr(out.contents, field))
    assert typed == pytest.approx(values) if datatype.startswith("FP") else typed == values


def test_infer_raw_request_answers_raw_only(client):
    result = client.infer("echo", [tensor("x", np.arange(3, dtype=np.int32), "INT32")])
    response = result.get_response()
    assert len(response.raw_output_contents) == 1 and not response.outputs[0].HasField("contents")


def test_infer_typed_fp16_answers_raw(raw_stub):
    request = typed_request("FP32", "fp32_contents", [1.0, 2.0])
    request.inputs.add(name="h", datatype="FP16", shape=[1])
    request.raw_input_contents.extend([np.float32([1, 2]).tobytes(), np.float16([3]).tobytes()])
    request.inputs[0].ClearField("contents")
    response = raw_stub.ModelInfer(request, timeout=30)
    assert len(response.raw_output_contents) == 2
    assert np.frombuffer(response.raw_output_contents[1], np.float16).tolist() == [3.0]


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda r: r.inputs[0].contents.int_contents.append(1), "values"),
        (lambda r: setattr(r.inputs[0], "datatype", "FP16"), "raw_input_contents"),
        (
            lambda r: setattr(r.inputs[0], "datatype", "INT8") or r.inputs[0].contents.int_contents.__setitem__(0, 999),
            "range",
        ),
        (lambda r: setattr(r.inputs[0], "datatype", "COMPLEX"), "datatype"),
        (lambda r: r.raw_input_contents.append(b"\x00" * 3), "raw_input_contents"),
        (
            lambda r: r.inputs[0].parameters["shared_memory_region"].__setattr__("string_param", "r"),
            "shared_memory_region",
        ),
        (lambda r: r.ClearField("inputs"), "no inputs"),
        (lambda r: setattr(r, "model_version", "9"), "9"),
    ],
)
def test_infer_invalid(raw_stub, mutate, fragment):
    request = typed_request("INT32", "int_contents", [1, 2])
    mutate(request)
    with pytest.raises(grpc.RpcError) as info:
        raw_stub.ModelInfer(request, timeout=30)
    assert info.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)
    assert fragment in info.value.details()


@pytest.mark.parametrize(
    ("infer", "field"),
    [
        (lambda c: c.infer("iris", iris_inputs(), priority=3), "priority"),
        (lambda c: c.infer("iris", iris_inputs(), timeout=1000), "timeout"),
    ],
    ids=["priority", "timeout"],
)
def test_infer_scheduling_servekit_does_not_honour_is_invalid_argument(client, infer, field):
    """tritonclient sends ``priority`` and ``timeout`` only when set; a model without a ``queue:`` refuses them."""
    with pytest.raises(InferenceServerException) as info:
        infer(client)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert repr(field) in info.value.message()


def test_infer_raw_size_mismatch(client):
    good = tensor("x", np.arange(4, dtype=np.int32), "INT32")
    good._raw_content = good._raw_content[:-1]  # what a buggy client might send
    with pytest.raises(InferenceServerException) as info:
        client.infer("echo", [good])
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "bytes" in info.value.message()


def test_infer_unknown_model(client):
    with pytest.raises(InferenceServerException) as info:
        client.infer("nope", iris_inputs())
    assert info.value.status() == "StatusCode.NOT_FOUND"


def test_infer_failed_model(client):
    with pytest.raises(InferenceServerException) as info:
        client.infer("broken", iris_inputs())
    assert info.value.status() == "StatusCode.UNAVAILABLE"


def test_infer_streaming_model_unary_joins_items(client):
    value = np.arange(6, dtype=np.int64).reshape(3, 2)
    result = client.infer("chunks", [tensor("x", value, "INT64")])
    np.testing.assert_array_equal(result.as_numpy("y"), value * 2)


# -- ModelStreamInfer -------------------------------------------------------------------------------


def stream(client, calls, expect: int):
    """Send ``calls`` (kwargs for async_stream_infer) on one stream; the first ``expect`` (result, error) pairs."""
    received: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: received.put((result, error)))
    try:
        for kwargs in calls:
            client.async_stream_infer(**kwargs)
        return [received.get(timeout=60) for _ in range(expect)]
    finally:
        client.stop_stream()


def test_stream_infer_in_order_with_errors(client):
    x = np.array([1.5, 2.5], np.float32)
    out = stream(
        client,
        [
            {"model_name": "echo", "inputs": [tensor("x", x, "FP32")], "request_id": "a"},
            {"model_name": "nope", "inputs": [tensor("x", x, "FP32")], "request_id": "b"},
            {"model_name": "iris", "inputs": iris_inputs(), "request_id": "c"},
        ],
        expect=3,
    )
    (first, e1), (_, e2), (third, e3) = out
    assert e1 is None and e3 is None
    np.testing.assert_array_equal(first.as_numpy("x"), x)
    assert first.get_response().id == "a"
    assert isinstance(e2, InferenceServerException) and "nope" in e2.message()
    assert third.as_numpy("predict").tolist() == [b"setosa", b"virginica"]
    assert third.get_response().id == "c"


def test_stream_infer_decoupled_model_answers_per_item(client):
    value = np.arange(3, dtype=np.int64).reshape(3, 1)
    out = stream(
        client,
        [
            {
                "model_name": "chunks",
                "inputs": [tensor("x", value, "INT64")],
                "enable_empty_final_response": True,
            }
        ],
        expect=4,
    )
    results = [r for r, e in out if e is None]
    assert len(results) == 4 and all(e is None for _, e in out)
    finals = [r.get_response().parameters["triton_final_response"].bool_param for r in results]
    assert finals == [False, False, False, True]
    assert [r.as_numpy("y").tolist() for r in results[:3]] == [[[0]], [[2]], [[4]]]
    assert not results[3].get_response().outputs


# -- TensorFlow SavedModels ---------------------------------------------------------------------------


@pytest.mark.skipif(not tf_plugin_installed(), reason="the servekit_tensorflow plugin is not installed")
def test_infer_tensorflow_model(client):
    x = np.array([[1.0], [2.0], [5.0]], np.float32)  # the signature's shape is [-1, 1]
    result = client.infer(HALF_PLUS_TWO, [tensor("x", x, "FP32")], model_version="123")
    np.testing.assert_allclose(result.as_numpy("y"), [[2.5], [3.0], [4.5]])
    assert result.get_response().model_version == "123"
    assert client.is_model_ready(HALF_PLUS_TWO, "124")
