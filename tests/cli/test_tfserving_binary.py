"""``tensorflow_model_server`` the binary, as TF Serving's own test suite drives it.

These start the ``tensorflow_model_server`` console script with the flags TF
Serving's ``RunServer`` passes (``--port``, ``--rest_api_port``,
``--rest_api_timeout_in_ms``, ``--grpc_socket_path``, then ``--model_name`` and
``--model_base_path`` or ``--model_config_file``, ``--enable_batching`` with
``--batching_parameters_file``, ``--monitoring_config_file``,
``--grpc_channel_arguments``), wait for it the way its ``WaitForServerReady``
does, and check the answers as its ``VerifyPredictRequest`` does: the output in
``float_val``, the effective model spec.  The flags and config files alone are
``test_tfserving_cli.py``'s.
"""

from __future__ import annotations

import importlib.util
import json
import time
import urllib.request

import pytest
from repo_paths import TF_DATA

pytestmark = pytest.mark.slow

HALF_PLUS_TWO = TF_DATA / "saved_model_half_plus_two_cpu"
TWO_VERSIONS = TF_DATA / "saved_model_half_plus_two_2_versions"
HALF_PLUS_THREE = TF_DATA / "saved_model_half_plus_three"


# TensorFlow is imported by the tests that use it, not when the module is collected (seconds, in
# every worker of a parallel run)
if importlib.util.find_spec("tensorflow") is None or importlib.util.find_spec("grpc") is None:
    pytest.skip("TensorFlow and grpcio are needed", allow_module_level=True)
from tfserving_binary import TFServing, predict


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


@pytest.mark.parametrize("output_filter", [True, False])
def test_predict_answers_in_float_val(single_model, output_filter):
    result = predict(f"localhost:{single_model.port}", output_filter=output_filter)
    assert "y" in result.outputs
    from tensorflow.core.framework import types_pb2

    assert result.outputs["y"].dtype == types_pb2.DT_FLOAT
    assert len(result.outputs["y"].float_val) == 1 and result.outputs["y"].float_val[0] == 3.0
    assert not result.outputs["y"].tensor_content
    spec = result.model_spec
    assert (spec.name, spec.signature_name, spec.version.value) == ("default", "serving_default", 123)


def test_predict_over_the_grpc_socket_path(single_model):
    result = predict(f"unix:{single_model.socket}", batch_input=True)
    assert list(result.outputs["y"].float_val) == [3.0]


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


def test_model_config_file_serves_each_model_with_its_policy_and_labels(config_file_server):
    address = f"localhost:{config_file_server.port}"
    three = predict(address, "half_plus_three")
    import tensorflow as tf

    assert tf.make_ndarray(three.outputs["y"]).tolist() == [4.0]  # 0.5 * 2 + 3
    latest = predict(address, "half_plus_two")
    assert latest.model_spec.version.value == 124
    stable = predict(address, "half_plus_two", version_label="stable")
    assert stable.model_spec.version.value == 123
    assert predict(address, "half_plus_two", version=123).model_spec.version.value == 123


def test_enable_serialization_as_tensor_content(config_file_server):
    result = predict(f"localhost:{config_file_server.port}", "half_plus_three")
    assert result.outputs["y"].tensor_content and not result.outputs["y"].float_val
