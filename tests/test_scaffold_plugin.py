"""``servekit new --plugin`` end to end: bake, install, list, and see it work on a served model.

The package is installed with pip (a real build through its ``pyproject.toml``
and entry point) into a folder of its own put on ``PYTHONPATH`` of the
subprocesses, rather than into the shared virtualenv: servers other tests start
meanwhile must not pick the plugin up, and nothing is left behind if a test dies.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import requests
from conftest import fit_iris
from servekit.testing import ServerProcess
from test_scaffold import bake, files_in


@pytest.fixture(scope="module")
def plugin_install(tmp_path_factory):
    base = tmp_path_factory.mktemp("plugin")
    project = bake(base, "plugin_name=Request Counter", plugin=True)
    baked = files_in(project)  # before pip builds in the folder
    target = base / "site"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "--target", str(target), str(project)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))}
    return project, env, baked


def test_plugin_files(plugin_install):
    project, _, baked = plugin_install
    assert project.name == "servekit-request-counter"
    assert baked == {
        "README.md", "pyproject.toml", "src/servekit_request_counter/__init__.py", "tests/test_plugin.py",
    }
    assert 'request_counter = "servekit_request_counter"' in (project / "pyproject.toml").read_text()


def test_listed_by_servekit_plugins(plugin_install):
    _, env, _ = plugin_install
    result = subprocess.run([sys.executable, "-m", "servekit", "plugins", "--json"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    listed = {p["name"]: p for p in json.loads(result.stdout)}
    assert listed["request_counter"]["hooks"] == ["predict", "register_routes"]
    assert "servekit-request-counter" in listed["request_counter"]["source"]


def test_in_effect_on_a_served_model(plugin_install, tmp_path):
    _, env, _ = plugin_install
    fit_iris(tmp_path / "iris")
    with ServerProcess(tmp_path / "iris", env=env, workers=1) as server:
        assert requests.get(server.url + "/-/request_counter", timeout=30).json() == {"predictions": {}, "failures": {}}
        answer = requests.post(server.url + "/v1/models/iris:predict",
                               json={"instances": [[5.1, 3.5, 1.4, 0.2]]}, timeout=30)
        assert answer.status_code == 200, answer.text
        bad = requests.post(server.url + "/v1/models/iris:predict", json={"instances": [["x"]]}, timeout=30)
        assert bad.status_code == 400
        counts = requests.get(server.url + "/-/request_counter", timeout=30).json()
    assert counts == {"predictions": {"iris": 1}, "failures": {"iris": 1}}


def test_without_the_install_it_is_absent(tmp_path):
    result = subprocess.run([sys.executable, "-m", "servekit", "plugins", "--json"],
                            capture_output=True, text=True, timeout=120)
    assert "request_counter" not in {p["name"] for p in json.loads(result.stdout)}


def test_generated_plugin_tests_pass(plugin_install):
    project, env, _ = plugin_install
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                            cwd=project, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "3 passed" in result.stdout
