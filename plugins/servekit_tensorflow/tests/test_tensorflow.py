"""The TensorFlow plugin as a drop-in for TensorFlow Serving's REST API.

Every example of the TF Serving REST document is sent to a real server over
TF Serving's own test SavedModels (tests/data/tf_serving, Apache-2.0, from
tensorflow/serving), and the metadata must equal what ``tensorflow_model_server``
returned for them.  A tiny TF2 model built here covers strings, binary outputs,
integer inputs and a classify signature with labels.
"""

from __future__ import annotations

import base64
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from lazy_modules import lazy_module
from repo_paths import TF_DATA

pytestmark = pytest.mark.slow  # starts real servers or subprocesses

tf = lazy_module("tensorflow")  # looked up at collection, imported by the first test that needs it

THREE = "saved_model_half_plus_three"
TWO = "saved_model_half_plus_two_2_versions"
TWO_TF1 = "saved_model_half_plus_two_cpu"
TWO_TF2 = "saved_model_half_plus_two_tf2_cpu"
METADATA_FILES = {
    TWO: "saved_model_half_plus_two_2_versions_metadata.json",
    TWO_TF1: "half_plus_two_model_metadata.json",
    TWO_TF2: "saved_model_half_plus_two_tf2_2_versions_metadata.json",
}


def build_custom_model(folder: Path) -> Path:
    """A TF2 SavedModel with string, int32 and binary tensors and a labelled classify signature."""

    class Custom(tf.Module):
        @tf.function(
            input_signature=[
                tf.TensorSpec([None], tf.string, name="text"),
                tf.TensorSpec([None], tf.int32, name="count"),
            ]
        )
        def serve(self, text, count):
            return {
                "upper": tf.strings.upper(text),
                "raw_bytes": tf.strings.join([text, tf.constant(b"\xff")]),
                "doubled": count * 2,
            }

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
        def classify(self, inputs):
            x = tf.io.parse_example(inputs, {"x": tf.io.FixedLenFeature([1], tf.float32)})["x"]
            positive = tf.sigmoid(x)
            scores = tf.concat([1.0 - positive, positive], axis=1)
            classes = tf.tile(tf.constant([["neg", "pos"]]), [tf.shape(x)[0], 1])
            return {"classes": classes, "scores": scores}

    module = Custom()
    target = folder / "1"
    tf.saved_model.save(
        module,
        str(target),
        signatures={"serving_default": module.serve, "classify": module.classify},
    )
    (target / "variables").mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def tf_repo(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("tf_plugin")
    for name in (THREE, TWO, TWO_TF1, TWO_TF2):
        shutil.copytree(TF_DATA / name, base / name)
    (base / TWO / "servekit.yaml").write_text("version_policy: all\nlabels: {stable: 123, canary: 124}\ndevice: cpu\n")
    build_custom_model(base / "custom")
    return base


@pytest.fixture(scope="session")
def tf_server(tf_repo):
    from servekit.testing import ServerProcess

    with ServerProcess(tf_repo, workers=1, threads=8) as server:
        yield server


def post(server, path: str, body) -> requests.Response:
    return requests.post(server.url + path, data=json.dumps(body), timeout=60)


# -- the REST document's examples -------------------------------------------------------


def test_doc_status(tf_server):
    r = requests.get(f"{tf_server.url}/v1/models/{THREE}", timeout=10)
    assert r.status_code == 200
    assert r.json()["model_version_status"] == [
        {
            "version": "123",
            "state": "AVAILABLE",
            "status": {"error_code": "OK", "error_message": ""},
        }
    ]


def test_doc_predict(tf_server):
    r = post(tf_server, f"/v1/models/{THREE}:predict", {"instances": [1.0, 2.0, 5.0]})
    assert r.status_code == 200, r.text
    assert r.json() == {"predictions": [3.5, 4.0, 5.5]}


def test_doc_regress(tf_server):
    body = {"signature_name": "tensorflow/serving/regress", "examples": [{"x": 1.0}, {"x": 2.0}]}
    r = post(tf_server, f"/v1/models/{THREE}:regress", body)
    assert r.status_code == 200, r.text
    assert r.json() == {"results": [3.5, 4.0]}


def test_doc_not_found(tf_server):
    r = post(tf_server, "/v1/models/half:predict", {"instances": [1.0, 5.0]})
    assert r.status_code == 404
    assert r.headers["Content-Type"] == "application/json"
    assert r.json()["error"].startswith("Servable not found for request: Latest(half); models served here: ")


def test_classify_tf1_signature(tf_server):
    body = {"signature_name": "classify_x_to_y", "examples": [{"x": 1.0}, {"x": 2.0}]}
    r = post(tf_server, f"/v1/models/{TWO}:classify", body)
    assert r.status_code == 200, r.text
    assert r.json() == {"results": [[["", 2.5]], [["", 3.0]]]}


def test_classify_and_regress_with_context(tf_server):
    # the feature comes from the shared context; y2 = 0.5 * x + 3
    body = {"signature_name": "regress_x_to_y2", "context": {"x": 4.0}, "examples": [{}, {}]}
    r = post(tf_server, f"/v1/models/{TWO}:regress", body)
    assert r.json() == {"results": [5.0, 5.0]}


def test_tf2_export_signatures(tf_server):
    """TF2 exports say method 'predict' everywhere; still served by TF Serving."""
    r = post(tf_server, f"/v1/models/{TWO_TF2}:predict", {"instances": [1.0, 2.0, 5.0]})
    assert r.json() == {"predictions": [2.5, 3.0, 4.5]}
    examples = [{"x": 1.0}, {"x": 2.0}]
    body = {"signature_name": "regress_x_to_y", "examples": examples}
    r = post(tf_server, f"/v1/models/{TWO_TF2}:regress", body)
    assert r.json() == {"results": [2.5, 3.0]}
    body = {"signature_name": "classify_x_to_y", "examples": examples}
    r = post(tf_server, f"/v1/models/{TWO_TF2}:classify", body)
    assert r.json() == {"results": [[["", 2.5]], [["", 3.0]]]}


def test_regress_on_a_float_signature_is_refused_as_tf_serving_does(tf_server):
    body = {"signature_name": "regress_x2_to_y3", "examples": [{"x": 1.0}]}
    r = post(tf_server, f"/v1/models/{TWO}:regress", body)
    assert r.status_code == 400
    message = r.json()["error"]
    assert "DT_FLOAT" in message and "regress_x_to_y" in message  # says why, and what works


def test_regress_without_signature_uses_serving_default(tf_server):
    r = post(tf_server, f"/v1/models/{TWO}:regress", {"examples": [{"x": 1.0}]})
    assert r.status_code == 400
    assert "serving_default" in r.json()["error"]


def test_int_feature_into_float_parser_is_a_client_error(tf_server):
    body = {"signature_name": "regress_x_to_y", "examples": [{"x": 1}]}
    r = post(tf_server, f"/v1/models/{TWO}:regress", body)
    assert r.status_code == 400
    assert "int64" in r.json()["error"]


# -- predict ------------------------------------------------------------------------------------


def test_predict_columnar_and_named(tf_server):
    r = post(tf_server, f"/v1/models/{TWO}:predict", {"inputs": {"x": [[1.0], [2.0]]}})
    assert r.json() == {"outputs": [[2.5], [3.0]]}
    r = post(tf_server, f"/v1/models/{TWO}:predict", {"instances": [{"x": [1.0]}, {"x": [3.0]}]})
    assert r.json() == {"predictions": [[2.5], [3.5]]}


def test_predict_other_signature(tf_server):
    body = {"signature_name": "regress_x2_to_y3", "inputs": [[1.0], [3.0]]}
    r = post(tf_server, f"/v1/models/{TWO}:predict", body)
    assert r.json() == {"outputs": [[3.5], [4.5]]}


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"signature_name": "nope", "instances": [1.0]}, "'nope' not found"),
        ({"inputs": {"y": [1.0]}}, "no input(s) y"),
        ({"instances": ["a", "b"]}, "expected numbers, found the string 'a' at row 0"),
        ({"instances": [True]}, "expected numbers (FP32), found booleans"),
        ({"signature_name": "__saved_model_init_op", "instances": [1.0]}, "not found"),
    ],
)
def test_predict_bad_requests(tf_server, body, fragment):
    r = post(tf_server, f"/v1/models/{TWO_TF2}:predict", body)
    assert r.status_code == 400, r.text
    assert fragment in r.json()["error"]


def test_strings_and_binary_outputs(tf_server):
    def b64(data: bytes) -> dict:
        return {"b64": base64.b64encode(data).decode()}

    body = {"instances": [{"text": "abc", "count": 2}, {"text": b64(b"x y"), "count": -3}]}
    r = post(tf_server, "/v1/models/custom:predict", body)
    assert r.status_code == 200, r.text
    assert r.json() == {
        "predictions": [
            {"doubled": 4, "raw_bytes": b64(b"abc\xff"), "upper": "ABC"},
            {"doubled": -6, "raw_bytes": b64(b"x y\xff"), "upper": "X Y"},
        ]
    }


@pytest.mark.parametrize(
    ("count", "fragment"),
    [
        ([1.5], "expects DT_INT32 integers"),
        ([2**40], "out of the range of DT_INT32"),
        ([True], "expected numbers (INT32), found booleans"),
        (["7"], "expected numbers, found the string '7'"),
    ],
)
def test_lossy_casts_are_refused(tf_server, count, fragment):
    body = {"inputs": {"text": ["a"] * len(count), "count": count}}
    r = post(tf_server, "/v1/models/custom:predict", body)
    assert r.status_code == 400, r.text
    assert "'count'" in r.json()["error"] and fragment in r.json()["error"]


def test_integral_floats_are_accepted_for_int_inputs(tf_server):
    r = post(tf_server, "/v1/models/custom:predict", {"inputs": {"text": ["a"], "count": [3.0]}})
    assert r.json()["outputs"]["doubled"] == [6]


def test_missing_input_is_named(tf_server):
    r = post(tf_server, "/v1/models/custom:predict", {"inputs": {"text": ["a"]}})
    assert r.status_code == 400
    assert "missing input(s) count" in r.json()["error"]


def test_classify_with_labels_and_bytes_context(tf_server):
    body = {
        "signature_name": "classify",
        "context": {"note": {"b64": base64.b64encode(b"\x00\x01").decode()}},
        "examples": [{"x": 0.0}, {"x": [2.0]}],
    }
    r = post(tf_server, "/v1/models/custom:classify", body)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [[label for label, _ in pairs] for pairs in results] == [["neg", "pos"], ["neg", "pos"]]
    assert results[0][1][1] == pytest.approx(0.5)
    assert results[1][1][1] == pytest.approx(1 / (1 + 2.718281828459045**-2.0), rel=1e-6)


def test_concurrent_requests(tf_server):
    def one(i: int) -> list:
        r = post(tf_server, f"/v1/models/{THREE}:predict", {"instances": [float(i)]})
        return r.json()["predictions"]

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, range(32)))
    assert answers == [[0.5 * i + 3] for i in range(32)]


# -- metadata -----------------------------------------------------------------------------------


@pytest.mark.parametrize("model", sorted(METADATA_FILES))
def test_metadata_equals_tf_serving(tf_server, model):
    expected = json.loads((TF_DATA / METADATA_FILES[model]).read_text())
    version = expected["model_spec"]["version"]
    r = requests.get(f"{tf_server.url}/v1/models/{model}/versions/{version}/metadata", timeout=10)
    assert r.status_code == 200, r.text
    got = r.json()
    # the recorded files were served under other names; nothing else may differ
    assert got["model_spec"]["name"] == model
    got["model_spec"]["name"] = expected["model_spec"]["name"]
    assert got == expected


def test_metadata_of_half_plus_three(tf_server):
    sigs = requests.get(f"{tf_server.url}/v1/models/{THREE}/metadata", timeout=10).json()
    sigs = sigs["metadata"]["signature_def"]["signature_def"]
    assert set(sigs) == {"serving_default", "tensorflow/serving/regress"}
    assert sigs["tensorflow/serving/regress"]["inputs"]["inputs"]["name"] == "tf_example:0"


# -- versions, labels and policies ----------------------------------------------------------------


def test_versions_and_labels(tf_server):
    status = requests.get(f"{tf_server.url}/v1/models/{TWO}", timeout=10).json()
    assert [v["version"] for v in status["model_version_status"]] == ["124", "123"]
    addressed = [("/versions/123", "123"), ("/labels/stable", "123"), ("/labels/canary", "124"), ("", "124")]
    for path, version in addressed:
        meta = requests.get(f"{tf_server.url}/v1/models/{TWO}{path}/metadata", timeout=10).json()
        assert meta["model_spec"]["version"] == version
        r = post(tf_server, f"/v1/models/{TWO}{path}:predict", {"instances": [[1.0]]})
        assert r.json() == {"predictions": [[2.5]]}
    for path in ("/versions/7", "/labels/beta"):
        r = post(tf_server, f"/v1/models/{TWO}{path}:predict", {"instances": [[1.0]]})
        assert r.status_code == 404, r.text


@pytest.mark.parametrize(
    ("policy", "versions"),
    [
        ("", ["124"]),
        ("version_policy: all\n", ["124", "123"]),
        ("version_policy: {specific: [123]}\n", ["123"]),
    ],
)
def test_version_policies(tmp_path, servekit_app, policy, versions):
    shutil.copytree(TF_DATA / TWO, tmp_path / TWO)
    (tmp_path / TWO / "servekit.yaml").write_text(policy)
    client = servekit_app(tmp_path / TWO)
    status = client.get(f"/v1/models/{TWO}").get_json()
    assert [v["version"] for v in status["model_version_status"]] == versions
    assert all(v["state"] == "AVAILABLE" for v in status["model_version_status"])


def test_tf_serving_image_environment(tf_repo):
    """The document's `docker run -e MODEL_BASE_PATH=... -e MODEL_NAME=...`, with no path given."""
    from servekit.testing import ServerProcess

    env = {"MODEL_BASE_PATH": str(tf_repo), "MODEL_NAME": THREE}
    with ServerProcess(env=env, workers=1) as server:
        r = post(server, f"/v1/models/{THREE}:predict", {"instances": [1.0, 2.0, 5.0]})
        assert r.json() == {"predictions": [3.5, 4.0, 5.5]}
        models = requests.get(f"{server.url}/v1/models/{TWO}", timeout=10)
        assert models.status_code == 404  # only MODEL_NAME is served
