"""{{ cookiecutter.plugin_name }} through servekit's pytest fixtures, on a tiny model written here."""

from __future__ import annotations

import importlib.metadata
import json
import urllib.request

import pytest

MODEL_PY = '''
import numpy as np
import servekit


class Doubler:
    """The loaded model."""


@servekit.hookimpl
def load():
    return Doubler()


@servekit.hookimpl
def predict(inputs):
    return np.asarray(inputs, dtype=float) * 2
'''


@pytest.fixture
def model_dir(tmp_path):
    folder = tmp_path / "doubler"
    folder.mkdir()
    (folder / "model.py").write_text(MODEL_PY)
    return folder


def test_registered_as_a_servekit_plugin():
    names = {ep.name for ep in importlib.metadata.entry_points(group="servekit")}
    assert "{{ cookiecutter.entry_point }}" in names, "install this package first: pip install -e ."


def test_counts_predictions(servekit_app, model_dir):
    client = servekit_app(model_dir)
    before = client.get("/-/{{ cookiecutter.entry_point }}").get_json()["predictions"].get("doubler", 0)
    response = client.post("/v1/models/doubler:predict", json={"instances": [[1.0, 2.0]]})
    assert response.status_code == 200, response.get_json()
    assert response.get_json()["predictions"] == [[2.0, 4.0]]
    after = client.get("/-/{{ cookiecutter.entry_point }}").get_json()["predictions"]["doubler"]
    assert after == before + 1


def test_works_in_the_real_server(servekit_server, model_dir):
    server = servekit_server(model_dir, workers=1)
    request = urllib.request.Request(
        server.url + "/v1/models/doubler:predict", data=b'{"instances": [[3.0]]}',
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert json.load(response)["predictions"] == [[6.0]]
    with urllib.request.urlopen(server.url + "/-/{{ cookiecutter.entry_point }}", timeout=30) as response:
        assert json.load(response)["predictions"] == {"doubler": 1}
