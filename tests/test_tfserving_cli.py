"""``tensorflow_model_server``'s command line, as TF Serving's own test suite drives the binary.

The fast tests parse flags and TF Serving's text-format config files.  The slow
ones start the ``tensorflow_model_server`` console script with the flags TF
Serving's ``RunServer`` passes (``--port``, ``--rest_api_port``,
``--rest_api_timeout_in_ms``, ``--grpc_socket_path``, then ``--model_name`` and
``--model_base_path`` or ``--model_config_file``, ``--enable_batching`` with
``--batching_parameters_file``, ``--monitoring_config_file``,
``--grpc_channel_arguments``), wait for it the way its ``WaitForServerReady``
does, and check the answers as its ``VerifyPredictRequest`` does: the output in
``float_val``, the effective model spec.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import TF_DATA
from servekit import tfserving_cli, tfserving_config
from servekit.settings import channel_arguments
from servekit.testing import free_port
from servekit.tfserving_cli import FlagError

HALF_PLUS_TWO = TF_DATA / "saved_model_half_plus_two_cpu"
TWO_VERSIONS = TF_DATA / "saved_model_half_plus_two_2_versions"
HALF_PLUS_THREE = TF_DATA / "saved_model_half_plus_three"


# -- flags and config files (no server) -------------------------------------------------------


def test_flags_parse_as_tensorflows_parser_does():
    flags = tfserving_cli.parse_flags(
        [
            "--port=8500",
            "--rest_api_port",
            "8501",
            "--enable_batching",
            "--model_name=m",
            "--enable_serialization_as_tensor_content=true",
            "--rest_api_timeout_in_ms=5000",
        ]
    )
    assert flags == {
        "port": 8500,
        "rest_api_port": 8501,
        "enable_batching": True,
        "model_name": "m",
        "enable_serialization_as_tensor_content": True,
        "rest_api_timeout_in_ms": 5000,
    }


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--no_such_flag=1"], "unknown flag --no_such_flag"),
        (["--port=eighty"], "--port: expected int"),
        (["--enable_batching=maybe"], "--enable_batching: expected true or false"),
        (["--xla_cpu_compilation_enabled=true"], "--xla_cpu_compilation_enabled=true is not supported"),
        (["--tensorflow_intra_op_parallelism=4"], "--tensorflow_intra_op_parallelism=4 is not supported"),
        (["models/"], "unexpected argument"),
    ],
)
def test_flags_servekit_cannot_honour_are_refused_by_name(argv, fragment):
    with pytest.raises(FlagError) as info:
        tfserving_cli.parse_flags(argv)
    assert fragment in str(info.value)


def test_a_flag_at_tf_servings_default_is_accepted():
    assert tfserving_cli.parse_flags(["--use_tflite_model=false", "--enable_model_warmup=true"]) == {
        "use_tflite_model": False,
        "enable_model_warmup": True,
    }


def test_flags_map_to_settings(tmp_path):
    batching = tmp_path / "batching.txt"
    batching.write_text(
        "max_batch_size { value: 128 }\nbatch_timeout_micros { value: 2500 }\n"
        "max_enqueued_batches { value: 1000000 }\nnum_batch_threads { value: 8 }\n"
    )
    flags = tfserving_cli.parse_flags(
        [
            "--port=9000",
            "--rest_api_port=9001",
            "--rest_api_timeout_in_ms=5000",
            f"--model_base_path={HALF_PLUS_TWO}",
            "--enable_batching",
            f"--batching_parameters_file={batching}",
            "--enable_serialization_as_tensor_content",
            "--grpc_channel_arguments=grpc.max_connection_age_ms=2000",
            "--file_system_poll_wait_seconds=3",
            "--grpc_socket_path=/tmp/x.sock",
        ]
    )
    settings, mirror = tfserving_cli.build(flags)
    assert mirror is None
    assert (settings.grpc_port, settings.http_port, settings.request_timeout) == (9000, 9001, 5.0)
    assert settings.paths == [str(HALF_PLUS_TWO)] and settings.model_name == "default"
    assert (settings.max_batch_size, settings.max_batch_time_ms) == (128, 2.5)
    assert settings.grpc_tensor_content and settings.poll_interval == 3.0
    assert channel_arguments(settings.grpc_channel_arguments) == [("grpc.max_connection_age_ms", 2000)]
    assert settings.grpc_socket_path == "/tmp/x.sock"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("model_config_list { config { name: 'a' base_path: '/x' model_platform: 'pytorch' } }", "model_platform"),
        ("model_config_list { config { name: 'a' base_path: '/x' logging_config {} } }", "logging_config"),
        (
            "model_config_list { config { name: 'a' base_path: '/x' } config { name: 'a' base_path: '/y' } }",
            "configured twice",
        ),
        ("model_config_list { config { nme: 'a' } }", "Error parsing text-format tensorflow.serving.ModelServerConfig"),
    ],
)
def test_model_config_file_errors_name_the_field(tmp_path, text, fragment):
    path = tmp_path / "models.config"
    path.write_text(text)
    with pytest.raises(FlagError) as info:
        tfserving_config.read_model_config_file(str(path))
    assert fragment in str(info.value)


def test_bad_model_config_exits_with_tf_servings_message(tmp_path, capsys):
    """TF Serving's testBadModelConfig: the parse error on stderr, an exit status, no traceback."""
    from servekit.tfserving_cli import main

    path = tmp_path / "bad_model_config.txt"
    path.write_text("improperly formatted file")
    assert main(["--port=8500", f"--model_config_file={path}"]) != 0
    err = capsys.readouterr().err
    assert "Error parsing text-format tensorflow.serving.ModelServerConfig" in err and "Traceback" not in err


def test_model_config_file_becomes_servekit_yaml(tmp_path):
    base = tmp_path / "base"
    shutil.copytree(TWO_VERSIONS, base)
    path = tmp_path / "models.config"
    path.write_text(f"""
model_config_list {{
  config {{
    name: "hp2"
    base_path: "{base}"
    model_platform: "tensorflow"
    model_version_policy {{ specific {{ versions: 123 versions: 124 }} }}
    version_labels {{ key: "stable" value: 123 }}
    version_labels {{ key: "canary" value: 124 }}
  }}
}}""")
    mirror = tfserving_config.Mirror(str(path))
    try:
        folder = Path(mirror.paths[0])
        assert folder.name == "hp2"
        assert sorted(p.name for p in folder.iterdir()) == ["00000123", "00000124", "servekit.yaml"]
        import yaml

        config = yaml.safe_load((folder / "servekit.yaml").read_text())
        assert config == {"version_policy": {"specific": [123, 124]}, "labels": {"stable": 123, "canary": 124}}
        shutil.rmtree(base / "00000123")  # a version removed on disk goes from the mirror too
        mirror.sync()
        assert sorted(p.name for p in folder.iterdir()) == ["00000124", "servekit.yaml"]
    finally:
        mirror.close()


def test_monitoring_path_other_than_tf_servings_is_refused(tmp_path):
    path = tmp_path / "monitoring.config"
    path.write_text('prometheus_config { enable: true, path: "/elsewhere" }')
    with pytest.raises(FlagError) as info:
        tfserving_config.check_monitoring_file(str(path))
    assert "/elsewhere" in str(info.value)


def test_unsupported_batching_fields_are_refused(tmp_path):
    path = tmp_path / "batching.txt"
    path.write_text("max_batch_size { value: 8 }\nallowed_batch_sizes: 8\n")
    with pytest.raises(FlagError) as info:
        tfserving_config.read_batching_file(str(path))
    assert "allowed_batch_sizes" in str(info.value)


def test_the_entry_point_exits_2_naming_the_flag(capsys):
    assert tfserving_cli.main(["--model_base_path=/x", "--platform_config_file=p.txt"]) == 2
    assert "--platform_config_file" in capsys.readouterr().err
    assert tfserving_cli.main(["--port=1"]) == 2
    assert "--model_config_file or --model_base_path" in capsys.readouterr().err


def test_servekit_tfserving_subcommand_takes_the_same_flags(capsys):
    from servekit import cli

    assert cli.main(["tfserving", "--version"]) == 0
    assert "TensorFlow ModelServer" in capsys.readouterr().out
    assert cli.main(["tfserving", "--bogus_flag=1"]) == 2
    assert "unknown flag --bogus_flag" in capsys.readouterr().err


def test_workers_starting_together_all_bind_the_grpc_socket_path(tmp_path):
    """--grpc_socket_path: every worker binds it (the last one answers), however their starts interleave."""
    import threading
    from concurrent import futures

    import grpc
    from servekit.protocols.grpc.server import _bind_unix_socket

    def worker(path: str, start: threading.Barrier, servers: list, failures: list) -> None:
        server = grpc.server(futures.ThreadPoolExecutor(1))
        servers.append(server)
        start.wait()
        try:
            _bind_unix_socket(server, path)
        except Exception as exc:
            failures.append(exc)

    for round_ in range(10):  # without a lock, about half the rounds saw "address already in use"
        path = str(tmp_path / f"tf-serving-{round_}.sock")
        start = threading.Barrier(8)
        servers: list = []
        failures: list[Exception] = []
        threads = [threading.Thread(target=worker, args=(path, start, servers, failures)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not failures, failures
    not_a_socket = tmp_path / "taken.txt"
    not_a_socket.write_text("keep me")
    with pytest.raises(RuntimeError, match="cannot bind gRPC to the Unix socket"):
        _bind_unix_socket(grpc.server(futures.ThreadPoolExecutor(1)), str(not_a_socket))
    assert not_a_socket.read_text() == "keep me"  # a file that is not a socket is never removed


# -- the binary, as TF Serving's test suite runs it --------------------------------------------------

tf = pytest.importorskip("tensorflow")
grpc = pytest.importorskip("grpc")
from tensorflow.core.framework import types_pb2
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc


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


def rest(url: str, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=30) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def single_model(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tfs_single")
    batching = tmp / "batching_config.txt"
    batching.write_text(
        "max_batch_size { value: 128 }\nbatch_timeout_micros { value: 0 }\n"
        "max_enqueued_batches { value: 1000000 }\nnum_batch_threads { value: 8 }\n"
    )
    monitoring = tmp / "monitoring_config.txt"
    monitoring.write_text('prometheus_config: {\n  enable: true,\n  path: "/monitoring/prometheus/metrics"\n}\n')
    server = TFServing(
        tmp,
        "--model_name=default",
        f"--model_base_path={HALF_PLUS_TWO}",
        "--enable_batching",
        f"--batching_parameters_file={batching}",
        f"--monitoring_config_file={monitoring}",
        "--grpc_channel_arguments=grpc.max_connection_age_ms=2000",
    )
    yield server
    server.stop()


@pytest.mark.slow
@pytest.mark.parametrize("output_filter", [True, False])
def test_predict_answers_in_float_val(single_model, output_filter):
    result = predict(f"localhost:{single_model.port}", output_filter=output_filter)
    assert "y" in result.outputs
    assert result.outputs["y"].dtype == types_pb2.DT_FLOAT
    assert len(result.outputs["y"].float_val) == 1 and result.outputs["y"].float_val[0] == 3.0
    assert not result.outputs["y"].tensor_content
    spec = result.model_spec
    assert (spec.name, spec.signature_name, spec.version.value) == ("default", "serving_default", 123)


@pytest.mark.slow
def test_predict_over_the_grpc_socket_path(single_model):
    result = predict(f"unix:{single_model.socket}", batch_input=True)
    assert list(result.outputs["y"].float_val) == [3.0]


@pytest.mark.slow
def test_rest_and_prometheus_metrics(single_model):
    base = f"http://localhost:{single_model.rest_port}"
    assert rest(f"{base}/v1/models/default:predict", {"instances": [[1.0], [2.0]]}) == {"predictions": [[2.5], [3.0]]}
    wanted = 'servekit_inference_rows_total{model="default",version="123"}'
    for _ in range(50):  # another worker may answer the scrape: each flushes its counts every half second
        with urllib.request.urlopen(f"{base}/monitoring/prometheus/metrics", timeout=10) as response:
            text = response.read().decode()
        if wanted in text:
            break
        time.sleep(0.1)
    assert wanted in text


@pytest.fixture(scope="module")
def config_file_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tfs_config")
    config = tmp / "good_model_config.conf"
    config.write_text(f"""
model_config_list: {{
  config: {{
    name: "half_plus_two",
    base_path: "{TWO_VERSIONS}",
    model_platform: "tensorflow",
    model_version_policy: {{ all: {{}} }},
    version_labels: {{ key: "stable" value: 123 }}
  }},
  config: {{
    name: "half_plus_three",
    base_path: "{HALF_PLUS_THREE}",
    model_platform: "tensorflow"
  }}
}}""")
    server = TFServing(
        tmp,
        f"--model_config_file={config}",
        "--model_config_file_poll_wait_seconds=1",
        "--enable_serialization_as_tensor_content",
    )
    yield server
    server.stop()


@pytest.mark.slow
def test_model_config_file_serves_each_model_with_its_policy_and_labels(config_file_server):
    address = f"localhost:{config_file_server.port}"
    three = predict(address, "half_plus_three")
    assert tf.make_ndarray(three.outputs["y"]).tolist() == [4.0]  # 0.5 * 2 + 3
    latest = predict(address, "half_plus_two")
    assert latest.model_spec.version.value == 124
    stable = predict(address, "half_plus_two", version_label="stable")
    assert stable.model_spec.version.value == 123
    assert predict(address, "half_plus_two", version=123).model_spec.version.value == 123


@pytest.mark.slow
def test_enable_serialization_as_tensor_content(config_file_server):
    result = predict(f"localhost:{config_file_server.port}", "half_plus_three")
    assert result.outputs["y"].tensor_content and not result.outputs["y"].float_val
