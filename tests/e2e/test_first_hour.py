"""The first hour with servekit, through one real server (issue 13, KServe V1 items of issue 17).

What a new user meets first: the README's and docs/hooks.md's ``model.py``
examples answering on V1, V2 and gRPC alike; TF Serving's answers to odd paths
and values; a typo in a hook name; a broken artifact; ``GET /`` and
``GET /v1/models/NAME`` as KServe V1 clients read them; a valid OpenAPI document.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from repo_paths import REPO as ROOT
from repo_paths import TF_DATA
from servekit.testing import ServerProcess

pytestmark = pytest.mark.slow

ROWS = np.array([[1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 2.0, 0.0]], dtype=np.float32)

#: The load hook the docs' predict-only examples are served with (they show one hook each).
DEFAULT_LOAD = """

@servekit.hookimpl
def load(path):
    return {"weights": np.arange(4.0), "scale": 1.0}
"""

TYPO_MODEL = """
import servekit


@servekit.hookimpl
def load(path):
    return 2.0


@servekit.hookimpl
def predcit(inputs, model):
    return inputs * model
"""


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def readme_model_py() -> str:
    return next(b for b in python_blocks(ROOT / "README.md") if "def predict" in b)


def hooks_examples() -> dict[str, str]:
    """docs/hooks.md's examples that serve a model: a ``predict`` or ``explain`` with a default load."""
    found = {}
    for index, code in enumerate(python_blocks(ROOT / "docs" / "hooks.md")):
        if "wrapper=True" in code or not re.search(r"def (predict|explain)\(", code):
            continue
        if "def load(" not in code:
            code = "import numpy as np\n" + code + DEFAULT_LOAD
        found[f"hooks_{index}"] = code
    return found


def write_model(base: Path, name: str, source: str, **files: bytes) -> Path:
    folder = base / name / "1"
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(textwrap.dedent(source))
    for file, data in files.items():
        (folder / file).write_bytes(data)
    return folder


def save_torch_models(base: Path) -> None:
    torch = pytest.importorskip("torch")
    source = base.parent / "torch_first_hour.py"
    source.write_text(
        textwrap.dedent("""
        from typing import NamedTuple

        import torch


        class Identity(torch.nn.Module):
            def forward(self, x):
                return x


        class Scale(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.w = torch.nn.Parameter(torch.tensor(2.0))

            def forward(self, x):
                return x * self.w


        class Parts(NamedTuple):
            total: torch.Tensor
            doubled: torch.Tensor


        class Named(torch.nn.Module):
            def forward(self, x) -> Parts:
                return Parts(x.sum(dim=-1), x * 2)


        class Pair(torch.nn.Module):
            def forward(self, x):
                return x.sum(dim=-1), x * 2
    """)
    )
    import importlib.util

    spec = importlib.util.spec_from_file_location("torch_first_hour", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, cls in (
        ("identity", module.Identity),
        ("scale", module.Scale),
        ("named", module.Named),
        ("pair", module.Pair),
    ):
        (base / name / "1").mkdir(parents=True)
        torch.jit.save(torch.jit.script(cls()), str(base / name / "1" / "model.pt"))


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("first_hour") / "models"
    base.mkdir()
    buffer = base.parent / "weights.npy"
    np.save(buffer, np.array([1.0, 0.5, -1.0, 2.0]))
    write_model(base, "readme", readme_model_py(), **{"weights.npy": buffer.read_bytes()})
    for name, code in hooks_examples().items():
        write_model(base, name, code)
    (base / "hooks_0" / "servekit.yaml").write_text("options: {scale: 3.0}\n")  # the class example
    write_model(base, "typo", TYPO_MODEL)
    broken = base / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "model.pt").write_bytes(b"not a TorchScript archive")
    shutil.copytree(TF_DATA / "saved_model_half_plus_two_cpu", base / "half_plus_two")
    save_torch_models(base)
    return base


@pytest.fixture(scope="module")
def server(models):
    with ServerProcess(models, grpc_port="auto", no_strict_readiness=True, workers=1) as running:
        yield running


def get(server, path: str, **headers: str) -> requests.Response:
    return requests.get(server.url + path, headers=headers, timeout=30)


def post(server, path: str, body) -> requests.Response:
    return requests.post(server.url + path, json=body, timeout=30)


def v2_infer_http(server, model: str, array: np.ndarray, datatype: str = "FP32", name: str = "input_0"):
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    tensor = httpclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=True)
    return client.infer(model, [tensor])


def v2_infer_grpc(server, model: str, array: np.ndarray, datatype: str = "FP32", name: str = "input_0"):
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return client.infer(model, [tensor])


def only_output(result) -> np.ndarray:
    response = result.get_response()  # a dict over HTTP, a ModelInferResponse over gRPC
    names = (
        [o["name"] for o in response["outputs"]] if isinstance(response, dict) else [o.name for o in response.outputs]
    )
    assert len(names) == 1, names
    return result.as_numpy(names[0])


# -- the docs' model.py examples answer on every protocol -------------------------------


def test_readme_model_py_answers_v1_v2_and_grpc_alike(server):
    expected = ROWS.astype(float) @ np.array([1.0, 0.5, -1.0, 2.0])
    v1 = post(server, "/v1/models/readme:predict", {"instances": ROWS.tolist()})
    assert v1.status_code == 200, v1.text
    np.testing.assert_allclose(v1.json()["predictions"], expected)
    np.testing.assert_allclose(only_output(v2_infer_http(server, "readme", ROWS)), expected)
    np.testing.assert_allclose(only_output(v2_infer_grpc(server, "readme", ROWS)), expected)


@pytest.mark.parametrize("name", [n for n, code in hooks_examples().items() if "def predict(" in code])
def test_hooks_md_predict_examples_answer_v1_v2_and_grpc_alike(server, name):
    v1 = post(server, f"/v1/models/{name}:predict", {"inputs": ROWS.tolist()})
    assert v1.status_code == 200, v1.text
    outputs = v1.json()["outputs"]
    over_http = v2_infer_http(server, name, ROWS)
    over_grpc = v2_infer_grpc(server, name, ROWS)
    names = [o["name"] for o in over_http.get_response()["outputs"]]
    assert names == [o.name for o in over_grpc.get_response().outputs] and names
    for output in names:
        values = over_http.as_numpy(output)
        np.testing.assert_allclose(over_grpc.as_numpy(output), values, rtol=1e-6)
        v1_values = outputs[output] if isinstance(outputs, dict) and len(names) > 1 else outputs
        if isinstance(v1_values, list) and v1_values and isinstance(v1_values[0], dict):  # joined stream items
            v1_values = [item[output] for item in v1_values]
        np.testing.assert_allclose(np.asarray(v1_values, dtype=float).reshape(values.shape), values, rtol=1e-6)


@pytest.mark.parametrize("name", [n for n, code in hooks_examples().items() if "def explain(" in code])
def test_hooks_md_explain_example_answers_v1_and_v2(server, name):
    v1 = post(server, f"/v1/models/{name}:explain", {"instances": ROWS.tolist()})
    assert v1.status_code == 200, v1.text
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(ROWS.shape), "data": ROWS.ravel().tolist()}]}
    v2 = post(server, f"/v2/models/{name}/explain", body)
    assert v2.status_code == 200, v2.text
    attributions = next(o for o in v2.json()["outputs"] if o["name"] == "attributions")
    np.testing.assert_allclose(np.reshape(attributions["data"], attributions["shape"]), ROWS * np.arange(4.0))


# -- PyTorch: datatypes kept, outputs named as infer names them ---------------------------


@pytest.mark.parametrize("datatype, dtype", [("FP16", np.float16), ("FP32", np.float32), ("FP64", np.float64)])
def test_torch_identity_keeps_the_client_datatype(server, datatype, dtype):
    x = np.array([1.5, -2.0, 1e300 if dtype is np.float64 else 3.0], dtype=dtype)
    for infer in (v2_infer_http, v2_infer_grpc):
        result = infer(server, "identity", x, datatype, name="x")
        assert result.get_output("output_0") is not None
        back = result.as_numpy("output_0")
        assert back.dtype == dtype, (infer.__name__, back.dtype)
        np.testing.assert_array_equal(back, x)


@pytest.mark.parametrize("name, outputs", [("named", ["total", "doubled"]), ("pair", ["output_0", "output_1"])])
def test_torchscript_tuple_outputs_are_listed_as_infer_names_them(server, name, outputs):
    meta = get(server, f"/v2/models/{name}").json()
    assert [o["name"] for o in meta["outputs"]] == outputs
    v1_meta = get(server, f"/v1/models/{name}/metadata").json()
    assert list(v1_meta["metadata"]["signature_def"]["signature_def"]["serving_default"]["outputs"]) == outputs
    result = v2_infer_http(server, name, ROWS, name="x").get_response()
    assert [o["name"] for o in result["outputs"]] == outputs


# -- TF Serving's answers -------------------------------------------------------------------


@pytest.mark.parametrize("model", ["half_plus_two", "scale"])
def test_v1_floats_beyond_float32_become_infinity(server, model):
    # TF Serving's json_tensor test FloatTensorThatExceedsMaxReturnsInf: DT_FLOAT inputs
    r = requests.post(
        server.url + f"/v1/models/{model}:predict",
        data='{"instances": [1.7976931348623157e308, -1e39, 1.0]}',
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert r.text.replace(" ", "").startswith('{"predictions":[Infinity,-Infinity,')


def test_empty_instances_say_so(server):
    for path in ("/v1/models/readme:predict", "/v1/models/half_plus_two:predict"):
        r = post(server, path, {"instances": []})
        assert r.status_code == 400
        assert "No values in 'instances'" in r.json()["error"]
        assert "scalars" not in r.json()["error"]


@pytest.mark.parametrize(
    "path",
    [
        "/v1/models/..%2F..%2F..%2Fetc%2Fpasswd",
        "/v1/models/half_plus_two/labels/..%2F..%2Fetc",
        "/v1/models/half%2Fplus/metadata",
    ],
)
def test_encoded_slashes_in_v1_paths_are_not_found(server, path):
    r = get(server, path)
    assert r.status_code == 404, (path, r.status_code, r.text)
    assert "not allowed" not in r.json()["error"]


def test_get_on_a_predict_path_is_tf_servings_malformed_request(server):
    r = get(server, "/v1/models/half_plus_two:predict")
    assert r.status_code == 400
    assert r.json()["error"].startswith("Malformed request: GET /v1/models/half_plus_two:predict")


# -- failed loads ---------------------------------------------------------------------------


def test_misspelled_hook_fails_the_load_naming_it(server):
    status = get(server, "/v1/models/typo").json()
    (version,) = status["model_version_status"]
    assert version["state"] == "END"
    assert "'predcit'" in version["status"]["error_message"]
    assert "did you mean 'predict'" in version["status"]["error_message"]
    r = post(server, "/v1/models/typo:predict", {"instances": [1.0]})
    assert r.status_code == 503 and "predcit" in r.json()["error"]


def test_failed_loads_name_the_file_and_log_the_traceback(server):
    (version,) = get(server, "/v1/models/broken").json()["model_version_status"]
    assert version["state"] == "END"
    assert "model.pt" in version["status"]["error_message"]
    assert "TorchScript" in version["status"]["error_message"]  # what was expected
    log = server.output()
    assert re.search(r"broken version 1 failed to load.*\nTraceback \(most recent call last\)", log)


# -- KServe V1: liveness at /, readiness at /v1/models/NAME -------------------------------


def test_root_is_kserve_v1_liveness_unless_html_is_asked_for(server):
    for headers in ({}, {"Accept": "*/*"}, {"Accept": "application/json"}):
        r = get(server, "/", **headers)
        assert r.status_code == 200 and r.json() == {"status": "alive"}, headers
    browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
    page = get(server, "/", Accept=browser)
    assert page.headers["Content-Type"].startswith("text/html")
    assert 'data-model="readme"' in page.text
    assert "Accept" in page.headers["Vary"]


def test_model_status_is_one_document_for_tf_serving_kserve_and_openai(server):
    # KServe's InferenceRESTClient.is_model_ready reads response.json().get("ready")
    ready = get(server, "/v1/models/readme").json()
    assert ready["name"] == "readme" and ready["ready"] is True
    assert ready["model_version_status"][0]["state"] == "AVAILABLE"
    assert ready["id"] == "readme" and ready["object"] == "model"
    failed = get(server, "/v1/models/typo")
    assert failed.status_code == 200 and failed.json()["ready"] is False


def test_openapi_document_is_valid_openapi_3(server):
    from openapi_spec_validator import validate

    validate(get(server, "/openapi.json").json())


def test_a_hugging_face_folder_copied_as_docs_say_serves_with_the_hub_off(tmp_path):
    """docs/huggingface-offline.md: the packaged all-MiniLM-L6-v2 copied into ``models/minilm/1``,
    served with ``HF_HUB_OFFLINE=1`` (and a hub address that answers nothing), called with the page's curl."""
    from generative_models import minilm_folder

    page = (ROOT / "docs" / "huggingface-offline.md").read_text()
    serve = "## 3. Serve with the hub switched off\n\n```bash\n"
    block = page[page.index(serve) + len(serve) :].split("```", 1)[0]
    serve_line, curl = block.split("\n", 1)
    assert serve_line.split("  #")[0].strip() == "HF_HUB_OFFLINE=1 servekit serve models/"
    shutil.copytree(minilm_folder(), tmp_path / "models" / "minilm" / "1")
    offline = {"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    with ServerProcess(tmp_path / "models", env=offline, workers=1) as served:
        answer = subprocess.run(
            ["bash", "-c", curl.replace("localhost:8080", served.url.removeprefix("http://"))],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    embedding = json.loads(answer.stdout)["data"][0]["embedding"]
    assert len(embedding) == 384, answer.stdout[:500]
