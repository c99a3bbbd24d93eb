"""What a client's wrong values get from every framework's generated container: a 400, never the model's 500.

Each framework ``servekit new`` offers is baked once, trained by its own tests
(``tests/support/generated_projects.py``: the projects ``tests/scaffold/test_scaffold.py``
checks) and served, all of them by one server (V1, V2 over HTTP, V2 over
gRPC).  A row with NaN, ±Infinity, a string where a number is declared, a
nested list where a scalar is, a boolean or a null answers 400 with an error
message on every wire, while the same row with good values answers 200.  The
text classifier (huggingface) gets the same values where it takes text.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import requests
from generated_projects import NEEDS, generated
from servekit.testing import ServerProcess

pytestmark = pytest.mark.slow  # bakes projects, trains their models and starts a server

grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException

FRAMEWORKS = [f for f, modules in NEEDS.items() if all(importlib.util.find_spec(m) for m in modules)]
#: models that read NaN as a missing value: their plugin declares it (allow_nan), so NaN answers
NAN_IS_MISSING = {"xgboost", "lightgbm"}
#: (case, the value as a JSON token) sent in place of the first number
BAD = [
    ("nan", "NaN"),
    ("infinity", "Infinity"),
    ("-infinity", "-Infinity"),
    ("string", '"1.5"'),
    ("nested list", "[1.5, 2.5]"),
    ("boolean", "true"),
    ("null", "null"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # the projects tests/scaffold/test_scaffold.py checks, baked and trained once per run; served
    # under the framework's name
    base = tmp_path_factory.mktemp("generated")
    for framework in FRAMEWORKS:
        (base / framework).symlink_to(generated(tmp_path_factory, framework).folder, target_is_directory=True)
    with ServerProcess(base, grpc_port="auto", workers=1, threads=4) as running:
        yield running


def declared(server, model: str) -> tuple[list[dict], int]:
    """The model's declared inputs and how many numbers one row holds."""
    inputs = requests.get(f"{server.url}/v2/models/{model}", timeout=30).json()["inputs"]
    if len(inputs) > 1:
        return inputs, len(inputs)  # one input per feature
    shape = inputs[0]["shape"]
    return inputs, shape[1] if len(shape) == 2 else 1


def v1_bodies(server, model: str, token: str) -> dict[str, str]:
    if model == "huggingface":
        return {"instances": f'{{"instances": [{token}, "a fine film"]}}', "inputs": f'{{"inputs": [{token}]}}'}
    inputs, width = declared(server, model)
    row = "[" + ", ".join([token] + ["1.5"] * (width - 1)) + "]"
    bodies = {"instances": f'{{"instances": [{row}]}}', "inputs": f'{{"inputs": [{row}]}}'}
    if len(inputs) > 1:  # columns by name too
        columns = ", ".join(f'"{t["name"]}": [{token if i == 0 else "1.5"}]' for i, t in enumerate(inputs))
        bodies["named columns"] = f'{{"inputs": {{{columns}}}}}'
    return bodies


def v2_body(server, model: str, token: str) -> str:
    inputs, width = declared(server, model)
    if model == "huggingface":
        return f'{{"inputs": [{{"name": "text", "datatype": "BYTES", "shape": [1], "data": [{token}]}}]}}'
    if len(inputs) > 1:
        tensors = [
            f'{{"name": "{t["name"]}", "datatype": "{t["datatype"]}", "shape": [1], "data": [{token if i == 0 else "1.5"}]}}'
            for i, t in enumerate(inputs)
        ]
        return f'{{"inputs": [{", ".join(tensors)}]}}'
    spec = inputs[0]
    data = ", ".join([token] + ["1.5"] * (width - 1))
    return f'{{"inputs": [{{"name": "{spec["name"]}", "datatype": "{spec["datatype"]}", "shape": [1, {width}], "data": [{data}]}}]}}'


def post(server, path: str, body: str) -> requests.Response:
    return requests.post(server.url + path, data=body, headers={"Content-Type": "application/json"}, timeout=60)


def assert_refused(response: requests.Response, what: str) -> None:
    assert response.status_code == 400, f"{what}: {response.status_code} {response.text[:500]}"
    assert response.json()["error"], what


def assert_answered(response: requests.Response, what: str) -> None:
    assert response.status_code == 200, f"{what}: {response.status_code} {response.text[:500]}"


@pytest.mark.parametrize("model", FRAMEWORKS)
def test_the_project_s_own_requests_answer(server, model):
    """``servekit serve`` answers the requests the project ships (its README's examples)."""
    project = Path(server.paths[0]) / model
    for path, wire in (
        ("v1-predict.json", f"/v1/models/{model}:predict"),
        ("v2-infer.json", f"/v2/models/{model}/infer"),
    ):
        r = post(server, wire, (project / "requests" / path).read_text())
        assert r.status_code == 200, (path, r.text)
        assert r.json().get("predictions" if path.startswith("v1") else "outputs"), r.text


@pytest.mark.parametrize("model", FRAMEWORKS)
def test_good_values_answer(server, model):
    good = '"a fine film"' if model == "huggingface" else "1.5"
    for wire, body in v1_bodies(server, model, good).items():
        r = post(server, f"/v1/models/{model}:predict", body)
        assert r.status_code == 200, (wire, r.text)
    r = post(server, f"/v2/models/{model}/infer", v2_body(server, model, good))
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("case, token", BAD, ids=[case for case, _ in BAD])
@pytest.mark.parametrize("model", FRAMEWORKS)
def test_bad_values_answer_400_over_v1_and_v2(server, model, case, token):
    if model == "huggingface" and case == "string":
        pytest.skip("a string is what the text classifier takes")
    check = assert_answered if case == "nan" and model in NAN_IS_MISSING else assert_refused
    for wire, body in v1_bodies(server, model, token).items():
        check(post(server, f"/v1/models/{model}:predict", body), f"V1 {wire} with {case}")
    check(post(server, f"/v2/models/{model}/infer", v2_body(server, model, token)), f"V2 with {case}")


def grpc_tensors(server, model: str, value: np.ndarray) -> list:
    """The model's inputs as tritonclient tensors: ``value`` in the first place, good numbers elsewhere."""
    inputs, width = declared(server, model)

    def numbers(shape: tuple[int, ...], datatype: str) -> np.ndarray:
        return np.full(shape, 1.5, dtype=np.float32 if datatype == "FP32" else np.float64)

    def tensor(name: str, array: np.ndarray, datatype: str):
        kind = {"b": "BOOL", "O": "BYTES"}.get(array.dtype.kind, datatype if datatype in ("FP32", "FP64") else "FP64")
        made = grpcclient.InferInput(name, list(array.shape), kind)
        made.set_data_from_numpy(array.astype(np.float32) if kind == "FP32" else array)
        return made

    if len(inputs) > 1 or width == 1:  # one input per feature (or the one text input)
        first = inputs[0]
        rest = [tensor(t["name"], numbers((1,), t["datatype"]), t["datatype"]) for t in inputs[1:]]
        return [tensor(first["name"], value, first["datatype"]), *rest]
    spec = inputs[0]
    if value.ndim > 1:  # a list where a number belongs: one axis too many
        rows = numbers((1, width, 1), spec["datatype"])
    elif value.dtype.kind in "bO":
        rows = np.repeat(value, width).reshape(1, width)
    else:
        rows = numbers((1, width), spec["datatype"]).astype(np.float64)
        rows[0, 0] = value[0]
    return [tensor(spec["name"], rows, spec["datatype"])]


GRPC_BAD = [
    ("nan", np.array([np.nan])),
    ("infinity", np.array([np.inf])),
    ("-infinity", np.array([-np.inf])),
    ("string", np.array([b"1.5"], dtype=object)),
    ("nested list", np.array([[1.5]])),
    ("boolean", np.array([True])),
]


@pytest.mark.parametrize("case, value", GRPC_BAD, ids=[case for case, _ in GRPC_BAD])
@pytest.mark.parametrize("model", FRAMEWORKS)
def test_bad_values_are_invalid_argument_over_grpc(server, model, case, value):
    if model == "huggingface" and case == "string":
        pytest.skip("a string is what the text classifier takes")
    tensors = grpc_tensors(server, model, value)
    if case == "nan" and model in NAN_IS_MISSING:
        with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
            assert client.infer(model, tensors).get_response().outputs
        return
    with (
        grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client,
        pytest.raises(InferenceServerException) as refused,
    ):
        client.infer(model, tensors)
    assert "INVALID_ARGUMENT" in str(refused.value.status()), (case, refused.value.message())
