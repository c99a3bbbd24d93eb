"""Where framework plugins find their artifact (servekit.folders.artifacts) and how many threads they take (servekit.server.cpus)."""

from __future__ import annotations

import json

import pytest
from servekit.folders.artifacts import find_artifact, is_lightgbm_text
from servekit.server.cpus import WORKERS_ENV, available_cpus, cpus_per_worker

NAMES = ("model.json", "model.bst")
IMPLEMENTATIONS = ("mlserver_xgboost.XGBoostModel",)


def ours(file):
    return file.read_bytes().startswith(b"OURS")


def find(folder, **options):
    return find_artifact(folder, options, NAMES, ours, IMPLEMENTATIONS)


def write(folder, name, text="OURS"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)
    return folder / name


def test_own_names_first_then_the_one_file_with_a_suffix(tmp_path):
    write(tmp_path, "other.bst")
    assert find(tmp_path) == tmp_path / "other.bst"  # KServe's layout: any name
    write(tmp_path, "model.json")
    assert find(tmp_path) == tmp_path / "model.json"
    write(tmp_path / "two", "a.bst")
    write(tmp_path / "two", "b.bst")
    assert find(tmp_path / "two") is None  # two candidates: not guessed


def test_the_header_decides(tmp_path):
    write(tmp_path, "model.bst", "tree\nversion=v4\n")
    assert find(tmp_path) is None
    assert is_lightgbm_text(tmp_path / "model.bst")
    write(tmp_path, "model.bst", "OURS")
    assert not is_lightgbm_text(tmp_path / "model.bst")


def test_options_artifact_names_the_file(tmp_path):
    write(tmp_path, "model.json")
    write(tmp_path, "custom.bin")
    assert find(tmp_path, artifact="custom.bin") == tmp_path / "custom.bin"
    assert find(tmp_path, artifact="missing.bin") is None
    write(tmp_path, "foreign.bin", "NOT OURS")
    assert find(tmp_path, artifact="foreign.bin") is None


def test_an_mlflow_folder_is_left_to_the_mlflow_plugin(tmp_path):
    write(tmp_path, "model.json")
    write(tmp_path, "MLmodel", "flavors: {}\n")
    assert find(tmp_path) is None
    assert find(tmp_path, artifact="model.json") == tmp_path / "model.json"


def settings(folder, **doc):
    write(folder, "model-settings.json", json.dumps(doc))


def test_model_settings_uri_and_implementation(tmp_path):
    write(tmp_path, "my-model.ubj")
    settings(tmp_path, implementation="mlserver_xgboost.XGBoostModel", parameters={"uri": "./my-model.ubj"})
    assert find(tmp_path) == tmp_path / "my-model.ubj"
    settings(tmp_path, implementation="mlserver_sklearn.SKLearnModel", parameters={"uri": "./my-model.ubj"})
    assert find(tmp_path) is None  # another runtime's folder
    settings(tmp_path, implementation="mlserver_xgboost.XGBoostModel", parameters={"uri": "./gone.json"})
    with pytest.raises(ValueError, match="gone.json"):
        find(tmp_path)
    settings(tmp_path, implementation="mlserver_xgboost.XGBoostModel")
    write(tmp_path, "model.json")
    assert find(tmp_path) == tmp_path / "model.json"  # no uri: the runtime's default file name
    (tmp_path / "model-settings.json").write_text("{not json")
    with pytest.raises(ValueError, match="model-settings.json"):
        find(tmp_path)


def test_cpus_per_worker(monkeypatch):
    monkeypatch.delenv(WORKERS_ENV, raising=False)
    assert cpus_per_worker() == available_cpus()
    monkeypatch.setenv(WORKERS_ENV, str(available_cpus() + 1))
    assert cpus_per_worker() == 1
    monkeypatch.setenv(WORKERS_ENV, "many")
    assert cpus_per_worker() == available_cpus()
