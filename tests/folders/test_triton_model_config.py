"""A model folder's Triton ``config.pbtxt`` -> its configuration document and metadata.

The reading is checked against protobuf's own text-format parser on Triton's
full ``ModelConfig`` (tritonclient's ``model_config_pb2``): the JSON servekit
builds without a schema must be what protobuf's JSON mapping gives.  The
documents themselves are checked through the V2 HTTP routes of an in-process app.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest
from repo_paths import DATA
from servekit.folders import triton_config as triton_model_config
from servekit.types import TensorSpec

MODELS = DATA / "triton"

#: Most kinds of field a Triton user's config.pbtxt holds: repeated fields given once and
#: as lists, maps of strings and of messages, enums, nested messages, comments.
FULL = textwrap.dedent("""
    name: "full"  # the folder's name
    backend: "python"
    max_batch_size: 8
    input { name: "IMAGE" data_type: TYPE_UINT8 format: FORMAT_NHWC dims: [ 32, 32, 3 ] }
    input [
      { name: "MASK" data_type: TYPE_BOOL dims: 1 optional: true },
      { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] reshape: { shape: [ ] } }
    ]
    output { name: "SCORES" data_type: TYPE_FP32 dims: [ 10 ] label_filename: "labels.txt" }
    instance_group { kind: KIND_GPU count: 2 gpus: 0 }
    instance_group [ { kind: KIND_CPU, count: 1, name: "cpu" } ]
    dynamic_batching {
      preferred_batch_size: [ 4, 8 ]
      max_queue_delay_microseconds: 100
      priority_queue_policy { key: 1 value: { max_queue_size: 5 } }
    }
    parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }
    parameters [ { key: "threads", value: { string_value: "4" } } ]
    model_warmup {
      name: "zeros"
      batch_size: 2
      inputs { key: "IMAGE" value: { data_type: TYPE_UINT8 dims: [ 32, 32, 3 ] zero_data: true } }
    }
    optimization { cuda { graphs: true graph_spec { batch_size: 1 input { key: "IMAGE" value: { dim: [ 32, 32, 3 ] } } } } }
    response_cache { enable: true }
""")


def folder_with(tmp_path: Path, text: str, name: str = "full") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.pbtxt").write_text(text)
    return folder


def protobuf_reading(text: str) -> dict:
    """What protobuf's text format parser and JSON mapping make of ``text``, on Triton's own schema."""
    json_format = pytest.importorskip("google.protobuf.json_format")
    text_format = pytest.importorskip("google.protobuf.text_format")
    triton = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    message = text_format.Parse(text, triton.ModelConfig())
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def as_protobuf_json(doc: dict) -> dict:
    """``doc`` through servekit's ModelConfig message and back (int64 become strings, as protobuf writes them)."""
    json_format = pytest.importorskip("google.protobuf.json_format")
    from servekit.protocols.grpc.protos.inference import model_config_pb2

    message = json_format.ParseDict(doc, model_config_pb2.ModelConfig())
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def test_read_gives_what_protobuf_gives_on_tritons_schema(tmp_path):
    doc = triton_model_config.read(folder_with(tmp_path, FULL))
    assert doc is not None
    assert as_protobuf_json(doc) == protobuf_reading(FULL)
    # the schema's shapes without the schema: lists, maps as objects, numbers as numbers
    assert [t["name"] for t in doc["input"]] == ["IMAGE", "MASK", "TEXT"]
    assert doc["input"][1]["dims"] == [1] and doc["input"][2]["reshape"] == {"shape": []}
    assert doc["output"] == [{"name": "SCORES", "data_type": "TYPE_FP32", "dims": [10], "label_filename": "labels.txt"}]
    assert doc["instance_group"][0] == {"kind": "KIND_GPU", "count": 2, "gpus": [0]}
    assert doc["parameters"] == {
        "EXECUTION_ENV_PATH": {"string_value": "$$TRITON_MODEL_DIRECTORY/env.tar.gz"},
        "threads": {"string_value": "4"},
    }
    assert doc["dynamic_batching"]["priority_queue_policy"] == {"1": {"max_queue_size": 5}}
    assert doc["model_warmup"][0]["inputs"]["IMAGE"]["zero_data"] is True


@pytest.mark.parametrize(
    "name",
    [
        "classifier",
        "simple_ensemble",
        "inception_graphdef",
        "densenet_onnx",
        "image_preprocess_model",
        "preprocess_inception_ensemble",
    ],
)
def test_the_example_folders_read_as_protobuf_reads_them(name):
    text = (MODELS / name / "config.pbtxt").read_text()
    assert as_protobuf_json(triton_model_config.read(MODELS / name)) == protobuf_reading(text)


def test_read_without_a_file_and_with_a_broken_one(tmp_path):
    assert triton_model_config.read(tmp_path) is None
    assert triton_model_config.read(None) is None
    with pytest.raises(triton_model_config.TritonConfigError, match=r"config.pbtxt: cannot be read"):
        triton_model_config.read(folder_with(tmp_path, 'name: "x" input { name: "a" '))


def test_metadata_from_the_configuration_has_the_batch_dimension():
    def spec(name, datatype, shape):  # Triton hands NaN and infinity to the model: so does its folder
        return TensorSpec(name, datatype, shape, allow_nan=True, allow_infinity=True)

    meta = triton_model_config.metadata(triton_model_config.read(MODELS / "inception_graphdef"))
    assert meta is not None and meta.platform == "python"
    signature = meta.signature()
    assert signature.inputs == [spec("input", "FP32", [-1, 299, 299, 3])]
    assert signature.outputs == [spec("InceptionV3/Predictions/Softmax", "FP32", [-1, 4])]
    unbatched = triton_model_config.metadata(triton_model_config.read(MODELS / "densenet_onnx"))
    assert unbatched.signature().inputs == [spec("data_0", "FP32", [3, 224, 224])]
    ensemble = triton_model_config.metadata(triton_model_config.read(MODELS / "preprocess_inception_ensemble"))
    assert ensemble.platform == "ensemble"
    assert ensemble.signature().inputs == [spec("INPUT", "BYTES", [-1, 1])]
    assert triton_model_config.metadata({"name": "x", "max_batch_size": 4}) is None
    assert triton_model_config.metadata(None) is None


# -- the documents, through the V2 HTTP routes ------------------------------------------------------


@pytest.fixture
def image_repo(tmp_path) -> Path:
    for name in ("inception_graphdef", "densenet_onnx", "simple"):
        shutil.copytree(MODELS / name, tmp_path / name)
    return tmp_path


def test_config_document_is_the_folders_with_servekits_settings_over_it(image_repo, servekit_app):
    client = servekit_app(image_repo)
    config = client.get("/v2/models/inception_graphdef/config").get_json()
    assert list(config)[:7] == ["name", "platform", "backend", "version_policy", "max_batch_size", "input", "output"]
    assert (config["name"], config["platform"], config["backend"]) == ("inception_graphdef", "", "python")
    assert config["max_batch_size"] == 128 and "dynamic_batching" not in config  # servekit does not batch it
    assert config["input"] == [
        {"name": "input", "data_type": "TYPE_FP32", "format": "FORMAT_NHWC", "dims": [299, 299, 3]}
    ]
    assert config["output"][0]["label_filename"] == "colours.txt"
    assert config["instance_group"] == [{"kind": "KIND_CPU", "count": 1}]
    assert config["version_policy"] == {"latest": {"num_versions": 1}}
    meta = client.get("/v2/models/inception_graphdef").get_json()  # model.py has no metadata hook
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 299, 299, 3]}]
    assert meta["outputs"] == [{"name": "InceptionV3/Predictions/Softmax", "datatype": "FP32", "shape": [-1, 4]}]
    # a folder without config.pbtxt: the document is built from the metadata, as before
    simple = client.get("/v2/models/simple/config").get_json()
    assert simple["max_batch_size"] == 0 and simple["input"][0]["dims"] == [1, 16]


def test_servekit_yaml_batching_is_laid_over_the_folders(image_repo, servekit_app):
    (image_repo / "inception_graphdef" / "servekit.yaml").write_text(
        "batching: {max_batch_size: 16, max_batch_time_ms: 2}\nversion_policy: all\n"
    )
    client = servekit_app(image_repo)
    config = client.get("/v2/models/inception_graphdef/config").get_json()
    assert config["max_batch_size"] == 16
    assert config["dynamic_batching"] == {"max_queue_delay_microseconds": 2000}
    assert config["version_policy"] == {"all": {}}


def test_dynamic_batching_in_the_folder_turns_batching_on(image_repo, servekit_app):
    config_file = image_repo / "inception_graphdef" / "config.pbtxt"
    config_file.write_text(
        config_file.read_text() + "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 500 }\n"
    )
    assert triton_model_config.batching(triton_model_config.read(config_file.parent)) == {
        "max_batch_size": 128,
        "max_batch_time_ms": 0.5,
    }
    assert triton_model_config.batching({"max_batch_size": 0, "dynamic_batching": {}}) is None  # no batch dimension
    client = servekit_app(image_repo)
    config = client.get("/v2/models/inception_graphdef/config").get_json()
    assert config["max_batch_size"] == 128
    assert config["dynamic_batching"] == {"preferred_batch_size": [4], "max_queue_delay_microseconds": 500}


def test_sequence_batching_makes_a_sequence_model(image_repo, servekit_app):
    shutil.copytree(MODELS / "simple_sequence", image_repo / "simple_sequence")
    (image_repo / "simple_sequence" / "servekit.yaml").write_text("sequence: {max_idle_ms: 2500}\nplacement: worker\n")
    (image_repo / "simple_sequence" / "config.pbtxt").write_text(
        "sequence_batching { max_sequence_idle_microseconds: 1000 oldest { max_candidate_sequences: 4 } }\n"
    )
    (image_repo / "simple" / "config.pbtxt").write_text("sequence_batching { max_sequence_idle_microseconds: 1000 }\n")
    (image_repo / "simple" / "servekit.yaml").write_text("placement: worker\n")  # no model host in a unit test
    client = servekit_app(image_repo)
    sequence = client.get("/v2/models/simple_sequence/config").get_json()
    assert sequence["sequence_batching"] == {
        "max_sequence_idle_microseconds": 2500000,
        "oldest": {"max_candidate_sequences": 4},
    }
    # config.pbtxt's sequence_batching alone makes `simple` a sequence model, as Triton serves it
    assert client.get("/v2/models/simple/config").get_json()["sequence_batching"] == {
        "max_sequence_idle_microseconds": 1000
    }
    outside = {
        "inputs": [{"name": n, "shape": [1, 16], "datatype": "INT32", "data": [1] * 16} for n in ("INPUT0", "INPUT1")]
    }
    answer = client.post("/v2/models/simple/infer", json=outside)
    assert (
        answer.status_code == 400
        and "must specify a non-zero or non-empty correlation ID" in answer.get_json()["error"]
    )
    assert "sequence_batching" not in client.get("/v2/models/densenet_onnx/config").get_json()


def test_metadata_checks_requests_against_the_configuration(image_repo, servekit_app):
    client = servekit_app(image_repo)
    wrong = {"inputs": [{"name": "data_0", "shape": [3, 2, 2], "datatype": "FP32", "data": [0.0] * 12}]}
    answer = client.post("/v2/models/densenet_onnx/infer", json=wrong)
    assert answer.status_code == 400 and "data_0" in answer.get_json()["error"]


def test_a_broken_config_pbtxt_fails_the_load_with_the_reason(image_repo, servekit_app):
    (image_repo / "simple" / "config.pbtxt").write_text("input { name: ")
    client = servekit_app(image_repo)
    answer = client.get("/v2/models/simple/config")
    assert answer.status_code == 503 and "config.pbtxt: cannot be read" in answer.get_json()["error"]
