"""The ONNX plugin in-process: graph metadata, dtype casting, execution providers, threads, bad input."""

from __future__ import annotations

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")
from framework_models import data, graph_onnx, sklearn_onnx
from servekit.types import ModelConfig
from servekit_onnx.session import load_session, providers_for

ROWS = data()[0][:5]


def test_a_scikit_learn_model_answers_as_onnx_runtime(tmp_path, servekit_app):
    pytest.importorskip("skl2onnx")
    file, estimator = sklearn_onnx(tmp_path / "m" / "1")
    session = ort.InferenceSession(str(file), providers=["CPUExecutionProvider"])
    label, proba = session.run(None, {"X": ROWS.astype(np.float32)})
    client = servekit_app(tmp_path)
    out = client.post("/v1/models/m:predict", json={"instances": ROWS.tolist()}).get_json()["predictions"]
    assert [row["label"] for row in out] == label.tolist()
    assert np.array_equal(np.asarray([row["probabilities"] for row in out], np.float32), proba)
    assert label.tolist() == estimator.predict(ROWS).tolist()


def test_metadata_is_the_graphs_with_dynamic_dims(tmp_path, servekit_app):
    graph_onnx(tmp_path / "g" / "1")
    client = servekit_app(tmp_path)
    meta = client.get("/v2/models/g").get_json()
    assert meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [
        {"name": "x", "datatype": "FP32", "shape": [-1, 3]},
        {"name": "n", "datatype": "INT64", "shape": [-1]},
        {"name": "text", "datatype": "BYTES", "shape": [-1]},
    ]
    assert [o["name"] for o in meta["outputs"]] == ["doubled", "counts", "words"]


def test_json_numbers_are_cast_to_the_graphs_types(tmp_path, servekit_app):
    graph_onnx(tmp_path / "g" / "1")
    client = servekit_app(tmp_path)
    body = {
        "inputs": [
            {"name": "x", "datatype": "FP64", "shape": [2, 3], "data": [1, 2, 3, 4, 5, 6.5]},
            {"name": "n", "datatype": "FP64", "shape": [2], "data": [1.0, 41.0]},
            {"name": "text", "datatype": "BYTES", "shape": [2], "data": ["a", "b"]},
        ],
        "outputs": [{"name": "counts"}, {"name": "words"}],
    }
    outputs = {o["name"]: o for o in client.post("/v2/models/g/infer", json=body).get_json()["outputs"]}
    assert set(outputs) == {"counts", "words"}
    assert outputs["counts"]["datatype"] == "INT64" and outputs["counts"]["data"] == [2, 42]
    assert outputs["words"]["data"] == ["a", "b"]


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"x": [[1, 2]], "n": [1], "text": ["a"]}, "shape [1, 2] does not match the model's shape [-1, 3]"),
        ({"x": [[1, 2, 3]], "n": [1.5], "text": ["a"]}, "integers, found fractions"),
        ({"x": [["a", "b", "c"]], "n": [1], "text": ["a"]}, "expected numbers, found the string 'a'"),
        ({"x": [[1, 2, 3]], "n": [1], "text": [1]}, "takes strings"),
        ({"x": [[1, 2, 3]], "n": [1]}, "expected inputs"),
    ],
)
def test_bad_inputs_are_a_400(tmp_path, servekit_app, inputs, message):
    graph_onnx(tmp_path / "g" / "1")
    client = servekit_app(tmp_path)
    r = client.post("/v1/models/g:predict", json={"inputs": inputs})
    assert r.status_code == 400 and message in r.get_json()["error"], r.get_json()


def test_a_single_input_model_takes_an_unnamed_tensor_but_not_a_misnamed_one(tmp_path, servekit_app):
    pytest.importorskip("skl2onnx")
    sklearn_onnx(tmp_path / "m" / "1")
    client = servekit_app(tmp_path)
    assert client.post("/v1/models/m:predict", json={"instances": ROWS.tolist()}).status_code == 200
    body = {"inputs": [{"name": "rows", "datatype": "FP32", "shape": [1, 4], "data": ROWS[0].tolist()}]}
    r = client.post("/v2/models/m/infer", json=body)
    assert r.status_code == 400 and "'X'" in r.get_json()["error"]


def test_threads_follow_the_workers_share_of_the_cpus(tmp_path, monkeypatch):
    from servekit.server.cpus import WORKERS_ENV, available_cpus

    file = graph_onnx(tmp_path)
    monkeypatch.setenv(WORKERS_ENV, str(available_cpus() * 4))
    assert load_session(file, ModelConfig()).threads == 1
    monkeypatch.delenv(WORKERS_ENV)
    assert load_session(file, ModelConfig()).threads == available_cpus()
    assert load_session(file, ModelConfig(options={"intra_op_threads": 3})).threads == 3


def test_providers_follow_the_device():
    cpu_only = ["CPUExecutionProvider"]
    with_cuda = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert providers_for("auto", cpu_only) == ["CPUExecutionProvider"]
    assert providers_for("cpu", with_cuda) == ["CPUExecutionProvider"]
    assert providers_for("auto", with_cuda)[0] == ("CUDAExecutionProvider", {"device_id": 0})
    assert providers_for("cuda:1", with_cuda)[0] == ("CUDAExecutionProvider", {"device_id": 1})
    with pytest.raises(ValueError, match="onnxruntime-gpu"):
        providers_for("cuda", cpu_only)
    with pytest.raises(ValueError, match="cuda:N"):
        providers_for("gpu", with_cuda)


def test_asking_for_cuda_without_it_fails_the_load_saying_why(tmp_path, servekit_app):
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this ONNX Runtime has CUDA")
    graph_onnx(tmp_path / "g" / "1")
    (tmp_path / "g" / "servekit.yaml").write_text("device: cuda\n")
    client = servekit_app(tmp_path)
    status = client.get("/v1/models/g").get_json()["model_version_status"][0]
    assert status["state"] == "END" and "onnxruntime-gpu" in status["status"]["error_message"]


def test_a_broken_file_fails_the_load_naming_it(tmp_path, servekit_app):
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.onnx").write_bytes(b"not a protobuf")
    client = servekit_app(tmp_path)
    status = client.get("/v1/models/m").get_json()["model_version_status"][0]
    assert status["state"] == "END" and "model.onnx" in status["status"]["error_message"]


def test_a_graph_of_one_input_per_feature_takes_one_tensor_of_rows(tmp_path, servekit_app):
    """A graph of one ``[-1, 1]`` input per feature (as skl2onnx makes from DataFrame columns):
    a ``[rows, features]`` tensor under any name fills them, as the tree boosters' plugins take it."""
    import onnx
    from onnx import TensorProto, helper

    names = ["a", "b", "c", "d"]
    graph = helper.make_graph(
        [helper.make_node("Concat", names, ["rows"], axis=1)],
        "columns",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 1]) for n in names],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["N", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8
    (tmp_path / "m" / "1").mkdir(parents=True)
    onnx.save(model, tmp_path / "m" / "1" / "model.onnx")
    client = servekit_app(tmp_path)
    assert [t["shape"] for t in client.get("/v2/models/m").get_json()["inputs"]] == [[-1, 1]] * 4
    columns = [
        {"name": n, "datatype": "FP32", "shape": [5, 1], "data": ROWS[:, i].tolist()} for i, n in enumerate(names)
    ]
    by_feature = client.post("/v2/models/m/infer", json={"inputs": columns}).get_json()["outputs"]
    rows = [{"name": "input", "datatype": "FP32", "shape": [5, 4], "data": ROWS.reshape(-1).tolist()}]
    r = client.post("/v2/models/m/infer", json={"inputs": rows})
    assert r.status_code == 200 and r.get_json()["outputs"] == by_feature
    rows[0].update(shape=[4, 5])
    r = client.post("/v2/models/m/infer", json={"inputs": rows})
    assert r.status_code == 400 and "rows of 4 features" in r.get_json()["error"]


def test_nan_is_refused_unless_options_allow_nan(tmp_path, servekit_app):
    pytest.importorskip("skl2onnx")
    sklearn_onnx(tmp_path / "strict" / "1")
    sklearn_onnx(tmp_path / "missing" / "1")
    (tmp_path / "missing" / "servekit.yaml").write_text("options: {allow_nan: true}\n")
    client = servekit_app(tmp_path)
    body = '{"instances": [[1, NaN, 2, 3]]}'
    r = client.post("/v1/models/strict:predict", data=body, content_type="application/json")
    assert r.status_code == 400 and "input 'X' contains NaN at row 0 column 1" in r.get_json()["error"]
    r = client.post("/v1/models/missing:predict", data=body, content_type="application/json")
    assert r.status_code == 200  # the graph's answer (a linear model's: NaN), as asked
