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

import numpy as np
import pytest
import requests
from generated_projects import bake, files_in
from servekit.testing import ServerProcess
from sklearn_models import fit_iris

pytestmark = pytest.mark.slow  # starts real servers or subprocesses


def install(base, *answers):
    """Bake the plugin template and pip-install the package into ``base/site`` (PYTHONPATH of the subprocesses)."""
    project = bake(base, *answers, plugin=True)
    baked = files_in(project)  # before pip builds in the folder
    target = base / "site"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "--target",
            str(target),
            str(project),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))}
    return project, env, baked


@pytest.fixture(scope="module")
def plugin_install(tmp_path_factory):
    return install(tmp_path_factory.mktemp("plugin"), "plugin_name=Request Counter")


@pytest.fixture(scope="module")
def framework_install(tmp_path_factory):
    return install(tmp_path_factory.mktemp("framework"), "kind=framework")


def test_plugin_files(plugin_install):
    project, _, baked = plugin_install
    assert project.name == "servekit-request-counter"
    assert baked == {
        "README.md",
        "pyproject.toml",
        "src/servekit_request_counter/__init__.py",
        "tests/test_plugin.py",
    }
    assert 'request_counter = "servekit_request_counter"' in (project / "pyproject.toml").read_text()


def test_listed_by_servekit_plugins(plugin_install):
    _, env, _ = plugin_install
    result = subprocess.run(
        [sys.executable, "-m", "servekit", "plugins", "--json"], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    listed = {p["name"]: p for p in json.loads(result.stdout)}
    assert listed["request_counter"]["hooks"] == ["predict", "register_routes"]
    assert "servekit-request-counter" in listed["request_counter"]["source"]


def test_in_effect_on_a_served_model(plugin_install, tmp_path):
    _, env, _ = plugin_install
    fit_iris(tmp_path / "iris")
    with ServerProcess(tmp_path / "iris", env=env, workers=1) as server:
        assert requests.get(server.url + "/-/request_counter", timeout=30).json() == {"predictions": {}, "failures": {}}
        answer = requests.post(
            server.url + "/v1/models/iris:predict", json={"instances": [[5.1, 3.5, 1.4, 0.2]]}, timeout=30
        )
        assert answer.status_code == 200, answer.text
        bad = requests.post(server.url + "/v1/models/iris:predict", json={"instances": [[1.0, 2.0]]}, timeout=30)
        assert bad.status_code == 400
        counts = requests.get(server.url + "/-/request_counter", timeout=30).json()
    assert counts == {"predictions": {"iris": 1}, "failures": {"iris": 1}}


def test_without_the_install_it_is_absent(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "servekit", "plugins", "--json"], capture_output=True, text=True, timeout=120
    )
    assert "request_counter" not in {p["name"] for p in json.loads(result.stdout)}


def test_generated_plugin_tests_pass(plugin_install):
    project, env, _ = plugin_install
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=project,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "3 passed" in result.stdout


# -- the framework variant: a plugin that serves a new kind of model file -----------------------


def test_framework_plugin_files(framework_install):
    project, _, baked = framework_install
    assert project.name == "servekit-linear-npz"
    assert baked == {"README.md", "pyproject.toml", "src/servekit_linear_npz/__init__.py", "tests/test_plugin.py"}
    code = (project / "src" / "servekit_linear_npz" / "__init__.py").read_text()
    assert 'PATTERN = "*.linear.npz"' in code and "wrapper=True" not in code
    assert "isinstance(model" not in code  # servekit routes a model's hooks to the plugin that loaded it


def test_framework_plugin_is_listed(framework_install):
    _, env, _ = framework_install
    result = subprocess.run(
        [sys.executable, "-m", "servekit", "plugins", "--json"], capture_output=True, text=True, env=env, timeout=120
    )
    listed = {p["name"]: p for p in json.loads(result.stdout)}
    assert listed["linear_npz"]["hooks"] == ["load", "metadata", "predict"]


def test_framework_plugin_serves_its_files_and_leaves_the_others(framework_install, tmp_path):
    """Installed beside the first-party plugins: its artifact is served by it, an sklearn folder by sklearn."""
    _, env, _ = framework_install
    (tmp_path / "models" / "linear" / "3").mkdir(parents=True)
    np.savez(tmp_path / "models" / "linear" / "3" / "weights.linear.npz", w=[[2.0], [0.5]], b=[1.0])
    fit_iris(tmp_path / "models" / "iris")
    with ServerProcess(tmp_path / "models", env=env, workers=1) as server:
        linear = requests.post(server.url + "/v1/models/linear:predict", json={"instances": [[1.0, 2.0]]}, timeout=30)
        assert linear.status_code == 200, linear.text
        assert linear.json() == {"predictions": [[4.0]]}
        v2 = requests.get(server.url + "/v2/models/linear", timeout=30).json()
        assert v2["platform"] == "linear_npz" and v2["versions"] == ["3"]
        iris = requests.post(
            server.url + "/v1/models/iris:predict", json={"instances": [[5.1, 3.5, 1.4, 0.2]]}, timeout=30
        )
        assert iris.status_code == 200, iris.text


def test_generated_framework_plugin_tests_pass(framework_install):
    project, env, _ = framework_install
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=project,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "5 passed" in result.stdout
