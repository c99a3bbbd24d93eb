"""V2 through tritonclient.http on TF Serving's own SavedModels (half_plus_two / half_plus_three).

The models come from TensorFlow Serving's Apache-2.0 test data (tests/data/tf_serving).
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import requests
from lazy_modules import lazy_module
from repo_paths import TF_DATA

pytestmark = pytest.mark.slow  # starts real servers or subprocesses

lazy_module("tensorflow")  # looked up, not imported: the server imports it
lazy_module("servekit_tensorflow")
httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException

TWO = "saved_model_half_plus_two_2_versions"
THREE = "saved_model_half_plus_three"
X = np.array([[1.0], [2.0], [5.0]], dtype=np.float32)


@pytest.fixture(scope="session")
def tf_v2_server(tmp_path_factory):
    from servekit.testing import ServerProcess

    base = tmp_path_factory.mktemp("tf_v2")
    for name in (TWO, THREE):
        shutil.copytree(TF_DATA / name, base / name)
    (base / TWO / "servekit.yaml").write_text("version_policy: all\n")
    with ServerProcess(base, workers=1, threads=4) as server:
        yield server


@pytest.fixture(scope="session")
def tf_client(tf_v2_server):
    c = httpclient.InferenceServerClient(tf_v2_server.url.removeprefix("http://"))
    yield c
    c.close()


def x_input(x: np.ndarray, binary: bool) -> httpclient.InferInput:
    t = httpclient.InferInput("x", list(x.shape), "FP32")
    t.set_data_from_numpy(x, binary_data=binary)
    return t


def test_metadata_and_readiness_of_versioned_savedmodels(tf_client):
    meta = tf_client.get_model_metadata(TWO)
    assert meta["platform"] == "tensorflow" and meta["versions"] == ["123", "124"]
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 1]}]
    assert meta["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 1]}]
    assert tf_client.is_model_ready(TWO, "123") and tf_client.is_model_ready(TWO, "124")
    assert not tf_client.is_model_ready(TWO, "125")
    assert tf_client.get_model_metadata(TWO, "123")["name"] == TWO


@pytest.mark.parametrize("binary", [False, True])
def test_half_plus_two_and_three(tf_client, binary):
    outputs = [httpclient.InferRequestedOutput("y", binary_data=binary)]
    two = tf_client.infer(TWO, [x_input(X, binary)], outputs=outputs, request_id="tf-1")
    np.testing.assert_array_equal(two.as_numpy("y"), X * 0.5 + 2)
    assert two.as_numpy("y").dtype == np.float32
    assert two.get_response()["id"] == "tf-1" and two.get_response()["model_version"] == "124"
    three = tf_client.infer(THREE, [x_input(X, binary)], outputs=outputs)
    np.testing.assert_array_equal(three.as_numpy("y"), X * 0.5 + 3)


def test_versioned_infer(tf_client):
    result = tf_client.infer(TWO, [x_input(X, True)], model_version="123")
    assert result.get_response()["model_version"] == "123"
    np.testing.assert_array_equal(result.as_numpy("y"), X * 0.5 + 2)


def test_wrong_shape_is_rejected(tf_client):
    flat = httpclient.InferInput("x", [3], "FP32")
    flat.set_data_from_numpy(X.reshape(-1), binary_data=True)
    with pytest.raises(InferenceServerException) as err:
        tf_client.infer(TWO, [flat])
    assert err.value.status() == "400" and "[-1, 1]" in err.value.message()


def test_v1_and_v2_give_the_same_numbers(tf_client, tf_v2_server):
    v1 = requests.post(f"{tf_v2_server.url}/v1/models/{THREE}:predict", json={"instances": X.tolist()}, timeout=30)
    assert v1.status_code == 200, v1.text
    v2 = tf_client.infer(THREE, [x_input(X, True)]).as_numpy("y")
    assert np.array_equal(np.array(v1.json()["predictions"], dtype=np.float32), v2)
