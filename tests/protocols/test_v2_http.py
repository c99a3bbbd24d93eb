"""The V2 / Open Inference Protocol end to end: tritonclient.http against real gunicorn.

One server (session-scoped) serves sklearn models and two ``model.py`` models:
``strings`` (uppercases BYTES, adds a suffix from the request parameters) and
``identity`` (returns its inputs, so every datatype makes the round trip).
"""

from __future__ import annotations

import gzip
import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from sklearn_models import fit_iris, fit_regressor
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.slow  # starts real servers or subprocesses

FEATURES = ["sepal_length", "sepal_width", "petal_length", "petal_width"]
IRIS_ROWS = np.array([[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3], [5.9, 3.0, 4.2, 1.5]])
LINEAR_ROWS = np.array([[0.5, 1.25], [3.0, -2.0], [1e-3, 7.0]])

STRINGS_MODEL = """
import numpy as np
import servekit
from servekit.types import ModelMetadata, Signature, TensorSpec


@servekit.hookimpl
def load(path):
    return "strings"


@servekit.hookimpl
def metadata(model):
    sig = Signature(
        inputs=[TensorSpec("text", "BYTES", [-1])],
        outputs=[TensorSpec("upper", "BYTES", [-1]), TensorSpec("length", "INT32", [-1])],
    )
    return ModelMetadata(signatures={"serving_default": sig}, platform="python")


@servekit.hookimpl
def predict(inputs, parameters):
    text = inputs["text"]
    suffix = parameters.get("suffix", "")
    # BYTES arrive as bytes; this model answers str, which goes out as UTF-8
    upper = np.array([t.decode().upper() + suffix for t in text.reshape(-1)], dtype=object).reshape(text.shape)
    length = np.array([len(t) for t in text.reshape(-1)], dtype=np.int32).reshape(text.shape)
    return {"upper": upper, "length": length}
"""

IDENTITY_MODEL = """
import servekit
from servekit.types import ModelMetadata, Signature, TensorSpec


@servekit.hookimpl
def load(path):
    return "identity"


@servekit.hookimpl
def metadata(model):
    # a declared input: one tensor arrives by name (a dict), so the answer keeps its name
    return ModelMetadata(signatures={"serving_default": Signature(inputs=[TensorSpec("x", "FP32", None)])})


@servekit.hookimpl
def predict(inputs, parameters):
    if parameters.get("fail"):
        raise RuntimeError("asked to fail")
    return {name: value for name, value in inputs.items()}
"""


def write_model_py(folder: Path, source: str) -> None:
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(textwrap.dedent(source))


@pytest.fixture(scope="session")
def v2_repo(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("v2repo")
    fit_iris(base / "iris", 1)
    fit_iris(base / "iris", 2)
    (base / "iris" / "servekit.yaml").write_text("version_policy: all\n")
    fit_regressor(base / "linear")
    fit_regressor(base / "spare")
    write_model_py(base / "strings", STRINGS_MODEL)
    write_model_py(base / "identity", IDENTITY_MODEL)
    (base / "broken" / "1").mkdir(parents=True)
    (base / "broken" / "1" / "model.joblib").write_bytes(b"not a pickle")
    return base


@pytest.fixture(scope="session")
def v2_server(v2_repo):
    from servekit.testing import ServerProcess

    with ServerProcess(v2_repo, workers=1, threads=4, strict_readiness=False, model_control_mode="explicit") as server:
        yield server


@pytest.fixture(scope="session")
def client(v2_server):
    c = httpclient.InferenceServerClient(v2_server.url.removeprefix("http://"))
    yield c
    c.close()


def tensor(name: str, arr: np.ndarray, binary: bool) -> httpclient.InferInput:
    datatype = "BYTES" if arr.dtype.kind in "OSU" else httpclient.np_to_triton_dtype(arr.dtype)
    t = httpclient.InferInput(name, list(arr.shape), datatype)
    t.set_data_from_numpy(arr, binary_data=binary)
    return t


def iris_inputs(binary: bool) -> list[httpclient.InferInput]:
    return [tensor(n, IRIS_ROWS[:, i].copy(), binary) for i, n in enumerate(FEATURES)]


# -- server and model metadata, readiness ------------------------------------------


def test_server_is_live_ready_and_describes_itself(client):
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "servekit" and meta["version"]
    assert {"binary_tensor_data", "model_repository"} <= set(meta["extensions"])


def test_model_metadata_comes_from_the_signature(client):
    meta = client.get_model_metadata("iris")
    assert meta["name"] == "iris" and meta["platform"] == "sklearn"
    assert meta["versions"] == ["1", "2"]
    assert meta["inputs"] == [{"name": n, "datatype": "FP64", "shape": [-1]} for n in FEATURES]
    assert meta["outputs"] == [{"name": "predict", "datatype": "BYTES", "shape": [-1]}]
    linear = client.get_model_metadata("linear", "1")
    assert linear["inputs"] == [{"name": "input", "datatype": "FP64", "shape": [-1, 2]}]
    assert client.get_model_metadata("strings")["platform"] == "python"


def test_readiness_per_model_and_version(client):
    assert client.is_model_ready("iris")
    assert client.is_model_ready("iris", "1") and client.is_model_ready("iris", "2")
    assert not client.is_model_ready("iris", "3")
    assert not client.is_model_ready("broken")
    assert not client.is_model_ready("nope")


def test_readiness_statuses_and_bodies(v2_server):
    assert requests.get(v2_server.url + "/v2/models/iris/versions/2/ready", timeout=10).json() == {
        "name": "iris",
        "ready": True,
    }
    broken = requests.get(v2_server.url + "/v2/models/broken/ready", timeout=10)
    assert broken.status_code == 503 and broken.json()["ready"] is False
    assert "failed to load" in broken.json()["error"]
    assert requests.get(v2_server.url + "/v2/models/iris/versions/3/ready", timeout=10).status_code == 404
    assert requests.get(v2_server.url + "/v2/models/nope/ready", timeout=10).status_code == 404


def test_unknown_model_and_version_are_404(client):
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata("nope")
    assert err.value.status() == "404" and "nope" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.infer("iris", iris_inputs(True), model_version="7")
    assert err.value.status() == "404"


def test_a_model_that_failed_to_load_is_503(client):
    with pytest.raises(InferenceServerException) as err:
        client.infer("broken", [tensor("input", LINEAR_ROWS, True)])
    assert err.value.status() == "503" and "failed to load" in err.value.message()


# -- inference: JSON and binary ----------------------------------------------------------


@pytest.mark.parametrize("binary", [False, True])
def test_sklearn_classifier_answers_labels(client, binary):
    outputs = [httpclient.InferRequestedOutput("predict", binary_data=binary)]
    result = client.infer("iris", iris_inputs(binary), outputs=outputs, request_id="req-7")
    labels = result.as_numpy("predict")
    assert labels.tolist() in (["setosa", "virginica", "versicolor"], [b"setosa", b"virginica", b"versicolor"])
    response = result.get_response()
    assert response["id"] == "req-7" and response["model_name"] == "iris" and response["model_version"] == "2"
    assert ("parameters" in response["outputs"][0]) is binary


def test_versioned_infer_answers_from_that_version(client):
    result = client.infer("iris", iris_inputs(True), model_version="1")
    assert result.get_response()["model_version"] == "1"


@pytest.mark.parametrize("binary_in", [False, True])
@pytest.mark.parametrize("binary_out", [False, True])
def test_regressor_numbers_survive_every_encoding(client, binary_in, binary_out):
    result = client.infer(
        "linear",
        [tensor("input", LINEAR_ROWS, binary_in)],
        outputs=[httpclient.InferRequestedOutput("predict", binary_data=binary_out)],
    )
    expected = 2 * LINEAR_ROWS[:, 0] + 3 * LINEAR_ROWS[:, 1] + 1
    got = result.as_numpy("predict")
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_default_request_gets_every_output_as_binary(client, v2_server):
    # With no outputs named, tritonclient asks for binary_data_output on the request.
    result = client.infer("strings", [tensor("text", np.array([b"ab", b"c"], dtype=object), False)])
    response = result.get_response()
    assert [o["name"] for o in response["outputs"]] == ["upper", "length"]
    assert all("binary_data_size" in o["parameters"] for o in response["outputs"])
    assert result.as_numpy("upper").tolist() == [b"AB", b"C"]
    assert result.as_numpy("length").tolist() == [2, 1]


@pytest.mark.parametrize("binary", [False, True])
def test_bytes_tensors_and_parameters_reach_the_model(client, binary):
    text = np.array(["hello", "wörld", "", "x y"], dtype=object)
    result = client.infer(
        "strings",
        [tensor("text", text, binary)],
        outputs=[httpclient.InferRequestedOutput("upper", binary_data=binary)],
        parameters={"suffix": "!"},
    )
    upper = result.as_numpy("upper")
    assert upper.shape == (4,)
    as_text = [v.decode() if isinstance(v, bytes) else v for v in upper.tolist()]
    assert as_text == ["HELLO!", "WÖRLD!", "!", "X Y!"]


def test_binary_bytes_may_hold_any_byte(client):
    raw = np.array([b"\x00\xff\x10", b"\xfe"], dtype=object)
    result = client.infer("identity", [tensor("blob", raw, True)])
    assert result.as_numpy("blob").tolist() == [b"\x00\xff\x10", b"\xfe"]
    with pytest.raises(InferenceServerException) as err:
        client.infer(
            "identity",
            [tensor("blob", raw, True)],
            outputs=[httpclient.InferRequestedOutput("blob", binary_data=False)],
        )
    assert err.value.status() == "400" and "binary_data" in err.value.message()


DATATYPES = {
    "BOOL": np.array([[True, False], [False, True]]),
    "UINT8": np.array([0, 255], dtype=np.uint8),
    "UINT16": np.array([0, 65535], dtype=np.uint16),
    "UINT32": np.array([0, 2**32 - 1], dtype=np.uint32),
    "UINT64": np.array([0, 2**64 - 1], dtype=np.uint64),
    "INT8": np.array([-128, 127], dtype=np.int8),
    "INT16": np.array([-(2**15), 2**15 - 1], dtype=np.int16),
    "INT32": np.array([-(2**31), 2**31 - 1], dtype=np.int32),
    "INT64": np.array([-(2**63), 2**63 - 1], dtype=np.int64),
    "FP16": np.array([0.1, -65504, 6e-8], dtype=np.float16),
    "FP32": np.array([[0.1, 3.4e38], [-1e-45, 1.5]], dtype=np.float32),
    "FP64": np.array([0.1, 1e308, -5e-324], dtype=np.float64),
    "BYTES": np.array([[b"a", b"bc"], [b"", "é".encode()]], dtype=object),
}


@pytest.mark.parametrize("binary", [False, True])
def test_every_datatype_makes_the_round_trip(client, binary):
    inputs = [tensor(dt.lower(), arr, binary) for dt, arr in DATATYPES.items()]
    outputs = [httpclient.InferRequestedOutput(dt.lower(), binary_data=binary) for dt in DATATYPES]
    result = client.infer("identity", inputs, outputs=outputs)
    for dt, arr in DATATYPES.items():
        out = result.get_output(dt.lower())
        assert out["datatype"] == dt and out["shape"] == list(arr.shape)
        got = result.as_numpy(dt.lower())
        if dt == "BYTES" and not binary:
            got = np.array([[v.encode() for v in row] for row in got.tolist()], dtype=object)
        assert got.dtype == arr.dtype, dt
        np.testing.assert_array_equal(got, arr, err_msg=dt)


def test_requested_outputs_are_honoured_in_order(client):
    outputs = [httpclient.InferRequestedOutput("length"), httpclient.InferRequestedOutput("upper", binary_data=False)]
    result = client.infer("strings", [tensor("text", np.array([b"abc"], dtype=object), True)], outputs=outputs)
    response = result.get_response()
    assert [o["name"] for o in response["outputs"]] == ["length", "upper"]
    assert "parameters" in response["outputs"][0] and response["outputs"][1]["data"] == ["ABC"]
    assert result.as_numpy("length").tolist() == [3]


def test_unknown_requested_output_is_400(client):
    with pytest.raises(InferenceServerException) as err:
        client.infer(
            "strings",
            [tensor("text", np.array([b"a"], dtype=object), True)],
            outputs=[httpclient.InferRequestedOutput("nope")],
        )
    assert err.value.status() == "400" and "nope" in err.value.message()


def test_large_tensor_goes_through_binary(client):
    big = np.random.default_rng(0).standard_normal((2000, 500)).astype(np.float32)  # 4 MB
    result = client.infer("identity", [tensor("big", big, True)])
    np.testing.assert_array_equal(result.as_numpy("big"), big)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_are_inflated(client, algorithm):
    result = client.infer("linear", [tensor("input", LINEAR_ROWS, True)], request_compression_algorithm=algorithm)
    np.testing.assert_allclose(result.as_numpy("predict"), 2 * LINEAR_ROWS[:, 0] + 3 * LINEAR_ROWS[:, 1] + 1)


# -- wrong input -------------------------------------------------------------------------


def test_shape_that_contradicts_the_data_is_rejected(client):
    bad = tensor("input", LINEAR_ROWS, True)
    bad.set_shape([4, 2])  # 3 rows of data, 4 declared
    with pytest.raises(InferenceServerException) as err:
        client.infer("linear", [bad])
    assert err.value.status() == "400" and "needs 64 bytes, found 48" in err.value.message()
    bad = tensor("input", LINEAR_ROWS, False)
    bad.set_shape([2, 2])
    with pytest.raises(InferenceServerException) as err:
        client.infer("linear", [bad])
    assert err.value.status() == "400" and "needs 4 elements, but 'data' holds 6" in err.value.message()


def test_shape_that_contradicts_the_model_is_rejected(client):
    with pytest.raises(InferenceServerException) as err:
        client.infer("linear", [tensor("input", np.ones((2, 3)), True)])
    assert err.value.status() == "400"
    assert "shape [2, 3] does not match the model's shape [-1, 2]" in err.value.message()


def test_model_failure_is_500_and_the_server_keeps_serving(client):
    with pytest.raises(InferenceServerException) as err:
        client.infer("identity", [tensor("x", np.ones(2), True)], parameters={"fail": True})
    assert err.value.status() == "500" and "asked to fail" in err.value.message()
    assert client.infer("identity", [tensor("x", np.ones(2), True)]).as_numpy("x").tolist() == [1.0, 1.0]


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"{not json", 400, "malformed JSON"),
        (b"[]", 400, "JSON object"),
        (
            json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "FP8", "data": [1]}]}).encode(),
            400,
            "unsupported datatype 'FP8'",
        ),
        (
            json.dumps({"inputs": [{"name": "x", "shape": [2], "datatype": "INT32", "data": [1, 2.5]}]}).encode(),
            400,
            "must be integers",
        ),
    ],
)
def test_bad_bodies_get_json_errors(v2_server, body, status, message):
    r = requests.post(v2_server.url + "/v2/models/identity/infer", data=body, timeout=10)
    assert r.status_code == status and message in r.json()["error"]


def test_binary_data_over_raw_http_with_header_lengths(v2_server):
    x = np.arange(6, dtype=np.int16).reshape(2, 3)
    head = json.dumps(
        {
            "inputs": [{"name": "x", "shape": [2, 3], "datatype": "INT16", "parameters": {"binary_data_size": 12}}],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    r = requests.post(
        v2_server.url + "/v2/models/identity/infer",
        data=head + x.tobytes(),
        headers={"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"},
        timeout=10,
    )
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/octet-stream"
    n = int(r.headers["Inference-Header-Content-Length"])
    doc = json.loads(r.content[:n])
    assert doc["outputs"][0]["parameters"] == {"binary_data_size": 12}
    assert np.frombuffer(r.content[n:], dtype="<i2").reshape(2, 3).tolist() == x.tolist()


def test_single_tensor_request_form(v2_server):
    body = {"name": "input", "shape": [1, 2], "datatype": "FP64", "parameters": {}, "data": [[1.0, 2.0]]}
    r = requests.post(v2_server.url + "/v2/models/linear/infer", json=body, timeout=10)
    assert r.status_code == 200
    out = r.json()["outputs"][0]
    assert out["name"] == "predict" and out["data"] == [pytest.approx(9.0)] and out["shape"] == [1]


def test_gzip_bomb_is_refused(v2_server):
    bomb = gzip.compress(b" " * (80 * 1024 * 1024))
    r = requests.post(
        v2_server.url + "/v2/models/identity/infer", data=bomb, headers={"Content-Encoding": "gzip"}, timeout=30
    )
    assert r.status_code == 413 and "limit" in r.json()["error"]


# -- explain --------------------------------------------------------------------------------


def test_explain_answers_named_tensors(v2_server):
    inputs = [
        {"name": n, "shape": [3], "datatype": "FP64", "data": IRIS_ROWS[:, i].tolist()} for i, n in enumerate(FEATURES)
    ]
    r = requests.post(v2_server.url + "/v2/models/iris/explain", json={"id": "e1", "inputs": inputs}, timeout=10)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["id"] == "e1"
    outputs = {o["name"]: o for o in body["outputs"]}
    assert outputs["attributions"]["shape"] == [3, 3, 4] and outputs["base_values"]["shape"] == [3, 3]


def test_explain_without_an_explain_hook_is_501(v2_server):
    r = requests.post(
        v2_server.url + "/v2/models/strings/explain",
        json={"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}]},
        timeout=10,
    )
    assert r.status_code == 501 and "explain" in r.json()["error"]


# -- V1 and V2 agree -------------------------------------------------------------------------


def test_v1_and_v2_give_the_same_numbers(client, v2_server):
    v1 = requests.post(
        v2_server.url + "/v1/models/linear:predict", json={"instances": LINEAR_ROWS.tolist()}, timeout=10
    )
    assert v1.status_code == 200
    v2_binary = client.infer("linear", [tensor("input", LINEAR_ROWS, True)]).as_numpy("predict")
    v2_json = client.infer(
        "linear",
        [tensor("input", LINEAR_ROWS, False)],
        outputs=[httpclient.InferRequestedOutput("predict", binary_data=False)],
    ).as_numpy("predict")
    assert np.array_equal(np.array(v1.json()["predictions"]), v2_binary)
    assert np.array_equal(v2_binary, v2_json)


def test_v1_and_v2_agree_on_another_signature(client, v2_server):
    rows = [dict(zip(FEATURES, r)) for r in IRIS_ROWS.tolist()]
    v1 = requests.post(
        v2_server.url + "/v1/models/iris/versions/1:predict",
        json={"signature_name": "predict_proba", "instances": rows},
        timeout=10,
    )
    assert v1.status_code == 200
    result = client.infer("iris", iris_inputs(True), model_version="1", parameters={"signature_name": "predict_proba"})
    proba = result.as_numpy("predict_proba")
    assert proba.shape == (3, 3)
    assert np.array_equal(np.array(v1.json()["predictions"]), proba)
    labels_v1 = requests.post(v2_server.url + "/v1/models/iris:predict", json={"instances": rows}, timeout=10).json()
    labels_v2 = client.infer("iris", iris_inputs(False)).as_numpy("predict")
    assert labels_v1["predictions"] == [v.decode() for v in labels_v2.tolist()]


# -- model repository extension ----------------------------------------------------------------


def test_repository_index_load_and_unload(client):
    index = {(e["name"], e.get("version")): e for e in client.get_model_repository_index()}
    assert index[("iris", "1")]["state"] == "READY" and index[("iris", "2")]["state"] == "READY"
    assert index[("broken", "1")]["state"] == "UNAVAILABLE" and index[("broken", "1")]["reason"]

    client.unload_model("spare")
    assert not client.is_model_ready("spare")
    entry = [e for e in client.get_model_repository_index() if e["name"] == "spare"]
    assert entry == [{"name": "spare", "state": "UNAVAILABLE", "reason": "unloaded"}]
    with pytest.raises(InferenceServerException) as err:
        client.infer("spare", [tensor("input", LINEAR_ROWS, True)])
    assert err.value.status() in ("404", "503")

    client.load_model("spare")
    assert client.is_model_ready("spare")
    np.testing.assert_allclose(
        client.infer("spare", [tensor("input", LINEAR_ROWS, True)]).as_numpy("predict"),
        2 * LINEAR_ROWS[:, 0] + 3 * LINEAR_ROWS[:, 1] + 1,
    )


def test_repository_errors(client, v2_server):
    with pytest.raises(InferenceServerException) as err:
        client.load_model("nope")
    assert err.value.status() == "404"
    with pytest.raises(InferenceServerException) as err:
        client.load_model("broken")
    assert err.value.status() == "400" and "failed to load" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.load_model("linear", config=json.dumps({"backend": "x"}))
    assert err.value.status() == "400" and "config" in err.value.message()
    ready = requests.post(v2_server.url + "/v2/repository/index", json={"ready": True}, timeout=10).json()
    assert ready and all(e["state"] == "READY" for e in ready)


# -- in process: readiness while the first load is still running ---------------------------


@pytest.mark.timeout(60)
def test_model_readiness_answers_at_once_while_loading(v2_repo):
    """A readiness probe must not wait for the load, as inference requests do."""
    from servekit.server.app import create_app
    from servekit.server.settings import Settings

    app = create_app(Settings(paths=[str(v2_repo)], poll_interval=0), start=False)
    app.extensions["servekit"].load_wait = 3600  # an inference request would wait this long
    r = app.test_client().get("/v2/models/linear/ready")
    assert r.status_code == 503 and r.json["ready"] is False and "loading" in r.json["error"]
