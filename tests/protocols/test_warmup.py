"""Warm-up: a version is AVAILABLE only after its sample requests answered."""

from __future__ import annotations

import shutil
import struct
import threading
import time

import pytest
import requests
from servekit.control.triton_load_config import settings_for
from servekit.protocols.warmup import tf_records
from servekit.testing import ServerProcess
from sklearn_models import SLOW_WARMUP, fit_iris, write_config


def test_a_version_serves_after_its_warmup_and_a_failing_one_is_end_with_the_reason(tmp_path, servekit_app):
    fit_iris(tmp_path / "good", 1)
    write_config(tmp_path / "good", warmup=[{"v1": {"instances": [[5.1, 3.5, 1.4, 0.2]]}, "count": 2}])
    fit_iris(tmp_path / "bad", 1)
    write_config(
        tmp_path / "bad", warmup=[{"v2": {"inputs": [{"name": "nope", "shape": [1], "datatype": "FP64", "data": [1]}]}}]
    )
    client = servekit_app(tmp_path, strict_readiness=False)
    assert client.get("/v2/models/good/ready").status_code == 200
    status = client.get("/v1/models/bad").get_json()["model_version_status"][0]
    assert status["state"] == "END"
    assert "warm-up request 1 (v2, run 1) failed" in status["status"]["error_message"]
    assert client.get("/v2/models/bad/ready").status_code != 200


def test_warmup_items_are_checked_when_the_config_is_read(tmp_path, servekit_app):
    fit_iris(tmp_path / "odd", 1)
    write_config(tmp_path / "odd", warmup=[{"v3": {}}])
    client = servekit_app(tmp_path, strict_readiness=False)
    status = client.get("/v1/models/odd").get_json()["model_version_status"][0]
    assert "warmup item 0 must hold one of v1" in status["status"]["error_message"]


def test_tf_serving_warmup_file_records_are_read(tmp_path):
    path = tmp_path / "tf_serving_warmup_requests"
    records = [b"first", b"second record"]
    with path.open("wb") as handle:
        for data in records:  # TFRecord framing; servekit does not check the CRCs
            handle.write(struct.pack("<Q", len(data)) + b"\0" * 4 + data + b"\0" * 4)
    assert list(tf_records(path)) == records
    path.write_bytes(path.read_bytes()[:-6])
    with pytest.raises(RuntimeError, match="truncated"):
        list(tf_records(path))


def test_triton_model_warmup_becomes_v2_requests():
    settings = settings_for(
        "m",
        '{"max_batch_size": 4, "model_warmup": [{"name": "zeros", "batch_size": 2, "count": 3,'
        ' "inputs": {"x": {"data_type": "TYPE_FP32", "dims": [3], "zero_data": true}}}]}',
    )
    assert settings["warmup"] == [
        {"v2": {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 3], "data": [0] * 6}]}, "count": 3}
    ]


@pytest.mark.slow
def test_a_version_swap_with_a_slow_warmup_fails_no_request(tmp_path):
    """64 connections on version 1 while version 2 loads with a 2 s warm-up: 0 failed requests."""
    base = tmp_path / "iris"
    fit_iris(base, 1)
    (base / "model.py").write_text(SLOW_WARMUP)
    write_config(base, warmup=[{"v1": {"instances": [[-1.0, 0.0, 0.0, 0.0]]}}])
    row = {"instances": [[5.1, 3.5, 1.4, 0.2]]}
    with ServerProcess(base, workers=2, poll_interval=0.5) as server:
        stop = threading.Event()
        answers: list[tuple[int, str]] = []

        def client() -> None:
            with requests.Session() as s:
                while not stop.is_set():
                    r = s.post(server.url + "/v2/models/iris/infer", json=v2(row), timeout=60)
                    answers.append((r.status_code, r.json().get("model_version", r.text)))

        threads = [threading.Thread(target=client) for _ in range(64)]
        for t in threads:
            t.start()
        try:
            time.sleep(1)
            fit_iris(base, 2)
            deadline = time.monotonic() + 60
            while not any(v == "2" for _, v in answers[-200:]) and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(1)
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        log = server.output()
    failed = [a for a in answers if a[0] != 200]
    assert not failed, failed[:5]
    versions = [v for _, v in answers]
    assert "1" in versions and "2" in versions
    assert log.count("warmed up iris version 2") == 2, log[-3000:]  # once in each worker


def v2(body):
    (row,) = body["instances"]
    names = ("sepal_length", "sepal_width", "petal_length", "petal_width")
    return {"inputs": [{"name": n, "shape": [1], "datatype": "FP64", "data": [x]} for n, x in zip(names, row)]}


@pytest.mark.slow
def test_tf_serving_warmup_requests_of_a_savedmodel_run_before_it_serves(tmp_path, servekit_app):
    """TF Serving's assets.extra/tf_serving_warmup_requests, written with TensorFlow's own
    TFRecordWriter and TF Serving's PredictionLog: good records warm the model up, a record
    that fails makes the version END with the record named."""
    tf = pytest.importorskip("tensorflow")
    from repo_paths import TF_DATA
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    def with_warmup(name: str, x, input_name: str = "x") -> None:
        target = tmp_path / name / "123"
        shutil.copytree(TF_DATA / "saved_model_half_plus_two_cpu" / "00000123", target)
        (target / "assets.extra").mkdir()
        request = predict_pb2.PredictRequest()
        request.model_spec.name = name
        request.inputs[input_name].CopyFrom(tf.make_tensor_proto(x, dtype=tf.float32))
        log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
        with tf.io.TFRecordWriter(str(target / "assets.extra" / "tf_serving_warmup_requests")) as writer:
            for _ in range(3):
                writer.write(log.SerializeToString())

    with_warmup("good", [1.0, 2.0])
    with_warmup("bad", [1.0], input_name="nope")
    client = servekit_app(tmp_path, strict_readiness=False)
    r = client.post("/v1/models/good:predict", json={"instances": [1.0, 2.0]})
    assert r.get_json() == {"predictions": [2.5, 3.0]}
    status = client.get("/v1/models/bad").get_json()["model_version_status"][0]
    assert status["state"] == "END"
    assert "record 1 of assets.extra/tf_serving_warmup_requests failed" in status["status"]["error_message"]
