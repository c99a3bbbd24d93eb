"""Readiness, model control, dangling labels and unknown models, through real servers.

The repository holds five models, four of which fail to load: ``iris`` (versions
1 and 2 under the default ``version_policy: latest``, with a label ``stable: 1``
that therefore points at a version that is not loaded) and ``broken0..3``.
Strict readiness (the default) keeps such a server out of rotation;
``--no-strict-readiness`` lets it serve the good model.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import requests
from servekit.testing import ServerProcess
from sklearn_models import fit_iris, fit_regressor

IRIS_ROW = {"instances": [[5.1, 3.5, 1.4, 0.2]]}
BROKEN = [f"broken{i}" for i in range(4)]
SERVED = ", ".join(sorted([*BROKEN, "iris"]))


def wait_for(condition, timeout: float = 120.0):
    """Poll until ``condition()`` is truthy; the timeout only guards against a hang."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = condition()
        except requests.ConnectionError:
            value = None
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"condition not met within {timeout}s")


def first_load_finished(server: ServerProcess) -> bool:
    """Every model reports a final state (the status API answers without waiting)."""
    for name in [*BROKEN, "iris"]:
        status = requests.get(f"{server.url}/v1/models/{name}", timeout=10).json()
        states = {v["state"] for v in status.get("model_version_status", [])}
        if not states or states & {"START", "LOADING"}:
            return False
    return True


def settled_readiness(url: str) -> requests.Response:
    """``/v2/health/ready`` once the first load as a whole is done: the status API shows every
    load's end a moment before that, and until then the reason says the models are loading."""

    def settled():
        answer = requests.get(url + "/v2/health/ready", timeout=10)
        return None if "loading" in answer.text else [answer]  # (a 503 response is falsy)

    (answer,) = wait_for(settled)
    return answer


def start(repo: Path, **settings) -> ServerProcess:
    server = ServerProcess(repo, workers=1, threads=4, **settings).start(wait=False)
    wait_for(lambda: first_load_finished(server))
    return server


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("readiness")
    fit_iris(base / "iris", 1)
    fit_iris(base / "iris", 2)
    (base / "iris" / "servekit.yaml").write_text("labels: {stable: 1}\n")
    for name in BROKEN:
        (base / name / "1").mkdir(parents=True)
        (base / name / "1" / "model.joblib").write_bytes(b"not a pickle")
    return base


@pytest.fixture(scope="module")
def strict_server(repo):
    server = start(repo)
    yield server
    server.stop()


# -- readiness -----------------------------------------------------------------------------


@pytest.mark.slow
def test_strict_readiness_keeps_a_server_with_a_failed_model_out_of_rotation(strict_server):
    url = strict_server.url
    r = settled_readiness(url)
    assert r.status_code == 503, r.text
    assert r.json()["ready"] is False and all(name in r.json()["reason"] for name in BROKEN), r.text
    assert requests.get(url + "/v2/health/live", timeout=10).status_code == 200
    # each failed model says so itself, and the good one still answers when asked
    (entry,) = requests.get(url + "/v1/models/broken0", timeout=10).json()["model_version_status"]
    assert entry["state"] == "END" and entry["status"]["error_message"]
    assert requests.get(url + "/v2/models/broken0/ready", timeout=10).status_code == 503
    assert requests.get(url + "/v2/models/iris/ready", timeout=10).status_code == 200
    assert requests.post(url + "/v1/models/iris:predict", json=IRIS_ROW, timeout=10).status_code == 200
    assert strict_server.proc.poll() is None


@pytest.mark.slow
def test_no_strict_readiness_serves_the_good_model_while_four_of_five_failed(repo):
    server = start(repo, strict_readiness=False)
    try:
        r = settled_readiness(server.url)
        assert r.status_code == 200 and r.json() == {"ready": True}
        assert requests.get(server.url + "/v2/models/broken0/ready", timeout=10).status_code == 503
    finally:
        server.stop()


@pytest.mark.slow
def test_unloading_the_only_model_makes_the_server_unready(tmp_path):
    fit_regressor(tmp_path / "linear")
    with ServerProcess(tmp_path, workers=1, threads=4, model_control_mode="explicit") as server:
        ready = server.url + "/v2/health/ready"
        assert requests.get(ready, timeout=10).status_code == 200
        assert requests.post(server.url + "/v2/repository/models/linear/unload", timeout=30).status_code == 200
        r = requests.get(ready, timeout=10)
        assert r.status_code == 503 and "linear" in r.json()["reason"]
        assert requests.get(server.url + "/v2/health/live", timeout=10).status_code == 200
        assert requests.post(server.url + "/v2/repository/models/linear/load", timeout=30).status_code == 200
        assert requests.get(ready, timeout=10).status_code == 200


@pytest.mark.parametrize("strict", [True, False])
def test_a_server_whose_only_model_failed_is_not_ready_in_either_mode(tmp_path, servekit_app, strict):
    (tmp_path / "only" / "1").mkdir(parents=True)
    (tmp_path / "only" / "1" / "model.joblib").write_bytes(b"not a pickle")
    client = servekit_app(tmp_path, strict_readiness=strict)
    r = client.get("/v2/health/ready")
    assert r.status_code == 503 and "only" in r.json["reason"]
    assert client.get("/v2/health/live").status_code == 200


def test_a_model_unloaded_on_purpose_does_not_count_against_strict_readiness(tmp_path, servekit_app):
    fit_regressor(tmp_path / "linear")
    fit_regressor(tmp_path / "spare")
    client = servekit_app(tmp_path, model_control_mode="explicit")
    assert client.get("/v2/health/ready").status_code == 200
    assert client.post("/v2/repository/models/spare/unload").status_code == 200
    assert client.get("/v2/health/ready").status_code == 200


# -- model control -------------------------------------------------------------------------


@pytest.mark.slow
def test_load_and_unload_are_refused_without_explicit_model_control(strict_server):
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    url = strict_server.url
    for action in ("unload", "load"):
        r = requests.post(f"{url}/v2/repository/models/iris/{action}", timeout=10)
        assert r.status_code == 403, r.text
        assert r.json()["error"].startswith("explicit model load / unload is not allowed")
        assert "--model-control-mode explicit" in r.json()["error"]
    client = httpclient.InferenceServerClient(url.removeprefix("http://"))
    with pytest.raises(InferenceServerException) as err:
        client.unload_model("iris")
    assert err.value.status() == "403"
    assert client.is_model_ready("iris")  # nothing was unloaded
    assert requests.post(url + "/v2/repository/index", timeout=10).status_code == 200  # reading stays open


# -- unknown models and malformed versions ---------------------------------------------------


@pytest.mark.slow
def test_an_unknown_model_is_answered_in_each_protocol_s_words_with_the_served_models(strict_server):
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    url = strict_server.url
    v2 = f"Request for unknown model: 'nope' is not found; models served here: {SERVED}"
    for r in (
        requests.get(url + "/v2/models/nope", timeout=10),
        requests.get(url + "/v2/models/nope/ready", timeout=10),
        requests.post(url + "/v2/models/nope/infer", json={"inputs": []}, timeout=10),
    ):
        assert r.status_code == 404 and r.json() == {"error": v2}
    client = httpclient.InferenceServerClient(url.removeprefix("http://"))
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata("nope")
    assert err.value.message() == v2
    r = requests.post(url + "/v1/models/nope:predict", json=IRIS_ROW, timeout=10)
    assert r.status_code == 404
    assert r.json() == {"error": f"Servable not found for request: Latest(nope); models served here: {SERVED}"}


@pytest.mark.slow
def test_a_malformed_version_is_a_bad_request_not_a_missing_model(strict_server):
    url = strict_server.url
    for r in (
        requests.get(url + "/v2/models/iris/versions/abc", timeout=10),
        requests.post(url + "/v2/models/iris/versions/abc/infer", json={"inputs": []}, timeout=10),
    ):
        assert r.status_code == 400, r.text
        # Triton's wording, which its own examples check
        assert "failed to get model version from specified version string 'abc'" in r.json()["error"]


# -- labels that point at a version that is not loaded -----------------------------------------


@pytest.mark.slow
def test_a_label_on_an_unloaded_version_is_warned_about_at_load(strict_server):
    output = wait_for(lambda: "label 'stable' points at version 1" in strict_server.output() and strict_server.output())
    line = next(line for line in output.splitlines() if "label 'stable' points at version 1" in line)
    assert "WARNING" in line and "version_policy 'latest' does not load it" in line and "serving: 2" in line


def test_a_dangling_label_is_warned_about_once_per_change_not_every_poll(tmp_path, caplog):
    from servekit.dataplane.repository import ModelRepository, discover
    from servekit.hooks import manager as plugins

    fit_iris(tmp_path / "iris", 1)
    fit_iris(tmp_path / "iris", 2)
    (tmp_path / "iris" / "servekit.yaml").write_text("labels: {stable: 1}\n")
    repo = ModelRepository(discover([tmp_path]), plugins.build_manager(), poll_interval=0)

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if "points at version" in r.getMessage()]

    with caplog.at_level(logging.WARNING, logger="servekit.repository"):
        for _ in range(3):  # the first load, then two polls that change nothing
            repo.sync()
        assert len(warnings()) == 1 and "serving: 2" in warnings()[0]
        fit_iris(tmp_path / "iris", 3)  # a poll that changes the versions warns again
        repo.sync()
        repo.sync()
        assert len(warnings()) == 2 and "serving: 3" in warnings()[1]
        (tmp_path / "iris" / "servekit.yaml").write_text("labels: {stable: 3}\n")
        repo.sync()
        assert len(warnings()) == 2  # the label is served now: nothing to say


@pytest.mark.slow
def test_the_test_fixture_reports_a_model_that_failed_instead_of_waiting(tmp_path):
    """``ServerProcess.start`` (behind ``servekit_server``) says why a strict server never gets ready."""
    (tmp_path / "only" / "1").mkdir(parents=True)
    (tmp_path / "only" / "1" / "model.joblib").write_bytes(b"not a pickle")
    server = ServerProcess(tmp_path, workers=1, threads=2)
    try:
        with pytest.raises(RuntimeError, match=r"servekit is not ready: no model has an AVAILABLE version \(only\)"):
            server.start(timeout=300)
    finally:
        server.stop()
