"""Triton's classification extension: ranking, formatting, labels, the parameter on both wires."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from repo_paths import DATA
from servekit.codecs import v2 as codec
from servekit.dataplane import classification
from servekit.errors import BadRequest
from servekit.folders import pbtxt
from sklearn_models import fit_iris

TRITON = DATA / "triton"


def test_top_classes_formats_as_triton_does():
    # the example of Triton's extension document, std::to_string's six decimals
    got = classification.top_classes(np.array([1.1, 3.3, 0.5, 2.4], np.float32), 2, batched=False)
    assert got.shape == (2,) and got.tolist() == [b"3.300000:1", b"2.400000:3"]
    labels = ["a", "b", "c", "d"]
    got = classification.top_classes(np.array([1.1, 3.3, 0.5, 2.4]), 2, batched=False, labels=labels)
    assert got.tolist() == [b"3.300000:1:b", b"2.400000:3:d"]


def test_top_classes_keeps_the_batch_dimension_of_a_batching_model():
    scores = np.array([[1, 5, 10, 4], [3, 3, 1, 0]], np.uint8)
    got = classification.top_classes(scores, 3, batched=True, labels=["x", "y", "z"])
    # integers print as integers; equal values keep index order; index 3 has no label
    assert got.tolist() == [[b"10:2:z", b"5:1:y", b"4:3"], [b"3:0:x", b"3:1:y", b"1:2:z"]]
    flat = classification.top_classes(scores, 2, batched=False)
    assert flat.tolist() == [b"10:2", b"5:1"]  # unbatched: the tensor ranked as a whole


def test_top_classes_clamps_the_count_and_refuses_unranked_types():
    assert classification.top_classes(np.array([[0.5, 0.25]]), 9, batched=True).shape == (1, 2)
    for arr in (np.array([True]), np.array([b"x"], dtype=object), np.array([1], np.float16)):
        with pytest.raises(BadRequest, match="class result not available for output due to unsupported type"):
            classification.top_classes(arr, 1, batched=False)


def test_pbtxt_reads_triton_configs_without_a_schema():
    doc = pbtxt.loads(
        """
        name: "m"  # a comment
        max_batch_size: 8
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ 16 ] reshape { shape: [ 1, 16 ] } } ]
        output { name: "A" label_filename: "a.txt" }
        output { name: "B" }
        parameters: { key: "k" value: { string_value: "v" } }
        """
    )
    assert doc["name"] == "m" and doc["max_batch_size"] == 8
    assert doc["input"] == [{"name": "IN", "data_type": "TYPE_FP32", "dims": [16], "reshape": {"shape": [1, 16]}}]
    assert [o["name"] for o in pbtxt.repeated(doc, "output")] == ["A", "B"]
    assert doc["parameters"] == {"key": "k", "value": {"string_value": "v"}}
    with pytest.raises(pbtxt.ParseError):
        pbtxt.loads("output { name: 'x'")


def test_requested_output_parameter_is_checked():
    body = b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}], "outputs": %s}'
    req = codec.decode_infer_request(body % b'[{"name": "y", "parameters": {"classification": 3}}]')
    assert req.outputs is not None and req.outputs[0].classification == 3
    for bad in (b'"3"', b"-1", b"1.5", b"true"):
        with pytest.raises(BadRequest, match="'classification' must be a positive integer"):
            codec.decode_infer_request(body % (b'[{"name": "y", "parameters": {"classification": %s}}]' % bad))


@pytest.fixture
def classifier_repo(tmp_path) -> Path:
    shutil.copytree(TRITON / "classifier", tmp_path / "classifier")
    fit_iris(tmp_path / "iris", named=False)
    return tmp_path


def infer(client, model: str, doc: dict) -> dict:
    response = client.post(f"/v2/models/{model}/infer", json=doc)
    return {"status": response.status_code, **response.get_json()}


ROWS = {"name": "INPUT", "shape": [2, 4], "datatype": "FP32", "data": [1, 2, 3, 4, 4, 3, 2, 1]}


def test_labels_from_config_pbtxt_and_batch_rows(servekit_app, classifier_repo):
    client = servekit_app(classifier_repo)
    doc = {"inputs": [ROWS], "outputs": [{"name": "PROBS", "parameters": {"classification": 2}}, {"name": "COUNTS"}]}
    got = infer(client, "classifier", doc)
    assert got["status"] == 200, got
    probs, counts = got["outputs"]
    assert (probs["datatype"], probs["shape"]) == ("BYTES", [2, 2])
    assert probs["data"] == ["0.500000:4:total", "0.200000:3:yellow", "0.500000:4:total", "0.200000:0:red"]
    assert counts["datatype"] == "INT32" and counts["shape"] == [2, 5]  # asked for as itself
    # COUNTS has no label file: value:index only
    doc["outputs"] = [{"name": "COUNTS", "parameters": {"classification": 1}}]
    assert infer(client, "classifier", doc)["outputs"][0]["data"] == ["50:4", "50:4"]


ENSEMBLE = """
name: "ranked"
platform: "ensemble"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [
  { name: "P" data_type: TYPE_FP32 dims: [ 5 ] %s},
  { name: "C" data_type: TYPE_INT32 dims: [ 5 ] }
]
ensemble_scheduling {
  step [ {
    model_name: "classifier"
    model_version: -1
    input_map { key: "INPUT" value: "X" }
    output_map { key: "PROBS" value: "P" }
    output_map { key: "COUNTS" value: "C" }
  } ]
}
"""


@pytest.mark.parametrize("own", [False, True], ids=["step-labels", "own-labels"])
def test_an_ensemble_output_takes_the_labels_of_the_step_that_makes_it(servekit_app, classifier_repo, own):
    """As Triton: the ensemble's own label_filename when it declares one, else its producing step's."""
    folder = classifier_repo / "ranked"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(ENSEMBLE % ('label_filename: "mine.txt" ' if own else ""))
    (folder / "mine.txt").write_text("m0\nm1\nm2\nm3\nm4\n")
    client = servekit_app(classifier_repo)
    rows = {**ROWS, "name": "X"}
    doc = {"inputs": [rows], "outputs": [{"name": n, "parameters": {"classification": 1}} for n in ("P", "C")]}
    got = infer(client, "ranked", doc)
    assert got["status"] == 200, got
    probs, counts = got["outputs"]
    assert probs["data"] == (["0.500000:4:m4"] * 2 if own else ["0.500000:4:total"] * 2)
    assert counts["data"] == ["50:4", "50:4"]  # the step's COUNTS has no labels: nor has C


def test_labels_txt_beside_a_model_and_sklearn_classes(servekit_app, classifier_repo):
    (classifier_repo / "classifier" / "config.pbtxt").unlink()
    (classifier_repo / "classifier" / "labels.txt").write_text("a\nb\nc\nd\ne\n")
    client = servekit_app(classifier_repo)
    doc = {"inputs": [ROWS], "outputs": [{"name": "COUNTS", "parameters": {"classification": 1}}]}
    assert infer(client, "classifier", doc)["outputs"][0]["data"] == ["50:4:e", "50:4:e"]
    iris = {
        "inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP64", "data": [5.1, 3.5, 1.4, 0.2]}],
        "parameters": {"signature_name": "predict_proba"},
        "outputs": [{"name": "predict_proba", "parameters": {"classification": 3}}],
    }
    got = infer(client, "iris", iris)
    assert got["status"] == 200, got
    (out,) = got["outputs"]
    # iris does not batch: the whole tensor is ranked, labelled with the classifier's classes_
    assert out["shape"] == [3] and out["data"][0].endswith(":0:setosa")
    assert [s.split(":")[2] for s in out["data"]] == ["setosa", "versicolor", "virginica"]


def test_unranked_output_is_a_client_error(servekit_app, tmp_path):
    shutil.copytree(TRITON / "simple_string", tmp_path / "simple_string")
    client = servekit_app(tmp_path)
    data = [str(i) for i in range(16)]
    doc = {
        "inputs": [{"name": n, "shape": [1, 16], "datatype": "BYTES", "data": data} for n in ("INPUT0", "INPUT1")],
        "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 2}}],
    }
    got = infer(client, "simple_string", doc)
    assert got["status"] == 400 and "unsupported type 'BYTES'" in got["error"]


def test_server_metadata_lists_the_extension(servekit_app, classifier_repo):
    assert "classification" in servekit_app(classifier_repo).get("/v2").get_json()["extensions"]
