"""TF Lite models in the TensorFlow plugin: ``model.tflite`` through ``tf.lite.Interpreter``.

Look-alike models are built at test time with TensorFlow's converter
(tests/support/tflite_models.py).  TF Serving's two TF Lite model-server tests (a
model with its SignatureDef in the ``signature_defs_metadata`` buffer and one without,
both ``[1, 1]`` and sent ``x`` of shape ``[1]``, under ``--prefer_tflite_model``) run
against ``tensorflow_model_server`` on TF Serving's own ``model.tflite`` files
(tests/data/tf_serving/).
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest
from lazy_modules import lazy_module
from repo_paths import REPO, TF_DATA

pytestmark = pytest.mark.slow  # builds models with TensorFlow and starts servers

lazy_module("tensorflow")  # looked up at collection, imported by the tests that build models


@pytest.fixture(scope="module")
def tflite_models(tmp_path_factory):
    out = tmp_path_factory.mktemp("tflite")
    subprocess.run([sys.executable, str(REPO / "tests" / "support" / "tflite_models.py"), str(out)], check=True)
    # a version folder holding both a SavedModel (half_plus_three) and a TF Lite model (half_plus_two)
    both = out / "both" / "123"
    shutil.copytree(TF_DATA / "saved_model_half_plus_three" / "00000123", both)
    shutil.copy(out / "half_plus_two_tflite_with_sigdef" / "123" / "model.tflite", both / "model.tflite")
    return out


@pytest.fixture(scope="module")
def client(tflite_models):
    from servekit.server.app import create_app
    from servekit.server.settings import Settings

    names = ("half_plus_two_tflite", "half_plus_two_tflite_with_sigdef", "both", "sum_of_two_tflite")
    paths = [str(tflite_models / n) for n in names]
    app = create_app(Settings(paths=paths, poll_interval=0), start=False)
    app.extensions["servekit"].repository.load_now()
    yield app.test_client()
    app.extensions["servekit"].repository.stop()


@pytest.mark.parametrize("name", ["half_plus_two_tflite", "half_plus_two_tflite_with_sigdef"])
def test_metadata_comes_from_the_interpreter(client, name):
    answer = client.get(f"/v1/models/{name}/metadata").get_json()
    signature = answer["metadata"]["signature_def"]["signature_def"]["serving_default"]
    (x,) = signature["inputs"].values()
    (y,) = signature["outputs"].values()
    assert list(signature["inputs"]) == ["x"] and list(signature["outputs"]) == ["y"]
    assert x["dtype"] == y["dtype"] == "DT_FLOAT"
    assert [d["size"] for d in x["tensor_shape"]["dim"]] == ["-1"] and not x["tensor_shape"]["unknown_rank"]
    assert signature["method_name"] == "tensorflow/serving/predict"
    v2 = client.get(f"/v2/models/{name}").get_json()
    assert v2["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1]}]
    assert v2["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1]}]


@pytest.mark.parametrize("name", ["half_plus_two_tflite", "half_plus_two_tflite_with_sigdef"])
def test_predict_over_v1_and_v2(client, name):
    answer = client.post(f"/v1/models/{name}:predict", json={"instances": [1.0, 2.0, 5.0]})
    assert answer.status_code == 200 and answer.get_json() == {"predictions": [2.5, 3.0, 4.5]}
    one = client.post(f"/v1/models/{name}:predict", json={"inputs": {"x": [2.0]}})  # another batch size
    assert one.get_json() == {"outputs": [3.0]}
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [4], "data": [0, 2, 4, 6]}]}
    v2 = client.post(f"/v2/models/{name}/infer", json=body).get_json()
    assert v2["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [4], "data": [2.0, 3.0, 4.0, 5.0]}]


def test_bad_input_is_a_client_error(client):
    strings = client.post("/v1/models/half_plus_two_tflite:predict", json={"instances": ["two"]})
    assert strings.status_code == 400 and "expected numbers, found the string" in strings.get_json()["error"]
    # TF Serving resizes an input to the shape sent; one the model's ops cannot take is the client's error
    width = client.post("/v1/models/sum_of_two_tflite:predict", json={"instances": [[1.0, 2.0, 3.0]]})
    assert width.status_code == 400, width.get_json()
    assert "'x' of shape [1, 3] (the model declares [-1, 2]" in width.get_json()["error"]
    fits = client.post("/v1/models/sum_of_two_tflite:predict", json={"instances": [[1.0, 2.0], [3.0, 4.0]]})
    assert fits.get_json() == {"predictions": [[3.0], [7.0]]}  # the interpreter serves on after a refusal
    classify = client.post("/v1/models/half_plus_two_tflite:classify", json={"examples": [{"x": 1.0}]})
    assert classify.status_code == 501 and "predict only" in classify.get_json()["error"]


def test_a_savedmodel_beside_model_tflite_is_served_unless_tflite_is_preferred(client, tflite_models):
    saved = client.post("/v1/models/both:predict", json={"instances": [2.0]}).get_json()
    assert saved == {"predictions": [4.0]}  # half_plus_three: the SavedModel
    from servekit.server.app import create_app
    from servekit.server.settings import Settings

    (tflite_models / "both" / "servekit.yaml").write_text("options: {prefer_tflite: true}\n")
    try:
        app = create_app(Settings(paths=[str(tflite_models / "both")], poll_interval=0), start=False)
        app.extensions["servekit"].repository.load_now()
        answer = app.test_client().post("/v1/models/both:predict", json={"instances": [2.0]}).get_json()
        assert answer == {"predictions": [3.0]}  # half_plus_two: the TF Lite model
        app.extensions["servekit"].repository.stop()
    finally:
        (tflite_models / "both" / "servekit.yaml").unlink()


def test_interpreters_pool_answers_concurrent_requests(tflite_models, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from servekit.server.app import create_app
    from servekit.server.settings import Settings

    folder = tmp_path / "pooled"
    shutil.copytree(tflite_models / "half_plus_two_tflite_with_sigdef", folder)
    (folder / "servekit.yaml").write_text("options: {interpreters: 2, num_threads: 1}\n")
    app = create_app(Settings(paths=[str(folder)], poll_interval=0), start=False)
    app.extensions["servekit"].repository.load_now()
    client = app.test_client()

    def ask(i: int) -> list[float]:
        rows = [float(i), float(i + 1)][: 1 + i % 2]
        return client.post("/v1/models/pooled:predict", json={"instances": rows}).get_json()["predictions"]

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(64)))
    for i, answer in enumerate(answers):
        rows = np.array([float(i), float(i + 1)][: 1 + i % 2])
        assert answer == (rows * 0.5 + 2).tolist()
    app.extensions["servekit"].repository.stop()


# -- TF Serving's own TF Lite model-server tests ---------------------------------------------------


def test_tf_servings_own_tflite_files_resize_and_carry_their_signature(tmp_path):
    """TF Serving's files hold x: [1, 1]; the one with a SignatureDef keeps it in ``signature_defs_metadata``."""
    from servekit.server.app import create_app
    from servekit.server.settings import Settings

    names = ("saved_model_half_plus_two_tflite", "saved_model_half_plus_two_tflite_with_sigdef")
    app = create_app(Settings(paths=[str(TF_DATA / n) for n in names], poll_interval=0), start=False)
    app.extensions["servekit"].repository.load_now()
    client = app.test_client()
    try:
        for name in names:
            answer = client.get(f"/v1/models/{name}/metadata").get_json()
            signature = answer["metadata"]["signature_def"]["signature_def"]["serving_default"]
            assert list(signature["inputs"]) == ["x"] and list(signature["outputs"]) == ["y"], signature
            assert [d["size"] for d in signature["inputs"]["x"]["tensor_shape"]["dim"]] == ["1", "1"]
            # the signature's tensor name without the ":0" the interpreter lacks, as TF Serving fixes it
            expected = "tflite_input" if name.endswith("sigdef") else "x"
            assert signature["inputs"]["x"]["name"] == expected
            batch = client.post(f"/v1/models/{name}:predict", json={"instances": [2.0, 4.0, 6.0]})
            assert batch.get_json() == {"predictions": [3.0, 4.0, 5.0]}
    finally:
        app.extensions["servekit"].repository.stop()


@pytest.mark.parametrize("model", ["saved_model_half_plus_two_tflite", "saved_model_half_plus_two_tflite_with_sigdef"])
def test_tf_servings_tflite_model_server_tests(tmp_path, model):
    """tensorflow_model_server_test's testPredictOnTfLite and testPredictWithSignatureDefOnTfLite, on
    TF Serving's own files: Predict x = [2.0] of shape [1] (the model takes [1, 1]) answers y = [3.0]."""
    import json
    import urllib.request

    from tfserving_binary import TFServing, predict

    server = TFServing(
        tmp_path, "--model_name=default", f"--model_base_path={TF_DATA / model}", "--prefer_tflite_model=true"
    )
    try:
        for output_filter in (False, True):  # the tests ask without one; a client may name y
            result = predict(f"localhost:{server.port}", output_filter=output_filter)
            assert list(result.outputs) == ["y"]
            assert result.outputs["y"].dtype == 1  # DT_FLOAT
            assert list(result.outputs["y"].float_val) == [3.0]
            assert result.model_spec.name == "default"
            assert result.model_spec.signature_name == "serving_default"
            assert result.model_spec.version.value == 123
        request = urllib.request.Request(
            f"http://localhost:{server.rest_port}/v1/models/default:predict",
            data=json.dumps({"signature_name": "serving_default", "inputs": {"x": [2.0]}}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert json.loads(answer.read()) == {"outputs": [3.0]}
    finally:
        server.stop()
