"""{{ cookiecutter.plugin_name }} through servekit's pytest fixtures, on tiny model files written here."""

from __future__ import annotations

import importlib.metadata
import json
import urllib.request

import numpy as np
import pytest

import {{ cookiecutter.package_name }} as plugin

#: A model of another kind beside ours: a folder with its own model.py.
MODEL_PY = '''
import numpy as np
import servekit


@servekit.hookimpl
def load():
    return "doubler"


@servekit.hookimpl
def predict(inputs):
    return np.asarray(inputs, dtype=float) * 2
'''


@pytest.fixture
def linear_dir(tmp_path):
    """BASE/linear/1/model.linear.npz: y = x0 + 2 x1 + 1, second output y = x1."""
    version = tmp_path / "linear" / "1"
    version.mkdir(parents=True)
    np.savez(version / "model.linear.npz", w=np.array([[1.0, 0.0], [2.0, 1.0]]), b=np.array([1.0, 0.0]))
    return version.parent


@pytest.fixture
def doubler_dir(tmp_path):
    folder = tmp_path / "doubler"
    folder.mkdir()
    (folder / "model.py").write_text(MODEL_PY)
    return folder


def test_registered_as_a_servekit_plugin():
    names = {ep.name for ep in importlib.metadata.entry_points(group="servekit")}
    assert "{{ cookiecutter.entry_point }}" in names, "install this package first: pip install -e ."


def test_load_claims_only_its_own_artifact(linear_dir, doubler_dir, tmp_path):
    assert isinstance(plugin.load(path=linear_dir / "1"), plugin.LinearModel)
    assert plugin.load(path=doubler_dir) is None  # not ours: the next plugin gets the folder
    (tmp_path / "empty").mkdir()
    assert plugin.load(path=tmp_path / "empty") is None


def test_serves_its_artifact_beside_another_kind(servekit_app, linear_dir, doubler_dir):
    client = servekit_app(linear_dir, doubler_dir)
    response = client.post("/v1/models/linear:predict", json={"instances": [[1.0, 2.0], [0.0, 0.0]]})
    assert response.status_code == 200, response.get_json()
    assert response.get_json()["predictions"] == [[6.0, 2.0], [1.0, 0.0]]
    # the model.py model next to it is answered by its own hooks, not by this plugin
    response = client.post("/v1/models/doubler:predict", json={"instances": [[1.0, 2.0]]})
    assert response.get_json()["predictions"] == [[2.0, 4.0]]
    infer = client.post("/v2/models/linear/infer", json={
        "inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP64", "data": [3.0, 1.0]}],
    })
    assert infer.status_code == 200, infer.get_json()
    assert infer.get_json()["outputs"][0]["data"] == [6.0, 1.0]
    metadata = client.get("/v2/models/linear").get_json()
    assert metadata["inputs"][0]["shape"] == [-1, 2]


def test_bad_input_is_a_400(servekit_app, linear_dir):
    client = servekit_app(linear_dir)
    response = client.post("/v1/models/linear:predict", json={"instances": [[1.0, 2.0, 3.0]]})
    assert response.status_code == 400
    assert "does not match the model's shape [-1, 2]" in response.get_json()["error"]


def test_works_in_the_real_server(servekit_server, linear_dir):
    server = servekit_server(linear_dir, workers=1)
    request = urllib.request.Request(
        server.url + "/v1/models/linear:predict", data=b'{"instances": [[1.0, 1.0]]}',
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert json.load(response)["predictions"] == [[4.0, 1.0]]
