"""``tensorflow_model_server`` (servekit's console script) started with flags, as TF Serving's own tests run it.

TensorFlow's protos (importing them imports TensorFlow, seconds) are imported where a request is
made, not when a test module is collected.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from servekit.testing import free_port


def binary() -> str:
    found = Path(sys.executable).parent / "tensorflow_model_server"
    if not found.exists():
        pytest.skip("the tensorflow_model_server console script is not installed (pip install -e .)")
    return str(found)


class TFServing:
    """``tensorflow_model_server`` started with flags, as TF Serving's RunServer does."""

    def __init__(self, tmp_path: Path, *flags: str):
        self.port, self.rest_port = free_port(), free_port()
        self.socket = tmp_path / "tf-serving.sock"
        self.log = (tmp_path / "server.log").open("w+")
        command = [
            binary(),
            f"--port={self.port}",
            f"--rest_api_port={self.rest_port}",
            "--rest_api_timeout_in_ms=5000",
            f"--grpc_socket_path={self.socket}",
            *flags,
        ]
        env = {**os.environ, "SERVEKIT_HOST": "127.0.0.1"}  # tensorflow_model_server binds every address
        self.proc = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.wait_ready()

    def wait_ready(self, attempts: int = 240) -> None:
        """TF Serving's WaitForServerReady: a Predict to a missing model until 'Servable' answers."""
        from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

        request = predict_pb2.PredictRequest()
        request.model_spec.name = "intentionally_missing_model"
        for _ in range(attempts):
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"exited {self.proc.returncode}:\n{self.log.read()[-5000:]}")
            try:
                with grpc.insecure_channel(f"localhost:{self.port}") as channel:
                    prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, 5.0)
            except grpc.RpcError as error:
                if "Servable" in (error.details() or ""):
                    return self._wait_models()
            time.sleep(0.5)
        raise TimeoutError("tensorflow_model_server did not get ready")

    def _wait_models(self) -> None:
        for _ in range(240):
            try:
                with urllib.request.urlopen(f"http://localhost:{self.rest_port}/v2/health/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def predict(address: str, model: str = "default", batch_input: bool = False, output_filter: bool = True, **spec):
    """TF Serving's VerifyPredictRequest: x = [2.0] as float_val."""
    from tensorflow.core.framework import types_pb2
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = "serving_default"
    for key, value in spec.items():
        if key == "version":
            request.model_spec.version.value = value
        else:
            setattr(request.model_spec, key, value)
    request.inputs["x"].dtype = types_pb2.DT_FLOAT
    request.inputs["x"].float_val.append(2.0)
    request.inputs["x"].tensor_shape.dim.add().size = 1
    if batch_input:
        request.inputs["x"].tensor_shape.dim.add().size = 1
    if output_filter:
        request.output_filter.append("y")
    with grpc.insecure_channel(address) as channel:
        return prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, 30.0)
