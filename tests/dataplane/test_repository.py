"""Model folders, versions, policies, labels and states, without a server."""

from __future__ import annotations

import pytest
from servekit.dataplane.repository import ModelRepository, State, discover
from servekit.errors import NotFound, NotReady
from servekit.folders.servekit_yaml import ConfigError, parse_model_config, select_versions
from servekit.hooks import manager as plugins
from sklearn_models import fit_iris


def make_repo(*paths, model_name=None) -> ModelRepository:
    repo = ModelRepository(discover(list(paths), model_name), plugins.build_manager(), poll_interval=0)
    repo.load_now()
    return repo


def test_discover_model_folder_repository_and_unversioned_folder(tmp_path):
    fit_iris(tmp_path / "repo" / "a", 3)
    fit_iris(tmp_path / "repo" / "b", 1)
    (tmp_path / "repo" / "README.md").write_text("a repository may hold a README")
    assert set(discover([tmp_path / "repo"])) == {"a", "b"}
    assert set(discover([tmp_path / "repo" / "a"])) == {"a"}
    assert discover([tmp_path / "repo" / "a"], "renamed") == {"renamed": tmp_path / "repo" / "a"}
    flat = tmp_path / "flat"
    flat.mkdir()
    (tmp_path / "repo" / "b" / "1" / "model.joblib").rename(flat / "model.joblib")
    repo = make_repo(flat)
    assert [v.version for v in repo.get_model("flat").available()] == [1]


def test_discover_rejects_clashing_names_and_missing_paths(tmp_path):
    fit_iris(tmp_path / "one" / "iris", 1)
    fit_iris(tmp_path / "two" / "iris", 1)
    with pytest.raises(ConfigError, match="two model folders are named 'iris'"):
        discover([tmp_path / "one", tmp_path / "two"])
    with pytest.raises(ConfigError, match="not found"):
        discover([tmp_path / "missing"])
    with pytest.raises(ConfigError, match="--model-name"):
        fit_iris(tmp_path / "three" / "other", 1)
        discover([tmp_path / "one", tmp_path / "three"], "x")


@pytest.mark.parametrize(
    "policy, expected",
    [
        ("latest", [124]),
        ("all", [3, 123, 124]),
        ({"specific": [3, 124]}, [3, 124]),
        ({"specific": {"versions": [123]}}, [123]),
        ({"latest": {"num_versions": 2}}, [123, 124]),
    ],
)
def test_version_policies(policy, expected):
    assert select_versions(policy, [124, 3, 123]) == expected


def test_policy_labels_and_resolution(tmp_path):
    for v in (1, 2, 3):
        fit_iris(tmp_path / "iris", v)
    (tmp_path / "iris" / "servekit.yaml").write_text(
        "version_policy: {specific: [1, 2]}\nlabels: {stable: 1, canary: 2, gone: 3}\n"
    )
    repo = make_repo(tmp_path / "iris")
    assert sorted(repo.get_model("iris").versions) == [1, 2]
    assert repo.resolve("iris").version == 2
    assert repo.resolve("iris", label="stable").version == 1
    assert repo.resolve("iris", version="1").version == 1
    with pytest.raises(NotFound, match="Specific"):
        repo.resolve("iris", label="gone")
    with pytest.raises(NotFound, match="label"):
        repo.resolve("iris", label="nope")
    with pytest.raises(NotFound, match="Latest\\(other\\)"):
        repo.resolve("other")


def test_failed_load_is_state_end_with_error_and_503(tmp_path):
    (tmp_path / "bad" / "1").mkdir(parents=True)
    (tmp_path / "bad" / "1" / "model.joblib").write_bytes(b"nope")
    (tmp_path / "empty" / "1").mkdir(parents=True)
    (tmp_path / "empty" / "1" / "weights.bin").write_bytes(b"")
    repo = make_repo(tmp_path)
    assert repo.ready
    (bad,) = repo.statuses("bad")
    assert bad.state is State.END and bad.error
    with pytest.raises(NotReady, match="failed to load"):
        repo.resolve("bad")
    (empty,) = repo.statuses("empty")
    assert "no plugin could load" in empty.error and "weights.bin" in empty.error


def test_a_bare_load_error_names_the_artifact(tmp_path):
    """A load that fails with a message naming no file (``MemoryError``) says which artifact it was."""
    folder = tmp_path / "huge" / "1"
    folder.mkdir(parents=True)
    (folder / "weights.bin").write_bytes(b"x")
    (folder / "model.py").write_text(
        "import servekit\n\n\n@servekit.hookimpl\ndef load(path):\n    raise MemoryError()\n"
    )
    (huge,) = make_repo(tmp_path).statuses("huge")
    assert huge.state is State.END and huge.error == "huge/1/weights.bin: MemoryError"


def test_a_missing_framework_library_names_its_extra(tmp_path):
    folder = tmp_path / "needs" / "1"
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(
        "import servekit\n\n\n@servekit.hookimpl\ndef load(path):\n"
        "    raise ModuleNotFoundError(\"No module named 'xgboost'\", name='xgboost')\n"
    )
    (needs,) = make_repo(tmp_path).statuses("needs")
    assert "No module named 'xgboost'" in needs.error and "pip install 'servekit[xgboost]'" in needs.error


def test_bad_servekit_yaml_fails_the_model_with_a_clear_message(tmp_path):
    fit_iris(tmp_path / "iris", 1)
    (tmp_path / "iris" / "servekit.yaml").write_text("version_policy: sometimes\n")
    repo = make_repo(tmp_path / "iris")
    (status,) = repo.statuses("iris")
    assert status.state is State.END and "version_policy" in status.error


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"labels": {"a": "x"}}, "labels"),
        ({"device": "tpu"}, "device"),
        ({"batching": {"size": 3}}, "batching"),
        ({"colour": 1}, "unknown setting"),
        ({"options": []}, "options"),
    ],
)
def test_model_config_validation(raw, message):
    with pytest.raises(ConfigError, match=message):
        parse_model_config(raw)


def test_model_config_defaults_and_values():
    config = parse_model_config(
        {
            "plugin": "tensorflow",
            "device": "cuda:1",
            "batching": {"max_batch_size": 8},
            "labels": {"stable": 3},
            "options": {"k": 1},
        }
    )
    assert (config.plugin, config.device, config.batching.max_batch_size, config.labels, config.options) == (
        "tensorflow",
        "cuda:1",
        8,
        {"stable": 3},
        {"k": 1},
    )
    assert parse_model_config({}).version_policy == "latest"


def test_repository_api_unloads_and_reloads(tmp_path):
    fit_iris(tmp_path / "iris", 1)
    repo = make_repo(tmp_path)
    repo.unload_model("iris")
    with pytest.raises(NotFound):
        repo.resolve("iris")
    repo.load_model("iris")
    assert repo.resolve("iris").ready


def test_unloading_waits_for_the_call_still_running_on_the_version(tmp_path):
    """A version that resolved before its unload serves the call already inside it."""
    import threading
    import time

    fit_iris(tmp_path / "iris", 1)
    repo = make_repo(tmp_path)
    mv = repo.resolve("iris")
    entered, leave, took = threading.Event(), threading.Event(), []

    def call() -> None:
        with mv.in_use():
            entered.set()
            leave.wait(10)

    caller = threading.Thread(target=call)
    caller.start()
    entered.wait(10)
    unloader = threading.Thread(target=lambda: (repo.unload_model("iris"), took.append(mv.state)))
    unloader.start()
    time.sleep(0.8)  # past the settle time: only the running call holds the version now
    assert mv.state is State.AVAILABLE and not took
    leave.set()
    caller.join(10)
    unloader.join(10)
    assert took == [State.END]
    with pytest.raises(NotReady), mv.in_use():
        pass


def test_a_version_nobody_asked_for_lately_unloads_at_once(tmp_path):
    fit_iris(tmp_path / "iris", 1)
    repo = make_repo(tmp_path)
    mv = repo.resolve("iris")
    mv.last_resolved -= 10  # resolved long ago, nothing in flight
    repo.unload_model("iris")
    assert mv.state is State.END


def test_servekit_yaml_plugin_key_picks_the_loading_plugin(tmp_path):
    fit_iris(tmp_path / "iris", 1)
    (tmp_path / "iris" / "servekit.yaml").write_text("plugin: sklearn\n")
    assert make_repo(tmp_path / "iris").resolve("iris").ready
    (tmp_path / "iris" / "servekit.yaml").write_text("plugin: tensorflow\n")
    (status,) = make_repo(tmp_path / "iris").statuses("iris")
    # the TensorFlow plugin finds no SavedModel, and sklearn may not step in
    assert status.state is State.END and "no plugin could load" in status.error
    (tmp_path / "iris" / "servekit.yaml").write_text("plugin: paddle\n")
    (status,) = make_repo(tmp_path / "iris").statuses("iris")
    assert "'paddle', which is not installed" in status.error
