"""Limits that hold however a request is framed: chunked bodies, slow bodies, declared shapes.

The WSGI layer is driven directly with streams that behave as a server's
(a chunked body, a body that trickles), and the codecs with requests whose
shapes promise far more than they carry: none may allocate for the promise.
"""

from __future__ import annotations

import io
import json
import threading
import time

import numpy as np
import pytest
from hardening_models import hardening_repo
from servekit.codecs import bounds, tensor_proto, v2, v2_grpc
from servekit.errors import PayloadTooLarge, RequestTimeout
from servekit.protocols.grpc.protos.inference import grpc_service_pb2 as pb
from servekit.server.limits import LimitsMiddleware
from servekit.server.watchdog import Readers, ReadTimedOut, Watchdog


def _echo(environ, start_response):
    body = environ["wsgi.input"].read()
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [str(len(body)).encode()]


class Counting(io.RawIOBase):
    """A chunked body of ``total`` bytes that counts what the server was made to read."""

    def __init__(self, total: int, delay: float = 0.0):
        self.total, self.delay, self.read_bytes = total, delay, 0

    def read(self, size: int = -1) -> bytes:
        if self.delay:
            time.sleep(self.delay)
        size = 65536 if size is None or size < 0 else size
        n = max(0, min(size, self.total - self.read_bytes, 1 if self.delay else size))
        self.read_bytes += n
        return b"x" * n


def _call(app, stream, **environ):
    env = {"REQUEST_METHOD": "POST", "PATH_INFO": "/v2/models/m/infer", "wsgi.input": stream}
    env.update(environ)
    seen = {}

    def start_response(status, headers, exc_info=None):
        seen["status"], seen["headers"] = status, dict(headers)

    data = b"".join(app(env, start_response))
    return int(seen["status"].split()[0]), data


def _middleware(**kw):
    return LimitsMiddleware(_echo, max_request_size=1000, request_timeout=0, max_inflight=4, max_queue=4, **kw)


def test_chunked_body_is_refused_once_it_passes_the_limit_without_reading_the_rest():
    stream = Counting(10_000_000)
    status, body = _call(_middleware(), stream, HTTP_TRANSFER_ENCODING="chunked")
    assert status == 413
    assert "limit of 1000 bytes" in json.loads(body)["error"]
    assert stream.read_bytes <= 1000 + 65536  # one read past the limit at most


def test_a_chunked_413_on_an_openai_route_takes_openais_error_shape():
    status, body = _call(
        _middleware(), Counting(10_000), HTTP_TRANSFER_ENCODING="chunked", PATH_INFO="/v1/chat/completions"
    )
    error = json.loads(body)["error"]
    assert status == 413 and error["code"] == 413 and error["type"] == "invalid_request_error"


def test_chunked_body_under_the_limit_reaches_the_app_whole():
    status, body = _call(_middleware(), Counting(999), HTTP_TRANSFER_ENCODING="chunked")
    assert (status, body) == (200, b"999")


def test_a_body_shorter_than_its_content_length_is_400():
    status, body = _call(_middleware(), Counting(10), CONTENT_LENGTH="500")
    assert status == 400
    assert "ended after 10 of its 500 bytes" in json.loads(body)["error"]


def test_a_trickling_body_is_408_after_the_body_timeout():
    stream = Counting(900, delay=0.05)
    status, body = _call(_middleware(body_timeout=0.3), stream, HTTP_TRANSFER_ENCODING="chunked")
    assert status == 408
    assert "--body-timeout" in json.loads(body)["error"]
    assert stream.read_bytes < 900


def test_the_watchdog_cuts_a_blocked_read_at_its_deadline():
    cut = threading.Event()
    dog = Watchdog()
    guard = dog.watch(0.05, cut.set)
    assert cut.wait(5)
    assert guard.fired
    with pytest.raises(RequestTimeout):
        guard.check()


def test_a_released_read_is_never_cut():
    cut = threading.Event()
    dog = Watchdog()
    dog.release(dog.watch(0.05, cut.set))
    later = dog.watch(0.1, lambda: None)
    while not later.fired:
        time.sleep(0.01)
    assert not cut.is_set()


def test_a_shorter_timeout_wakes_a_watchdog_asleep_on_a_longer_one():
    cut = threading.Event()
    dog = Watchdog()
    dog.watch(300, lambda: None)  # the thread now sleeps for up to 300 s
    dog.watch(0.05, cut.set)
    assert cut.wait(5)


def test_a_read_watched_after_the_queue_went_empty_is_still_cut():
    dog = Watchdog()
    dog.release(dog.watch(0.05, lambda: None))
    time.sleep(0.02)  # the thread finds nothing watched and sleeps for one timeout
    cut = threading.Event()
    dog.watch(0.05, cut.set)
    assert cut.wait(5)


def test_released_reads_leave_nothing_behind():
    dog = Watchdog()
    for _ in range(1000):
        dog.release(dog.watch(60, lambda: None))
    kept = dog.watch(60, lambda: None)
    assert dog.watched() == 1
    dog.release(kept)
    assert dog.watched() == 0


def test_body_readers_read_raise_and_give_up_at_the_deadline():
    readers = Readers(2)
    assert readers.read(io.BytesIO(b"abc"), 2, 5) == b"ab"

    class Broken:
        def read(self, size):
            raise ValueError("malformed chunk")

    with pytest.raises(ValueError, match="malformed chunk"):
        readers.read(Broken(), 10, 5)
    arrived = threading.Event()

    class Stalled:
        def read(self, size):
            arrived.wait(10)
            return b"late"

    with pytest.raises(ReadTimedOut):
        readers.read(Stalled(), 10, 0.05)
    assert readers.read(io.BytesIO(b"next"), 10, 5) == b"next"  # the second thread answers meanwhile
    arrived.set()


# -- declared shapes --------------------------------------------------------------------


@pytest.fixture
def default_bounds():
    """The limits a process has before any app sets its own (an app built earlier in this process may have)."""
    saved = bounds.max_elements, bounds.max_inputs
    bounds.configure(max_tensor_elements=64 * 1024 * 1024, max_request_size=0, max_request_inputs=1024)
    yield
    bounds.max_elements, bounds.max_inputs = saved


@pytest.fixture
def small_bounds():
    saved = bounds.max_elements, bounds.max_inputs
    bounds.configure(max_tensor_elements=0, max_request_size=1000, max_request_inputs=3)
    yield
    bounds.max_elements, bounds.max_inputs = saved


GIANT = [1, 1_000_000_000]


def test_v2_json_shape_past_the_limit_is_413_before_decoding(small_bounds):
    doc = {"inputs": [{"name": "x", "shape": GIANT, "datatype": "FP32", "data": [1.0]}]}
    with pytest.raises(PayloadTooLarge, match="--max-tensor-elements"):
        v2.decode_infer_request(json.dumps(doc).encode())


def test_v2_binary_bytes_shape_without_data_does_not_allocate(default_bounds):
    # the default bounds (64 Mi elements) let [2**26] through the count; the data must then fail first
    with pytest.raises(Exception, match="ends after 0"):
        v2.tensor_from_bytes("BYTES", [1 << 26], b"")


def test_too_many_inputs_is_413(small_bounds):
    doc = {"inputs": [{"name": f"x{i}", "shape": [1], "datatype": "FP32", "data": [1.0]} for i in range(4)]}
    with pytest.raises(PayloadTooLarge, match="--max-request-inputs"):
        v2.decode_infer_request(json.dumps(doc).encode())


def test_v2_grpc_giant_shape_is_413(small_bounds):
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype="FP32", shape=GIANT)
    with pytest.raises(PayloadTooLarge):
        v2_grpc.decode_infer_request(request)


def test_tf_fill_tensor_with_a_giant_shape_is_413(small_bounds):
    from servekit.protocols.grpc.protos.tensorflow.core.framework import tensor_pb2, types_pb2

    proto = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[1.0])
    for d in GIANT:
        proto.tensor_shape.dim.add(size=d)
    with pytest.raises(PayloadTooLarge):
        tensor_proto.to_numpy(proto)


def test_shapes_inside_the_limit_still_decode(small_bounds):
    doc = {"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    request = v2.decode_infer_request(json.dumps(doc).encode())
    assert np.asarray(request.inputs["x"]).shape == (2, 2)


# -- through the app -------------------------------------------------------------------


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return hardening_repo(tmp_path_factory.mktemp("security"))


def test_the_app_answers_a_giant_declared_shape_413_in_v2s_shape(servekit_app, repo):
    client = servekit_app(repo, max_request_size=10_000, request_log_url="off")
    doc = {"inputs": [{"name": "x", "shape": GIANT, "datatype": "FP32", "data": [1.0]}]}
    r = client.post("/v2/models/linear/infer", json=doc)
    assert r.status_code == 413
    assert "--max-tensor-elements" in r.get_json()["error"]


# -- gunicorn: a request is gathered in the poller before a thread is given ---------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n", (False, False)),  # headers still coming
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", (True, True)),
        (b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\n12345", (False, True)),  # body still coming
        (b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\n1234567890", (True, True)),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", (False, True)),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", (True, True)),
        (b"POST / HTTP/1.1\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\n", (True, True)),
        (b"POST / HTTP/1.1\r\nContent-Length: nope\r\n\r\n", (True, True)),  # gunicorn answers 400
    ],
)
def test_when_a_request_is_ready_for_a_thread(data, expected):
    from servekit.server.slow_clients import _complete

    assert _complete(bytearray(data)) == expected
