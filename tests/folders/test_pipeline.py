"""Pipelines (Triton's ensembles): steps wired by tensor names, each run on its own model."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from repo_paths import DATA
from servekit.folders import pipeline
from servekit.folders.servekit_yaml import ConfigError, parse_model_config, read_raw_config

TRITON = DATA / "triton"
A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)


def test_pipeline_is_checked_when_read():
    raw = {
        "inputs": ["x"],
        "outputs": ["y"],
        "steps": [{"model": "m", "inputs": {"IN": "x"}, "outputs": {"OUT": "y"}}],
    }
    parsed = pipeline.parse(raw)
    assert [s.model for s in parsed.steps] == ["m"] and parsed.outputs[0].name == "y"
    bad = [
        ({**raw, "steps": []}, "at least one step"),
        ({**raw, "outputs": ["z"]}, "made by no step"),
        ({**raw, "steps": [{"model": "m", "inputs": {"IN": "w"}, "outputs": {"OUT": "y"}}]}, "takes w"),
        ({**raw, "steps": [{"model": "m", "inputs": {"IN": "x"}}]}, "'outputs' must map"),
        ({**raw, "extra": 1}, "takes inputs, outputs and steps"),
    ]
    for doc, message in bad:
        with pytest.raises(pipeline.PipelineError, match=message):
            pipeline.parse(doc)
    with pytest.raises(ConfigError, match="servekit.yaml: pipeline step 1"):
        parse_model_config({"pipeline": {**raw, "steps": [{"model": ""}]}})


def test_triton_ensemble_config_maps_onto_a_pipeline(tmp_path):
    shutil.copytree(TRITON / "simple_ensemble", tmp_path / "e")
    raw = read_raw_config(tmp_path / "e")
    steps = raw["pipeline"]["steps"]
    assert [s["model"] for s in steps] == ["simple", "simple"] and "version" not in steps[0]
    assert steps[0]["inputs"] == {"INPUT0": "A", "INPUT1": "B"}
    assert steps[1]["outputs"] == {"OUTPUT0": "TWICE_A", "OUTPUT1": "TWICE_B"}
    assert raw["pipeline"]["inputs"][0] == {"name": "A", "datatype": "INT32", "shape": [1, 16]}
    assert parse_model_config(raw).pipeline is not None


@pytest.fixture
def repo(tmp_path) -> Path:
    for name in ("simple", "simple_pipeline", "simple_ensemble"):
        shutil.copytree(TRITON / name, tmp_path / name)
    return tmp_path


def tensors(a=A, b=B, names=("INPUT0", "INPUT1")) -> list[dict]:
    return [
        {"name": n, "shape": list(v.shape), "datatype": "INT32", "data": v.reshape(-1).tolist()}
        for n, v in zip(names, (a, b))
    ]


def test_pipeline_and_ensemble_answer_in_process(servekit_app, repo):
    client = servekit_app(repo)
    got = client.post("/v2/models/simple_pipeline/infer", json={"inputs": tensors()}).get_json()
    outputs = {o["name"]: o["data"] for o in got["outputs"]}
    assert outputs == {"DOUBLE_A": (2 * A).reshape(-1).tolist(), "DOUBLE_B": (2 * B).reshape(-1).tolist()}
    got = client.post("/v2/models/simple_ensemble/infer", json={"inputs": tensors(names=("A", "B"))}).get_json()
    assert {o["name"] for o in got["outputs"]} == {"TWICE_A", "TWICE_B"}
    meta = client.get("/v2/models/simple_ensemble").get_json()
    # a Triton ensemble reports the platform Triton does; a servekit.yaml pipeline its own
    assert meta["platform"] == "ensemble" and [i["name"] for i in meta["inputs"]] == ["A", "B"]
    assert client.get("/v2/models/simple_pipeline").get_json()["platform"] == "pipeline"
    assert meta["inputs"][0]["datatype"] == "INT32" and meta["inputs"][0]["shape"] == [1, 16]


def test_pipeline_errors_name_the_step(servekit_app, repo):
    client = servekit_app(repo)
    response = client.post("/v2/models/simple_pipeline/infer", json={"inputs": tensors()[:1]})
    assert response.status_code == 400 and "needs input(s) INPUT1" in response.get_json()["error"]
    bad = tensors(a=np.zeros((1, 8), np.int32))
    response = client.post(
        "/v2/models/simple_ensemble/infer", json={"inputs": [{**bad[0], "name": "A"}, tensors()[1] | {"name": "B"}]}
    )
    assert response.status_code == 400 and "shape" in response.get_json()["error"]
    (repo / "simple_pipeline" / "servekit.yaml").write_text(
        "pipeline: {inputs: [x], outputs: [y], steps: [{model: gone, inputs: {IN: x}, outputs: {OUT: y}}]}\n"
    )
    client = servekit_app(repo)
    response = client.post(
        "/v2/models/simple_pipeline/infer",
        json={"inputs": [{"name": "x", "shape": [1], "datatype": "INT32", "data": [1]}]},
    )
    assert response.status_code == 404 and "pipeline 'simple_pipeline', step 'gone'" in response.get_json()["error"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    pytest.importorskip("tritonclient.grpc")
    from servekit.testing import ServerProcess

    base = tmp_path_factory.mktemp("pipelines")
    for name in ("simple", "simple_ensemble"):
        shutil.copytree(TRITON / name, base / name)
    with ServerProcess(base, grpc_port="auto", workers=2, threads=4) as running:
        yield running


@pytest.mark.slow
@pytest.mark.parametrize("wire", ["http", "grpc"])
def test_ensemble_through_tritonclient(server, wire):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    module = httpclient if wire == "http" else grpcclient
    port = server.http_port if wire == "http" else server.grpc_port
    client = module.InferenceServerClient(f"127.0.0.1:{port}")
    assert client.is_model_ready("simple_ensemble")
    inputs = [module.InferInput("A", [1, 16], "INT32"), module.InferInput("B", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(A)
    inputs[1].set_data_from_numpy(B)
    outputs = [module.InferRequestedOutput("TWICE_B")]
    result = client.infer("simple_ensemble", inputs, outputs=outputs)
    assert result.as_numpy("TWICE_B").tolist() == (2 * B).tolist()
    assert result.as_numpy("TWICE_A") is None  # only what was asked for
    # the ensemble's declared shapes hold, as a model's do
    from tritonclient.utils import InferenceServerException

    wrong = [module.InferInput("A", [1, 8], "INT32"), module.InferInput("B", [1, 16], "INT32")]
    wrong[0].set_data_from_numpy(A[:, :8].copy())
    wrong[1].set_data_from_numpy(B)
    with pytest.raises(InferenceServerException, match="does not match the model's shape"):
        client.infer("simple_ensemble", wrong)
