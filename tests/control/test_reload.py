"""File-system polling: versions appear and disappear while the server runs, with no failed request."""

from __future__ import annotations

import shutil
import threading
import time

import pytest
import requests
from sklearn_models import fit_iris

pytestmark = pytest.mark.slow  # starts real servers or subprocesses

ROWS = {"instances": [[5.1, 3.5, 1.4, 0.2]]}


def _wait_for(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def _versions(server, name):
    body = requests.get(f"{server.url}/v1/models/{name}", timeout=10).json()
    return {int(s["version"]): s["state"] for s in body.get("model_version_status", [])}


def test_new_version_loads_and_old_unloads_under_load_with_zero_failures(tmp_path, servekit_server):
    base = tmp_path / "models"
    fit_iris(base / "iris", 1)
    staging = tmp_path / "staging"
    fit_iris(staging / "iris", 2)
    server = servekit_server(base, workers=2, poll_interval=0.2)

    results: list[int] = []
    errors: list[str] = []
    stop = threading.Event()

    def hammer():
        with requests.Session() as s:
            while not stop.is_set():
                r = s.post(server.url + "/v1/models/iris:predict", json=ROWS, timeout=30)
                results.append(r.status_code)
                if r.status_code != 200:
                    errors.append(r.text)

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        # an atomic rename, as TF Serving recommends for new versions
        shutil.move(str(staging / "iris" / "2"), str(base / "iris" / "2"))
        assert _wait_for(lambda: _versions(server, "iris") == {2: "AVAILABLE"})
        time.sleep(0.5)
        shutil.rmtree(base / "iris" / "2")
        assert _wait_for(lambda: _versions(server, "iris") == {1: "AVAILABLE"})
        time.sleep(0.5)
    finally:
        stop.set()
        for t in threads:
            t.join()
    failures = [s for s in results if s != 200]
    print(f"hot reload: {len(results)} requests, {len(failures)} failed", set(errors))
    assert len(results) > 50
    assert failures == []


def test_a_broken_new_version_leaves_the_previous_one_serving(tmp_path, servekit_server):
    base = tmp_path / "models"
    fit_iris(base / "iris", 1)
    server = servekit_server(base, poll_interval=0.2)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model.joblib").write_bytes(b"corrupt")
    shutil.move(str(broken), str(base / "iris" / "2"))
    assert _wait_for(lambda: _versions(server, "iris").get(2) == "END")
    assert _versions(server, "iris") == {2: "END", 1: "AVAILABLE"}
    r = requests.post(server.url + "/v1/models/iris:predict", json=ROWS, timeout=10)
    assert r.status_code == 200 and r.json() == {"predictions": ["setosa"]}
    # fixing the folder in place is picked up on a later poll
    (base / "iris" / "2" / "model.joblib").unlink()
    fit_iris(base / "iris", 2)
    assert _wait_for(lambda: _versions(server, "iris") == {2: "AVAILABLE"})


ANSWERING = """
import servekit

@servekit.hookimpl
def load(path):
    return "constant"

@servekit.hookimpl
def predict(inputs):
    return inputs * 0 + {answer}
"""


def _answers(server, name, n=20):
    with requests.Session() as s:
        return {
            s.post(f"{server.url}/v1/models/{name}:predict", json={"instances": [1]}, timeout=30).json()["predictions"][
                0
            ]
            for _ in range(n)
        }


def test_a_changed_model_py_runs_with_the_next_version_in_every_worker(tmp_path, servekit_server):
    """model.py beside the version folders: a new version runs the file as it is now, no restart."""
    model = tmp_path / "models" / "const"
    (model / "1").mkdir(parents=True)
    (model / "1" / "weights.json").write_text("{}")
    (model / "model.py").write_text(ANSWERING.format(answer=1))
    server = servekit_server(tmp_path / "models", workers=2, poll_interval=0.2)
    assert _answers(server, "const") == {1}

    (model / "model.py").write_text(ANSWERING.format(answer=2))
    staging = tmp_path / "staging"
    (staging / "2").mkdir(parents=True)
    (staging / "2" / "weights.json").write_text("{}")
    shutil.move(str(staging / "2"), str(model / "2"))
    assert _wait_for(lambda: _versions(server, "const") == {2: "AVAILABLE"})
    time.sleep(1.0)  # both workers have swapped (each polls on its own)
    assert _answers(server, "const", 40) == {2}
