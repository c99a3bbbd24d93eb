"""``servekit new`` end to end, for every framework choice.

Each generated project is baked with the real CLI, its requirements are
installed only if already satisfied (``pip --no-index``: nothing is downloaded),
its own tests run in a subprocess, and it is served twice: by ``servekit serve``
and by the image's start command (the Dockerfile's ``CMD``, run directly here
because there is no Docker engine) with the ``SERVEKIT_*`` variables the image sets.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from generated_projects import assert_tests_passed, bake
from generated_projects import generated as generated_project
from processes import wait_ready
from servekit.testing import free_port
from servekit.version import __version__

pytestmark = pytest.mark.slow  # starts real servers or subprocesses

HADOLINT = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
COMMON = {
    ".dockerignore",
    ".gitignore",
    "Dockerfile",
    "README.md",
    "deploy/kserve-runtime.yaml",
    "deploy/kserve.yaml",
    "deploy/kubernetes.yaml",
    "gunicorn.conf.py",
    "model.py",
    "requests/v1-predict.json",
    "requests/v2-infer.json",
    "requirements.txt",
    "servekit.yaml",
    "tests/conftest.py",
    "tests/test_model.py",
    "train.py",
    # servekit runs from a source tree here, on no package index: the project carries its wheel
    f"wheels/servekit-{__version__}-py3-none-any.whl",
}
EXTRA_FILES = {"huggingface": {"requests/openai-embeddings.json"}}
#: What the first row of requests/v1-predict.json must come back as.
FIRST_PREDICTION = {
    "sklearn": lambda p: p["label"] == "setosa",
    "torch": lambda p: p["class"] == 0,
    "tensorflow": lambda p: abs(p - 2.5) < 1e-4,
    "huggingface": lambda p: p["label"] == "positive",
    "xgboost": lambda p: p.index(max(p)) == 0,  # setosa's probability is the largest
    "lightgbm": lambda p: p.index(max(p)) == 0,
    "onnx": lambda p: p["label"] == 0,
    "custom": lambda p: abs(p - 2.5) < 1e-4,
}


def start_command(project: Path) -> list[str]:
    """The Dockerfile's CMD, with the image's /app paths pointed at the project."""
    cmd_line = [line for line in (project / "Dockerfile").read_text().splitlines() if line.startswith("CMD ")][-1]
    command = json.loads(cmd_line[len("CMD ") :])
    assert command[:2] == ["/bin/sh", "-c"] and command[2].startswith("exec gunicorn ")
    return [*command[:2], command[2].replace("/app/gunicorn.conf.py", str(project / "gunicorn.conf.py"))]


def image_env(project: Path, port: int) -> dict[str, str]:
    """The ENV the Dockerfile sets, with the model folder and ports of this machine, and one worker
    (as the deploy manifests set SERVEKIT_WORKERS): a second would import the framework again."""
    text = (project / "Dockerfile").read_text()
    model_name = re.search(r"SERVEKIT_MODEL_NAME=(\S+)", text).group(1)
    return {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONUNBUFFERED": "1",
        "SERVEKIT_PATHS": str(project),
        "SERVEKIT_MODEL_NAME": model_name,
        "SERVEKIT_HOST": "127.0.0.1",
        "SERVEKIT_HTTP_PORT": str(port),
        "SERVEKIT_GRPC_PORT": "0",
        "SERVEKIT_WORKERS": "1",
    }


@pytest.mark.parametrize(
    "framework", ["sklearn", "torch", "tensorflow", "huggingface", "xgboost", "lightgbm", "onnx", "custom"]
)
def test_container_template(tmp_path_factory, tmp_path, framework):
    # baked (and its own tests run) once per run: test_generated_container_inputs.py serves it too
    generated = generated_project(tmp_path_factory, framework)
    project = generated.folder
    assert project.name == f"demo-{framework}"
    assert generated.files == COMMON | EXTRA_FILES.get(framework, set())
    assert "_frameworks" not in os.listdir(project)
    lint = subprocess.run([HADOLINT, "--no-color", str(project / "Dockerfile")], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout

    # Install the project's requirements only if they are already satisfied (no download).
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-index", "-q", "-r", str(project / "requirements.txt")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stdout + install.stderr

    # The project's own tests (they train version 1 into 1/ first).
    assert_tests_passed(generated)

    model = f"demo-{framework}"
    v1_body = json.loads((project / "requests" / "v1-predict.json").read_text())
    v2_body = json.loads((project / "requests" / "v2-infer.json").read_text())

    # The image's start command, run directly with the image's variables, answers the project's
    # V1 and V2 requests (`servekit serve` serves every generated project in
    # tests/e2e/test_generated_container_inputs.py).
    port = free_port()
    log = tmp_path / "gunicorn.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            start_command(project), env=image_env(project, port), cwd=tmp_path, stdout=sink, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, log)
        answer = requests.post(f"{url}/v1/models/{model}:predict", json=v1_body, timeout=60)
        assert answer.status_code == 200, answer.text
        assert FIRST_PREDICTION[framework](answer.json()["predictions"][0]), answer.json()
        infer = requests.post(f"{url}/v2/models/{model}/infer", json=v2_body, timeout=60)
        assert infer.status_code == 200, infer.text
        assert {o["name"] for o in infer.json()["outputs"]}
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    assert code == 0, log.read_text()[-5000:]  # gunicorn as PID 1 drains and exits cleanly on SIGTERM
    assert "Booting worker" in log.read_text()  # its log went to stdout/stderr


def test_gpu_project_gets_a_cuda_image(tmp_path):
    project = bake(tmp_path, "project_name=Gpu Demo", "framework=torch", "gpu=yes")
    dockerfile = (project / "Dockerfile").read_text()
    assert "nvidia/cuda:" in dockerfile and "download.pytorch.org/whl/cu126" in dockerfile
    assert "nvidia.com/gpu: 1" in (project / "deploy" / "kubernetes.yaml").read_text()
    assert "device: cuda" in (project / "servekit.yaml").read_text()
    lint = subprocess.run([HADOLINT, "--no-color", str(project / "Dockerfile")], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout
    # `servekit build .` without --gpu keeps the project's choice (its servekit.yaml says build: {gpu: true})
    rebuilt = subprocess.run(
        [sys.executable, "-m", "servekit", "build", ".", "--context-only", "--no-wheel"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "no trained version" in rebuilt.stdout  # a warning: only the context was asked for
    assert (project / "Dockerfile").read_text() == dockerfile
    assert "nvidia.com/gpu: 1" in (project / "deploy" / "kubernetes.yaml").read_text()


def test_build_keeps_the_project_s_python_version(tmp_path):
    project = bake(tmp_path, "project_name=Py Eleven", "framework=custom", "python_version=3.11")
    assert "ARG BASE_IMAGE=python:3.11-slim" in (project / "Dockerfile").read_text()
    subprocess.run([sys.executable, "train.py"], cwd=project, check=True, capture_output=True, timeout=120)
    result = subprocess.run(
        [sys.executable, "-m", "servekit", "build", str(project), "--context-only", "--no-wheel"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "ARG BASE_IMAGE=python:3.11-slim" in (project / "Dockerfile").read_text()
    assert "SERVEKIT_MODEL_NAME=py-eleven" in (project / "Dockerfile").read_text()


def test_build_rerenders_a_generated_project(tmp_path):
    project = bake(tmp_path, "project_name=Rebuild", "framework=custom")
    before = (project / "Dockerfile").read_text()
    result = subprocess.run(
        [sys.executable, "-m", "servekit", "build", str(project), "--gpu", "--no-docker", "--tag", "rebuild:2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    after = (project / "Dockerfile").read_text()
    assert "ARG BASE_IMAGE=python:3.12-slim" in before and "nvidia/cuda" in after
    assert "SERVEKIT_MODEL_NAME=rebuild" in after
    assert "docker build --tag rebuild:2" in result.stdout


@pytest.fixture(scope="module")
def custom_project(tmp_path_factory) -> Path:
    """One baked ``custom`` project with version 1 trained, shared by the tests below."""
    project = bake(tmp_path_factory.mktemp("custom"), "project_name=Shared Demo", "framework=custom")
    subprocess.run([sys.executable, "train.py"], cwd=project, check=True, capture_output=True, timeout=120)
    return project


def test_label_stays_served_when_a_new_version_lands(custom_project, tmp_path, servekit_app):
    """The template's `labels: {stable: 1}` still answers once 2/ appears (a `latest` policy unloads 1)."""
    project = tmp_path / "project"
    shutil.copytree(custom_project, project)
    shutil.copytree(project / "1", project / "2")
    client = servekit_app(project, model_name="shared-demo")
    status = client.get("/v1/models/shared-demo").get_json()["model_version_status"]
    assert {(s["version"], s["state"]) for s in status} == {("1", "AVAILABLE"), ("2", "AVAILABLE")}
    body = json.loads((project / "requests" / "v1-predict.json").read_text())
    answer = client.post("/v1/models/shared-demo/labels/stable:predict", json=body)
    assert answer.status_code == 200, answer.get_json()
    assert FIRST_PREDICTION["custom"](answer.get_json()["predictions"][0])


def test_image_under_the_deployment_env_turns_unready_then_drains(custom_project, tmp_path):
    """SIGTERM with the Deployment's variables: readiness 503 at once, requests still answered, clean exit.

    That is what lets the endpoints stop routing to a terminating pod before
    its listener closes (kubelet sends SIGTERM to PID 1, gunicorn's master).
    """
    import yaml

    deployment = next(yaml.safe_load_all((custom_project / "deploy" / "kubernetes.yaml").read_text()))
    pod = deployment["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    port = free_port()
    log = tmp_path / "gunicorn.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            start_command(custom_project),
            env={**image_env(custom_project, port), **env},
            cwd=tmp_path,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    body = json.loads((custom_project / "requests" / "v1-predict.json").read_text())
    try:
        wait_ready(url, proc, log)
        proc.send_signal(signal.SIGTERM)
        for _ in range(1000):  # the worker gets SIGTERM from the master a moment later
            ready = requests.get(url + "/v2/health/ready", timeout=5)
            if ready.status_code != 200:
                break
        assert ready.status_code == 503, ready.text
        answer = requests.post(f"{url}/v1/models/shared-demo:predict", json=body, timeout=30)
        assert answer.status_code == 200, answer.text  # still accepting during SERVEKIT_SHUTDOWN_DELAY
        code = proc.wait(timeout=pod["terminationGracePeriodSeconds"])  # before the kubelet's SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, log.read_text()[-5000:]
