"""The gRPC server itself: API key, message size limit, one server per gunicorn worker."""

from __future__ import annotations

import re
import time

import grpc
import numpy as np
import pytest
from grpc_support import ECHO_MODEL
from servekit.codecs import tensor_proto
from servekit.protocols.grpc.protos.inference import grpc_service_pb2 as v2
from servekit.protocols.grpc.protos.inference import grpc_service_pb2_grpc as v2_grpc
from servekit.protocols.grpc.protos.tensorflow_serving.apis import (
    predict_pb2,
    prediction_service_pb2_grpc,
)
from servekit.server.app import build_dataplane
from servekit.server.grpc_server import build_server
from servekit.server.settings import Settings
from servekit.testing import ServerProcess

pytestmark = pytest.mark.slow  # starts real servers or subprocesses


@pytest.fixture(scope="module")
def echo_repo(tmp_path_factory):
    base = tmp_path_factory.mktemp("grpc_echo")
    (base / "echo" / "1").mkdir(parents=True)
    (base / "echo" / "1" / "model.py").write_text(ECHO_MODEL)
    return base


@pytest.fixture(scope="module")
def dataplane(echo_repo):
    dp = build_dataplane(Settings(paths=[str(echo_repo)], poll_interval=0))
    dp.repository.load_now()
    yield dp
    dp.repository.stop()


def serve(dataplane, **settings):
    server, port = build_server(dataplane, Settings(host="127.0.0.1", grpc_port=0, **settings))
    return server, grpc.insecure_channel(f"127.0.0.1:{port}")


def infer_request(size: int = 4) -> v2.ModelInferRequest:
    request = v2.ModelInferRequest(model_name="echo")
    request.inputs.add(name="x", datatype="UINT8", shape=[size])
    request.raw_input_contents.append(bytes(size))
    return request


def predict_request() -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "echo"
    tensor_proto.from_numpy(np.arange(3), request.inputs["x"])
    return request


@pytest.fixture(scope="module")
def keyed(dataplane):
    server, channel = serve(dataplane, api_key="s3cret")
    yield channel
    channel.close()
    server.stop(None)


def code_of(call, *args, **kwargs) -> grpc.StatusCode:
    try:
        call(*args, timeout=30, **kwargs)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def test_api_key_leaves_health_open(keyed):
    stub = v2_grpc.GRPCInferenceServiceStub(keyed)
    assert stub.ServerLive(v2.ServerLiveRequest(), timeout=30).live
    assert stub.ServerReady(v2.ServerReadyRequest(), timeout=30).ready


@pytest.mark.parametrize("metadata", [None, [("authorization", "Bearer wrong")], [("authorization", "s3cret")]])
def test_api_key_refuses_inference_without_the_key(keyed, metadata):
    v2_stub = v2_grpc.GRPCInferenceServiceStub(keyed)
    tf_stub = prediction_service_pb2_grpc.PredictionServiceStub(keyed)
    assert code_of(v2_stub.ModelInfer, infer_request(), metadata=metadata) == grpc.StatusCode.UNAUTHENTICATED
    assert (
        code_of(v2_stub.ModelMetadata, v2.ModelMetadataRequest(name="echo"), metadata=metadata)
        == grpc.StatusCode.UNAUTHENTICATED
    )
    assert code_of(tf_stub.Predict, predict_request(), metadata=metadata) == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as info:
        list(tf_stub.PredictStreamed(iter([predict_request()]), metadata=metadata, timeout=30))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_api_key_lets_the_key_through(keyed):
    metadata = [("authorization", "Bearer s3cret")]
    v2_stub = v2_grpc.GRPCInferenceServiceStub(keyed)
    assert v2_stub.ModelInfer(infer_request(), metadata=metadata, timeout=30).raw_output_contents == [bytes(4)]
    tf_stub = prediction_service_pb2_grpc.PredictionServiceStub(keyed)
    (response,) = tf_stub.PredictStreamed(iter([predict_request()]), metadata=metadata, timeout=30)
    assert tensor_proto.to_numpy(response.outputs["x"]).tolist() == [0, 1, 2]


def test_message_size_limit(dataplane):
    server, channel = serve(dataplane, grpc_max_message_size=4096)
    try:
        stub = v2_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ModelInfer(infer_request(1000), timeout=30).raw_output_contents == [bytes(1000)]
        assert code_of(stub.ModelInfer, infer_request(8000)) == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        channel.close()
        server.stop(None)


def test_port_in_use_fails_loudly(dataplane):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match="cannot bind gRPC"):
            build_server(dataplane, Settings(host="127.0.0.1", grpc_port=port))


def test_every_worker_serves_grpc_on_the_shared_port(echo_repo):
    with ServerProcess(echo_repo, grpc_port="auto", workers=2, threads=2) as server:
        for _ in range(8):  # new connections, spread over the workers by the kernel
            with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
                stub = v2_grpc.GRPCInferenceServiceStub(channel)
                assert stub.ModelInfer(infer_request(), timeout=30).model_name == "echo"
        # readiness comes from whichever worker answered first: give the other its moment
        deadline = time.monotonic() + 30
        while True:
            listening = re.findall(r"gRPC listening on 127\.0\.0\.1:(\d+) \(worker (\d+)\)", server.output())
            if len({pid for _, pid in listening}) == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    assert len({pid for _, pid in listening}) == 2
    assert {int(port) for port, _ in listening} == {server.grpc_port}


def test_grpc_port_zero_disables_grpc(echo_repo):
    with ServerProcess(echo_repo, grpc_port=0, workers=1, threads=2) as server:
        assert "gRPC listening" not in server.output()
