"""How RPCs reach the servicers: handlers prepared once per method, the lean pool, --grpc-threads."""

from __future__ import annotations

import argparse
import threading
import time
from concurrent import futures

import grpc
import numpy as np
import pytest
from grpc_support import ECHO_MODEL
from servekit.protocols.grpc import dispatch
from servekit.protocols.grpc.protos.inference import grpc_service_pb2 as v2
from servekit.protocols.grpc.protos.inference import grpc_service_pb2_grpc as v2_grpc
from servekit.protocols.grpc.protos.tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
from servekit.server import settings as settings_module
from servekit.server.app import build_dataplane
from servekit.server.grpc_server import add_services, build_server
from servekit.server.settings import Settings

# -- the pool ------------------------------------------------------------------------------


def test_lean_pool_runs_each_call_once_and_then_its_callbacks():
    pool = dispatch.LeanPool(3)
    ran: list[int] = []
    done = threading.Event()
    seen: list[object] = []
    try:
        calls = [pool.submit(ran.append, i) for i in range(50)]
        last = pool.submit(done.set)
        assert done.wait(10)
        last.add_done_callback(seen.append)  # after the call finished: runs at once
        assert seen == [last]
        for call in calls:
            finished = threading.Event()
            call.add_done_callback(lambda _call, f=finished: f.set())
            assert finished.wait(10)
        assert sorted(ran) == list(range(50))
        assert len(pool.workers) <= 3
    finally:
        pool.shutdown()
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(print)


def test_lean_pool_never_runs_more_calls_at_once_than_its_threads():
    pool = dispatch.LeanPool(2)
    lock, running, most = threading.Lock(), [0], [0]
    release = threading.Event()

    def call() -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        release.wait(10)
        with lock:
            running[0] -= 1

    try:
        calls = [pool.submit(call) for _ in range(6)]
        threading.Timer(0.3, release.set).start()
        finished = [threading.Event() for _ in calls]
        for call_, event in zip(calls, finished, strict=True):
            call_.add_done_callback(lambda _c, e=event: e.set())
        assert all(event.wait(10) for event in finished)
        assert most[0] == 2
    finally:
        pool.shutdown()


def test_a_failing_call_keeps_its_thread_and_still_finishes():
    pool = dispatch.LeanPool(1)
    try:
        failed = pool.submit(lambda: 1 / 0)
        finished = threading.Event()
        failed.add_done_callback(lambda _c: finished.set())
        assert finished.wait(10)
        after = threading.Event()
        pool.submit(after.set)
        assert after.wait(10)
    finally:
        pool.shutdown()


def test_lean_pool_is_a_thread_pool_executor_for_grpc():
    assert isinstance(dispatch.LeanPool(1), futures.ThreadPoolExecutor)


# -- a unary call's message, read before the pool gets the call --------------------------------


class CountingPool(dispatch.LeanPool):
    """The lean pool, counting the calls that came with their message already read."""

    def __init__(self, max_workers: int):
        super().__init__(max_workers)
        self.prefetched = 0

    def submit(self, fn, /, *args, **kwargs):
        self.prefetched += dispatch.UnaryReceive.applies(args)
        return super().submit(fn, *args, **kwargs)


@pytest.fixture
def echo_server():
    """A real gRPC server on the lean pool: ``/test.Echo/Unary`` answers its request, ``Slow`` after 0.5 s."""

    def slow(request: bytes, context) -> bytes:
        time.sleep(0.5)
        return request

    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(lambda request, context: request),
        "Slow": grpc.unary_unary_rpc_method_handler(slow),
        "Stream": grpc.unary_stream_rpc_method_handler(lambda request, context: iter([request, request])),
    }
    pool = CountingPool(2)
    server = grpc.server(pool)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Echo", handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield channel, pool
    finally:
        channel.close()
        server.stop(None)


def test_this_grpcio_takes_the_one_wake_path():
    """The grpcio the suite runs on has the internals; an upgrade that changes them shows here."""
    assert dispatch.UnaryReceive.ENABLED


def test_unary_calls_come_to_the_pool_with_their_message(echo_server):
    channel, pool = echo_server
    unary = channel.unary_unary("/test.Echo/Unary")
    with futures.ThreadPoolExecutor(8) as clients:
        answers = list(clients.map(lambda i: unary(str(i).encode(), timeout=30), range(100)))
    assert answers == [str(i).encode() for i in range(100)]
    assert pool.prefetched == 100
    stream = channel.unary_stream("/test.Echo/Stream")
    assert list(stream(b"x", timeout=30)) == [b"x", b"x"]  # a response stream: gRPC's own path
    assert pool.prefetched == 100


def test_a_unary_call_without_a_message_is_refused(echo_server):
    """A client that half-closes without sending a message: UNIMPLEMENTED, as gRPC's own path answers."""
    channel, _pool = echo_server
    nothing = channel.stream_unary("/test.Echo/Unary")
    with pytest.raises(grpc.RpcError) as info:
        nothing(iter(()), timeout=30)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "requires exactly one request message" in info.value.details()
    assert channel.unary_unary("/test.Echo/Unary")(b"after", timeout=30) == b"after"


def test_a_call_past_its_deadline_frees_the_server(echo_server):
    channel, pool = echo_server
    slow = channel.unary_unary("/test.Echo/Slow")
    with pytest.raises(grpc.RpcError) as info:
        slow(b"late", timeout=0.1)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    cancelled = slow.future(b"gone", timeout=30)
    deadline = time.monotonic() + 10
    while pool.prefetched < 2 and time.monotonic() < deadline:  # the server took the call in
        time.sleep(0.01)
    cancelled.cancel()
    unary = channel.unary_unary("/test.Echo/Unary")
    assert [unary(b"%d" % i, timeout=30) for i in range(5)] == [b"%d" % i for i in range(5)]
    assert pool.prefetched == 7


# -- the method table -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dataplane(tmp_path_factory):
    base = tmp_path_factory.mktemp("dispatch")
    (base / "echo" / "1").mkdir(parents=True)
    (base / "echo" / "1" / "model.py").write_text(ECHO_MODEL)
    dp = build_dataplane(Settings(paths=[str(base)], poll_interval=0))
    dp.repository.load_now()
    yield dp
    dp.repository.stop()


def test_method_table_holds_every_rpc_of_both_services(dataplane):
    table = dispatch.MethodTable()
    add_services(table, dataplane, Settings(), None)
    assert {"inference.GRPCInferenceService", "tensorflow.serving.PredictionService"} <= set(table.services)
    assert "ModelInfer" in table.services["inference.GRPCInferenceService"]
    assert "Predict" in table.services["tensorflow.serving.PredictionService"]
    decoded = table.decoded()
    for service, handlers in decoded.items():
        assert handlers.keys() == table.services[service].keys()
        for handler in handlers.values():
            assert handler.request_deserializer is None  # the handler parses: a bad message is the client's error


def test_grpc_threads_defaults_to_threads():
    def parse(argv: list[str]) -> Settings:
        parser = argparse.ArgumentParser()
        settings_module.add_arguments(parser)
        return settings_module.resolve(parser.parse_args(argv), {})

    assert parse(["m"]).grpc_threads == 0
    assert parse(["m", "--grpc-threads", "3"]).grpc_threads == 3


# -- end to end -------------------------------------------------------------------------------


@pytest.mark.slow
def test_concurrent_calls_each_get_their_own_answer(dataplane):
    """Many calls at once through two threads: every answer is its own request's, on both services."""
    server, port = build_server(dataplane, Settings(host="127.0.0.1", grpc_port=0, grpc_threads=2))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            v2_stub = v2_grpc.GRPCInferenceServiceStub(channel)
            tf_stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)

            def v2_call(i: int) -> bool:
                request = v2.ModelInferRequest(model_name="echo", id=str(i))
                request.inputs.add(name="x", datatype="FP32", shape=[3])
                request.raw_input_contents.append(np.full(3, i, dtype="<f4").tobytes())
                response = v2_stub.ModelInfer(request, timeout=30)
                values = np.frombuffer(response.raw_output_contents[0], dtype="<f4")
                return response.id == str(i) and values.tolist() == [float(i)] * 3

            def tf_call(i: int) -> bool:
                request = predict_pb2.PredictRequest()
                request.model_spec.name = "echo"
                tensor = request.inputs["x"]
                tensor.dtype = 1  # DT_FLOAT
                tensor.tensor_shape.dim.add().size = 2
                tensor.tensor_content = np.full(2, i, dtype="<f4").tobytes()
                response = tf_stub.Predict(request, timeout=30)
                out = response.outputs["x"]
                return list(out.float_val) == [float(i)] * 2 or out.tensor_content == tensor.tensor_content

            with futures.ThreadPoolExecutor(16) as clients:
                results = list(clients.map(v2_call, range(200))) + list(clients.map(tf_call, range(200)))
            assert all(results)
            garbage = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
            with pytest.raises(grpc.RpcError) as info:
                garbage(b"\xff\xff\xff", timeout=30)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "not a valid message" in info.value.details()
    finally:
        server.stop(None)


@pytest.mark.slow
def test_max_connection_age_makes_a_client_reconnect_without_failing_a_call(dataplane):
    """--grpc-channel-arguments reaches the server: with a connection age the server sends
    GOAWAY and the client's channel connects again (so it may land on another worker),
    while every call on it still succeeds."""
    arguments = "grpc.max_connection_age_ms=300,grpc.max_connection_age_grace_ms=5000"
    server, port = build_server(
        dataplane, Settings(host="127.0.0.1", grpc_port=0, grpc_threads=2, grpc_channel_arguments=arguments)
    )
    states: list[grpc.ChannelConnectivity] = []
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            channel.subscribe(states.append, try_to_connect=True)
            stub = v2_grpc.GRPCInferenceServiceStub(channel)
            request = v2.ModelInferRequest(model_name="echo")
            request.inputs.add(name="x", datatype="FP32", shape=[1])
            request.raw_input_contents.append(np.ones(1, dtype="<f4").tobytes())
            deadline = time.monotonic() + 1.5
            calls = 0
            while time.monotonic() < deadline:
                stub.ModelInfer(request, timeout=30)
                calls += 1
    finally:
        server.stop(None)
    assert calls > 10
    assert states.count(grpc.ChannelConnectivity.READY) >= 2, states
