"""``tensorflow_model_server`` opens its ports only after the initial load: so must every worker.

TF Serving's test harness waits for the gRPC port (its ``WaitForServerReady``)
and then expects every model served.  Here a model that takes seconds to load is
served by two workers from a ``--model_config_file``, and clients probe both
ports from the moment the process starts, on fresh connections: a connection
refused is a port not open yet; any answer must be the model's prediction, never
"unknown model" or "still LOADING".  The REST wait for a loading model
(``--rest_api_timeout_in_ms``) is shorter than the load, so a worker that took
a connection before its load answered LOADING.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest
from servekit.testing import free_port

pytestmark = pytest.mark.slow  # starts servers

grpc = pytest.importorskip("grpc")
# TensorFlow's protos are imported where a request is made: importing them imports TensorFlow
# (seconds), and a parallel run collects every module in every worker
if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("TensorFlow is not installed", allow_module_level=True)
from tfserving_binary import binary

LOAD_SECONDS = 6
#: a worker holds a request for a model still loading this long before it answers LOADING
REST_TIMEOUT_MS = 2000
STARTS = 2
ANSWERS = 15  # per prober and start

SLOW_MODEL = f"""
import time
import servekit


@servekit.hookimpl
def load(path):
    time.sleep({LOAD_SECONDS})
    return "slow"


@servekit.hookimpl
def predict(inputs, parameters):
    if isinstance(inputs, dict):
        return {{k: v * 2 for k, v in inputs.items()}}
    return inputs * 2
"""

#: what a client sees of a port that is not open yet (a listener closed under a fresh connection reads as a reset)
NOT_OPEN = (ConnectionRefusedError, ConnectionResetError)


@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("slow_start")
    (tmp / "slow" / "1").mkdir(parents=True)
    (tmp / "slow" / "1" / "model.py").write_text(SLOW_MODEL)
    config = tmp / "models.conf"
    config.write_text(f'model_config_list: {{ config: {{ name: "slow", base_path: "{tmp / "slow"}" }} }}\n')
    return config


class Probe:
    """Clients on both ports from the first moment: what each answered, until each has enough answers."""

    def __init__(self, grpc_port: int, rest_port: int, deadline: float):
        self.grpc_port, self.rest_port, self.deadline = grpc_port, rest_port, deadline
        self.wrong: list[str] = []
        self.answers = {"grpc": 0, "rest": 0}
        self._lock = threading.Lock()

    def _done(self, kind: str) -> bool:
        return self.answers[kind] >= ANSWERS or time.monotonic() > self.deadline or len(self.wrong) > 5

    def _count(self, kind: str, wrong: str | None) -> None:
        with self._lock:
            if wrong:
                self.wrong.append(wrong)
            else:
                self.answers[kind] += 1

    def grpc(self) -> None:
        from tensorflow.core.framework import types_pb2
        from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

        request = predict_pb2.PredictRequest()
        request.model_spec.name = "slow"
        request.inputs["x"].dtype = types_pb2.DT_FLOAT
        request.inputs["x"].float_val.append(2.0)
        request.inputs["x"].tensor_shape.dim.add().size = 1
        while not self._done("grpc"):
            try:
                with grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}") as channel:
                    result = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, 30)
            except grpc.RpcError as error:
                if error.code() == grpc.StatusCode.UNAVAILABLE and "connect" in (error.details() or "").lower():
                    time.sleep(0.02)  # not open yet
                    continue
                self._count("grpc", f"gRPC {error.code().name}: {error.details()}")
                continue
            values = {key: list(tensor.float_val) for key, tensor in result.outputs.items()}
            self._count("grpc", None if list(values.values()) == [[4.0]] else f"gRPC answered {values}")

    def rest(self) -> None:
        body = json.dumps({"instances": [2.0]}).encode()
        url = f"http://127.0.0.1:{self.rest_port}/v1/models/slow:predict"
        while not self._done("rest"):
            try:
                with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=30) as answer:
                    got = json.loads(answer.read())
            except urllib.error.HTTPError as error:
                self._count("rest", f"REST {error.code}: {error.read()[:300]!r}")
                continue
            except urllib.error.URLError as error:
                if isinstance(error.reason, NOT_OPEN):
                    time.sleep(0.02)
                    continue
                raise
            except NOT_OPEN:
                time.sleep(0.02)
                continue
            self._count("rest", None if got == {"predictions": [4.0]} else f"REST answered {got}")


def _start_and_probe(config_file, log_path) -> Probe:
    port, rest_port = free_port(), free_port()
    command = [
        binary(),
        f"--port={port}",
        f"--rest_api_port={rest_port}",
        f"--rest_api_timeout_in_ms={REST_TIMEOUT_MS}",
        f"--model_config_file={config_file}",
    ]
    env = {**os.environ, "SERVEKIT_HOST": "127.0.0.1", "SERVEKIT_WORKERS": "2"}
    with log_path.open("w") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        probe = Probe(port, rest_port, time.monotonic() + 120)
        probers = [threading.Thread(target=f) for f in (probe.grpc, probe.rest, probe.grpc, probe.rest)]
        try:
            for prober in probers:
                prober.start()
            for prober in probers:
                prober.join()
        finally:
            server.terminate()
            server.wait(60)
    return probe


def test_no_worker_answers_before_its_models_are_loaded(config_file, tmp_path):
    for start in range(STARTS):
        probe = _start_and_probe(config_file, tmp_path / f"server-{start}.log")
        log = (tmp_path / f"server-{start}.log").read_text()[-3000:]
        assert probe.wrong == [], f"start {start}: {probe.wrong}\n{log}"
        assert min(probe.answers.values()) >= ANSWERS, (probe.answers, log)


def test_the_rest_port_is_closed_while_the_first_load_runs(config_file, tmp_path):
    """As tensorflow_model_server: nothing listens on either port until a worker has loaded."""
    port, rest_port = free_port(), free_port()
    command = [binary(), f"--port={port}", f"--rest_api_port={rest_port}", f"--model_config_file={config_file}"]
    env = {**os.environ, "SERVEKIT_HOST": "127.0.0.1", "SERVEKIT_WORKERS": "2"}
    with (tmp_path / "server.log").open("w") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            # the model has not loaded while its load's sleep runs: wait for the load to begin
            marker = "Booting worker"
            for _ in range(600):
                if marker in (tmp_path / "server.log").read_text():
                    break
                time.sleep(0.05)
            time.sleep(1.0)  # the workers are in their first load (LOAD_SECONDS long)
            for open_port in (rest_port, port):
                with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", open_port), 2):
                    pass
        finally:
            server.terminate()
            server.wait(60)
