"""OpenTelemetry traces: spans of each stage in memory, and one real OTLP/HTTP export through a model host."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from servekit.observability import tracing
from servekit.observability.logging import JsonFormatter, RequestIdFilter

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"

MODEL = """
import time

import numpy as np
import servekit
from servekit.types import ModelMetadata, Signature, TensorSpec


@servekit.hookimpl
def load(path):
    return "double"


@servekit.hookimpl
def metadata(model):
    return ModelMetadata(signatures={"serving_default": Signature(inputs=[TensorSpec("x", "FP32", [-1])])})


@servekit.hookimpl
def predict(inputs, parameters):
    x = inputs["x"] if isinstance(inputs, dict) else inputs
    if parameters.get("stream"):
        return _items(x, parameters["mark"])
    return x * 2


def _items(x, mark):
    for i in range(3):
        time.sleep(0.01)
        yield x * i
    with open(mark, "w") as f:  # when the last item was made, for the test to compare
        f.write(str(time.time_ns()))
"""
V2_BODY = {"inputs": [{"name": "x", "shape": [3], "datatype": "FP32", "data": [1.0, 2.0, 3.0]}]}


def model_repo(folder: Path, config: str = "") -> Path:
    (folder / "double" / "1").mkdir(parents=True)
    (folder / "double" / "1" / "model.py").write_text(MODEL)
    if config:
        (folder / "double" / "servekit.yaml").write_text(config)
    return folder


def test_traces_are_wanted_only_when_the_otel_variables_say_so():
    assert not tracing.wanted({})
    assert not tracing.wanted({"OTEL_SERVICE_NAME": "x"})  # naming the service asks for nothing
    assert tracing.wanted({"OTEL_TRACES_EXPORTER": "otlp"})
    assert tracing.wanted({"OTEL_TRACES_EXPORTER": "console,none"})
    assert not tracing.wanted({"OTEL_TRACES_EXPORTER": "none"})
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    assert not tracing.wanted({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"})


def test_off_no_opentelemetry_module_is_even_imported(tmp_path):
    # a fresh interpreter serves a request with tracing off: the SDK never loads
    code = f"""
import sys
from servekit.server.app import create_app
from servekit.server.settings import Settings
app = create_app(Settings(paths=[{str(model_repo(tmp_path))!r}], poll_interval=0), start=False)
app.extensions["servekit"].repository.load_now()
r = app.test_client().post("/v2/models/double/infer", json={V2_BODY!r}, headers={{"traceparent": {TRACEPARENT!r}}})
assert r.status_code == 200, r.data
from servekit.observability import tracing
print(tracing.ON, sorted(m for m in sys.modules if m.startswith("opentelemetry")))
"""
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[0] == "False []"


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    tracing.configure([exporter], simple=True)
    yield exporter
    tracing.shutdown()
    tracing.ON = False


def by_name(exporter: InMemorySpanExporter) -> dict:
    return {s.name: s for s in exporter.get_finished_spans()}


def test_a_v2_request_continues_the_callers_trace_with_a_span_per_stage(servekit_app, tmp_path, spans):
    client = servekit_app(model_repo(tmp_path), request_log_url=f"sqlite:///{tmp_path / 'logs.db'}")
    r = client.post("/v2/models/double/infer", json=V2_BODY, headers={"traceparent": TRACEPARENT})
    assert r.status_code == 200
    found = by_name(spans)
    server = found["POST /v2/models/{name}/infer"]
    assert format(server.context.trace_id, "032x") == TRACE_ID
    assert format(server.parent.span_id, "016x") == PARENT_ID and server.parent.is_remote
    assert server.kind.name == "SERVER" and server.attributes["http.response.status_code"] == 200
    assert server.attributes["servekit.request_id"] == r.headers["X-Request-Id"]
    for child in ("servekit.decode", "servekit.predict", "servekit.encode"):
        assert found[child].parent.span_id == server.context.span_id, child
        assert server.start_time <= found[child].start_time <= found[child].end_time <= server.end_time
    predict = found["servekit.predict"].attributes
    assert (predict["servekit.model"], predict["servekit.model_version"], predict["servekit.rows"]) == (
        "double",
        "1",
        3,
    )
    assert predict["servekit.batch_size"] == 3 and predict["servekit.device"] == "auto"
    # the request log keeps the trace id beside the request id
    logged = client.get(f"/v1/logs/requests/{r.headers['X-Request-Log-Id']}").get_json()
    assert logged["traceId"] == TRACE_ID and logged["requestId"] == r.headers["X-Request-Id"]


def test_the_batch_wait_is_a_span_holding_the_model_call(servekit_app, tmp_path, spans):
    client = servekit_app(model_repo(tmp_path, "batching: {max_batch_size: 8, max_batch_time_ms: 20}\n"))
    assert client.post("/v2/models/double/infer", json=V2_BODY).status_code == 200
    found = by_name(spans)
    queue, predict = found["servekit.queue"], found["servekit.predict"]
    assert predict.parent.span_id == queue.context.span_id
    assert queue.parent.span_id == found["POST /v2/models/{name}/infer"].context.span_id
    assert queue.start_time <= predict.start_time <= predict.end_time <= queue.end_time
    assert format(queue.context.trace_id, "032x") != TRACE_ID  # no traceparent: a trace of its own


def test_a_streamed_answer_ends_its_span_with_the_stream(servekit_app, tmp_path, spans):
    client = servekit_app(model_repo(tmp_path))
    mark = tmp_path / "last-item"
    body = {"instances": [1.0, 2.0], "parameters": {"stream": True, "mark": str(mark)}}
    r = client.post("/v1/models/double:predict?stream=true", json=body)
    assert r.status_code == 200 and r.data.count(b"data:") >= 3
    found = by_name(spans)
    server = found["POST /v1/models/{name}:predict"]
    assert server.end_time >= int(mark.read_text())  # ended after the model's last item, not at the first byte
    assert found["servekit.encode"].parent.span_id == server.context.span_id


def test_log_lines_carry_the_trace_id_beside_the_request_id(servekit_app, tmp_path, spans, caplog):
    client = servekit_app(model_repo(tmp_path), access_log=True)
    handler = logging.Handler()
    lines: list[str] = []
    handler.emit = lambda record: lines.append(JsonFormatter().format(record))  # type: ignore[method-assign]
    handler.addFilter(RequestIdFilter())
    access = logging.getLogger("servekit.access")
    access.addHandler(handler)
    access.setLevel(logging.INFO)
    try:
        r = client.post("/v2/models/double/infer", json=V2_BODY, headers={"traceparent": TRACEPARENT})
    finally:
        access.removeHandler(handler)
    entry = json.loads(lines[-1])
    assert entry["trace_id"] == TRACE_ID and entry["request_id"] == r.headers["X-Request-Id"]


# -- one real OTLP/HTTP export, through a model host --------------------------------------------


class Receiver(ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver on loopback: POST /v1/traces, protobuf ExportTraceServiceRequest."""

    def __init__(self) -> None:
        self.spans: list[dict] = []
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        body = self.rfile.read(int(self.headers["Content-Length"]))
        assert self.path == "/v1/traces" and self.headers["Content-Type"] == "application/x-protobuf"
        request = ExportTraceServiceRequest.FromString(body)
        with self.server.lock:
            for resource in request.resource_spans:
                service = {a.key: a.value.string_value for a in resource.resource.attributes}["service.name"]
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        attributes = {}
                        for a in span.attributes:
                            kind = a.value.WhichOneof("value")
                            attributes[a.key] = getattr(a.value, kind)
                        self.server.spans.append(
                            {
                                "service": service,
                                "name": span.name,
                                "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(),
                                "parent": span.parent_span_id.hex(),
                                "kind": span.kind,
                                "attributes": attributes,
                            }
                        )
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args) -> None:
        pass


def _wait_for(receiver: Receiver, trace_id: str, names: set[str], timeout: float = 30) -> dict[str, dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with receiver.lock:
            found = {s["name"]: s for s in receiver.spans if s["trace_id"] == trace_id}
        if names <= set(found):
            return found
        time.sleep(0.1)
    raise AssertionError(f"spans of {trace_id}: {sorted(found)}; expected {sorted(names)}")


@pytest.mark.slow
def test_one_v2_request_through_a_model_host_exported_over_otlp_http(tmp_path):
    import numpy as np
    import tritonclient.grpc as grpcclient
    from servekit.testing import ServerProcess

    receiver = Receiver()
    env = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_SERVICE_NAME": "servekit-under-test",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    repo = model_repo(tmp_path, "placement: process\nbatching: {max_batch_size: 8, max_batch_time_ms: 2}\n")
    try:
        with ServerProcess(repo, workers=2, grpc_port="auto", env=env) as server:
            r = requests.post(
                server.url + "/v2/models/double/infer", json=V2_BODY, headers={"traceparent": TRACEPARENT}
            )
            assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [2.0, 4.0, 6.0]
            http = _wait_for(
                receiver,
                TRACE_ID,
                {
                    "POST /v2/models/{name}/infer",
                    "servekit.decode",
                    "servekit.host",
                    "servekit.host.serve",
                    "servekit.predict",
                    "servekit.encode",
                },
            )
            # gRPC: the traceparent travels in the metadata
            grpc_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
            x = grpcclient.InferInput("x", [3], "FP32")
            x.set_data_from_numpy(np.array([1.0, 2.0, 3.0], dtype=np.float32))
            answer = client.infer("double", [x], headers={"traceparent": f"00-{grpc_trace}-00f067aa0ba902b7-01"})
            assert answer.as_numpy("output_0").tolist() == [2.0, 4.0, 6.0]
            grpc = _wait_for(
                receiver,
                grpc_trace,
                {
                    "inference.GRPCInferenceService/ModelInfer",
                    "servekit.decode",
                    "servekit.host",
                    "servekit.host.serve",
                    "servekit.predict",
                    "servekit.encode",
                },
            )
    finally:
        receiver.shutdown()
    for found, root_name, caller in (
        (http, "POST /v2/models/{name}/infer", PARENT_ID),
        (grpc, "inference.GRPCInferenceService/ModelInfer", "00f067aa0ba902b7"),
    ):
        root = found[root_name]
        assert root["parent"] == caller and root["service"] == "servekit-under-test"
        assert found["servekit.decode"]["parent"] == root["span_id"]
        assert found["servekit.encode"]["parent"] == root["span_id"]
        # worker -> model host: a CLIENT span in the worker, the host's SERVER span under it, in another process
        hosted = found["servekit.host"]
        assert hosted["parent"] == root["span_id"] and hosted["kind"] == 3  # SPAN_KIND_CLIENT
        serve = found["servekit.host.serve"]
        assert serve["parent"] == hosted["span_id"] and serve["kind"] == 2  # SPAN_KIND_SERVER
        assert serve["attributes"]["servekit.host.pid"] > 0
        # the model call, in the host, with what it ran
        predict = found["servekit.predict"]
        assert predict["parent"] == serve["span_id"]
        assert predict["attributes"]["servekit.model"] == "double"
        assert predict["attributes"]["servekit.model_version"] == "1"
        assert predict["attributes"]["servekit.rows"] == 3 and predict["attributes"]["servekit.batch_size"] == 3
        assert predict["attributes"]["servekit.device"] == "auto"
