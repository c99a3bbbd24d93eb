"""The control plane's parts without a server: plans, Triton's config mapping, uploads."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import pytest
from servekit.control import ControlPlane
from servekit.control.owner import Owner
from servekit.control.plan import Planner
from servekit.control.triton_load_config import settings_for
from servekit.control.uploads import UploadRefused, Uploads
from servekit.errors import BadRequest, NotFound
from sklearn_models import fit_iris


def test_a_plan_changes_generation_only_when_the_folders_or_the_operator_change(tmp_path):
    fit_iris(tmp_path / "repo" / "iris", 1)
    planner = Planner({"iris": tmp_path / "repo" / "iris"}, roots=[tmp_path / "repo"], explicit=True)
    assert planner.refresh() and planner.generation == 1
    assert not planner.refresh()
    fit_iris(tmp_path / "repo" / "iris", 2)
    assert planner.refresh() and list(planner.plan["models"]["iris"]["versions"]) == [2]
    planner.disable("iris")
    assert planner.refresh() and planner.plan["models"]["iris"]["versions"] == {}
    fit_iris(tmp_path / "repo" / "late", 1)
    planner.refresh()
    late = planner.plan["models"]["late"]
    assert not late["enabled"] and "not loaded" in late["reason"]
    planner.enable("late")
    planner.refresh()
    assert planner.plan["models"]["late"]["enabled"]
    with pytest.raises(NotFound):
        planner.enable("missing")


def test_a_config_reload_serves_the_folders_the_owner_was_given(tmp_path, monkeypatch):
    """Where a TF Serving config reload's models are served from is an argument of the owner
    (the tfserving front door passes its generated folders), by default their base paths."""
    replaced: list[dict] = []
    models = [{"name": "iris", "base_path": str(tmp_path / "iris"), "overrides": {"versions": [1]}}]
    owner = Owner(Planner({}, roots=[tmp_path], explicit=True))
    monkeypatch.setattr(owner, "replace", replaced.append)
    owner.reload_config(models)
    generated = Owner(
        Planner({}, roots=[tmp_path], explicit=True),
        config_folders=lambda ms: {m["name"]: (str(tmp_path / "generated" / m["name"]), {}) for m in ms},
    )
    monkeypatch.setattr(generated, "replace", replaced.append)
    generated.reload_config(models)
    assert replaced == [
        {"iris": (str(tmp_path / "iris"), {"versions": [1]})},
        {"iris": (str(tmp_path / "generated" / "iris"), {})},
    ]


def test_triton_config_maps_onto_servekit_settings():
    settings = settings_for(
        "m",
        '{"name": "m", "max_batch_size": "16", "dynamic_batching": {"max_queue_delay_microseconds": 2000},'
        ' "version_policy": {"specific": {"versions": ["2", 3]}}, "backend": "onnxruntime",'
        ' "instance_group": [{"count": 2, "kind": "KIND_GPU", "gpus": [1]}],'
        ' "parameters": {"threshold": {"string_value": "0.5"}}}',
    )
    assert settings == {
        "batching": {"max_batch_size": 16, "max_batch_time_ms": 2.0},
        "version_policy": {"specific": [2, 3]},
        "plugin": "onnx",
        "placement": "process",
        "replicas": 2,
        "device": "cuda:1",
        "options": {"threshold": "0.5"},
    }
    assert settings_for("m", '{"version_policy": {"all": {}}, "instance_group": [{"kind": "KIND_CPU"}]}') == {
        "version_policy": "all",
        "device": "cpu",
    }


@pytest.mark.parametrize(
    "config, named",
    [
        ('{"sequence_batching": {"state": []}}', "sequence_batching.state"),
        ('{"input": [{"name": "x"}]}', "input"),
        ('{"max_batch_size": "lots"}', "max_batch_size"),
        ('{"name": "other"}', "other"),
        ('{"dynamic_batching": {"priority_queue_policy": {"1": {"latency": 3}}}}', "priority_queue_policy[1].latency"),
        ('{"backend": "openvino"}', "openvino"),
        ('"parameters": {"config": {{"max_batch_size": "16"}}}', "not valid JSON"),
        ("[1]", "JSON object"),
    ],
)
def test_what_cannot_be_mapped_is_a_400_naming_the_field(config, named):
    with pytest.raises(BadRequest, match="failed to load 'm'") as caught:
        settings_for("m", config)
    assert named in caught.value.message


def test_uploaded_files_stay_inside_their_folder(tmp_path):
    uploads = Uploads()
    folder = uploads.write("m", {"file:1/model.joblib": b"x", "file:servekit.yaml": b"{}"})
    assert (folder / "1" / "model.joblib").read_bytes() == b"x" and folder.name == "m"
    assert uploads.write("m", {"file:1/model.joblib": b"y"}) != folder  # a new folder per load
    for bad in ("file:../x", "file:/etc/x", "file:"):
        with pytest.raises(BadRequest, match="relative path"):
            uploads.write("m", {bad: b"x"})


@pytest.mark.parametrize(
    "files, why",
    [
        ({"file:" + "A" * 256: b"a"}, "a name of 256 bytes"),
        ({"file:" + "é" * 128: b"a"}, "a name of 256 bytes"),  # bytes, not characters
        ({"file:" + "/".join(["d" * 250] * 5): b"a"}, "a path of 1254 bytes"),
        ({"file:1//model.onnx": b"a"}, "without empty, '.' or '..' parts"),
        ({"file:./model.onnx": b"a"}, "without empty, '.' or '..' parts"),
        ({"file:1/model\x00.onnx": b"a"}, "NUL character"),
        ({"file:1": b"a", "file:1/model.onnx": b"b"}, "'file:1' is a file, but other files are inside it"),
        ({"file:1/model.onnx": "text"}, "must hold the file's bytes"),
    ],
    ids=[
        "long-name",
        "long-multibyte-name",
        "long-path",
        "empty-part",
        "dot-part",
        "nul",
        "file-and-folder",
        "not-bytes",
    ],
)
def test_uploads_are_checked_before_anything_is_written(tmp_path, monkeypatch, files, why):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # this test's own temporary folder
    with pytest.raises(UploadRefused) as caught:
        Uploads().write("m", files)
    assert caught.value.message.startswith("failed to load 'm', failed to poll from model repository: ")
    assert why in caught.value.message and str(tmp_path) not in caught.value.message
    assert caught.value.status == 400 and caught.value.grpc_code == "INTERNAL"  # as Triton's gRPC answers it
    assert list(tmp_path.iterdir()) == []  # nothing touched the disk


def test_a_failed_write_names_no_server_path(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def full_disk(path, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(Path, "write_bytes", full_disk)  # the one failure a check cannot foresee
    with pytest.raises(UploadRefused) as caught:
        Uploads().write("m", {"file:1/model.onnx": b"x"})
    assert "could not write the model files" in caught.value.message
    assert str(tmp_path) not in caught.value.message and "Errno" not in caught.value.message
    assert not any(tmp_path.glob("*/*/m"))  # the half-written folder is gone


def test_an_owner_error_keeps_its_grpc_code_across_the_socket():
    from servekit.control import transport

    error = transport._error("BadRequest", "failed to load 'm', failed to poll from model repository", 400, "INTERNAL")
    assert isinstance(error, BadRequest) and error.status == 400 and error.grpc_code == "INTERNAL"
    assert transport._error("BadRequest", "m", 400).grpc_code == "INVALID_ARGUMENT"


def test_a_one_process_app_loads_and_unloads_through_its_own_owner(servekit_app, tmp_path):
    fit_iris(tmp_path / "repo" / "iris", 1)
    client = servekit_app(tmp_path / "repo", model_control_mode="explicit")
    control: ControlPlane = client.application.extensions["servekit.control"]
    control.unload("iris")
    assert client.get("/v2/models/iris/ready").status_code == 404
    control.load("iris", config='{"max_batch_size": 8}')
    assert client.get("/v2/models/iris/config").get_json()["max_batch_size"] == 8
    control.load("iris")  # without a config: back to the folder's own settings
    assert client.get("/v2/models/iris/config").get_json()["max_batch_size"] == 0
    r = client.post("/v2/repository/models/iris/unload", json={"parameters": {"unload_dependents": "yes"}})
    assert r.status_code == 400 and "unload_dependents" in r.get_json()["error"]
