"""The deployment templates: hadolint on every Dockerfile, Kubernetes schemas on every manifest.

KServe's InferenceService is not in the Kubernetes schemas: its predictor's pod
part is validated as a real ``v1`` Pod with ``kubernetes-validate``, and the
KServe fields around it against a JSON schema written here from KServe's CRD
(``PredictorSpec`` + ``ComponentExtensionSpec``), plus the rules KServe's
webhook applies to a custom predictor.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import servekit
import yaml
from repo_paths import REPO as ROOT
from servekit.cli.commands import main as cli
from servekit.scaffold import project as scaffold
from servekit.scaffold import render as scaffold_render
from servekit.server.gunicorn_app import ServekitApplication
from servekit.server.settings import Settings, resolve

HADOLINT = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
K8S_VERSION = "1.30.0"

VARIANTS = [
    pytest.param(dict(gpu=False, torch=False), id="cpu"),
    pytest.param(dict(gpu=False, torch=True), id="cpu-torch"),
    pytest.param(dict(gpu=True, torch=True), id="gpu-torch"),
    pytest.param(dict(gpu=True, torch=False), id="gpu"),
]


def options(**kw) -> scaffold.BuildOptions:
    return scaffold.BuildOptions(model_name="Iris_Classifier", image="registry.local/iris:1", **kw)


# -- Dockerfile ---------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_hadolint_passes(tmp_path, variant):
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(scaffold.render_dockerfile(options(**variant)))
    result = subprocess.run([HADOLINT, "--no-color", str(dockerfile)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("variant", VARIANTS)
def test_dockerfile_shape(variant):
    text = scaffold.render_dockerfile(options(**variant))
    lines = [line.strip() for line in text.splitlines()]
    froms = [line for line in lines if line.startswith("FROM ")]
    assert [f.split()[-1] for f in froms] == ["builder", "runtime"]  # multi-stage
    assert all(f.startswith("FROM ${BASE_IMAGE} ") for f in froms)
    if variant["gpu"]:
        assert "ARG BASE_IMAGE=nvidia/cuda:12.6.3-runtime-ubuntu24.04" in lines
    else:
        assert "ARG BASE_IMAGE=python:3.12-slim" in lines
    assert "syntax" not in lines[0]  # a `# syntax=` line makes BuildKit pull its frontend from Docker Hub
    assert "STOPSIGNAL SIGTERM" in lines
    if variant["torch"]:
        flavour = "cu126" if variant["gpu"] else "cpu"
        # PyTorch's index first, then what --pip-extra-index-url adds
        assert f'PIP_EXTRA_INDEX_URL="https://download.pytorch.org/whl/{flavour} ${{PIP_EXTRA_INDEX_URL}}"' in text
    else:
        assert "download.pytorch.org" not in text
    assert "ARG PIP_INDEX_URL" in lines and "ARG PIP_EXTRA_INDEX_URL" in lines
    # dependencies before source: requirements are installed before the model is copied
    assert lines.index("COPY requirements.txt .") < lines.index("COPY --chown=10001:10001 . /app/model")
    assert "USER 10001" in lines and lines.index("USER 10001") < lines.index("EXPOSE 8080 8081")
    assert "SERVEKIT_MODEL_NAME=Iris_Classifier \\" in lines
    assert "/v2/health/ready" in text.split("HEALTHCHECK", 1)[1]
    assert lines[-1] == 'CMD ["/bin/sh", "-c", "exec gunicorn --config /app/gunicorn.conf.py servekit.server.wsgi:app"]'


# -- Kubernetes -----------------------------------------------------------------------


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "gpu"])
def test_kubernetes_manifests_validate(gpu):
    docs = list(yaml.safe_load_all(scaffold.render_manifests(options(gpu=gpu))["kubernetes.yaml"]))
    assert [d["kind"] for d in docs] == ["Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"]
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    deployment = docs[0]
    assert deployment["metadata"]["name"] == "iris-classifier"  # a DNS-1035 label
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.local/iris:1"
    assert container["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert [p["containerPort"] for p in container["ports"]] == [8080, 8081]
    assert ("nvidia.com/gpu" in container["resources"]["limits"]) is gpu
    assert docs[2]["spec"]["scaleTargetRef"]["name"] == "iris-classifier"


def test_deployment_stops_routing_before_it_stops_accepting():
    """SIGTERM while endpoints still route to the pod: readiness 503 first, accept for a while, then drain.

    The kubelet's SIGKILL must come after gunicorn's own deadline (delay + drain).
    """
    deployment = next(yaml.safe_load_all(scaffold.render_manifests(options())["kubernetes.yaml"]))
    pod = deployment["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    delay, drain = float(env["SERVEKIT_SHUTDOWN_DELAY"]), float(env["SERVEKIT_DRAIN_SECONDS"])
    assert delay >= 5  # endpoints, kube-proxy and ingresses need seconds to stop routing
    settings = resolve(environ={k: v for k, v in env.items() if k.startswith("SERVEKIT_")})
    assert (settings.shutdown_delay, settings.drain_seconds) == (delay, drain)  # the names servekit reads
    graceful = ServekitApplication(settings).cfg.graceful_timeout
    assert graceful >= delay + drain
    assert pod["terminationGracePeriodSeconds"] > graceful
    assert "lifecycle" not in pod["containers"][0]  # the delay is servekit's, no shell needed in the image


def test_defaults_follow_servekit_serve():
    """The renderer cannot import servekit (plain cookiecutter runs it); its copies of the defaults agree."""
    defaults = Settings()
    assert defaults.threads == scaffold_render.DEFAULT_THREADS
    assert defaults.drain_seconds == scaffold_render.DEFAULT_DRAIN_SECONDS
    assert scaffold.BuildOptions(model_name="m").servekit_version == servekit.__version__


def test_kubernetes_validate_catches_a_broken_manifest():
    """The check above can fail: a probe with a string port number is rejected."""
    doc = next(yaml.safe_load_all(scaffold.render_manifests(options())["kubernetes.yaml"]))
    doc["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


#: KServe v1beta1 fields around the predictor's pod spec (PredictorSpec + ComponentExtensionSpec).
KSERVE_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "serving.kserve.io/v1beta1"},
        "kind": {"const": "InferenceService"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            # KServe's webhook: lower case alphanumerics or '-', starting with a letter
            "properties": {"name": {"type": "string", "pattern": "^[a-z]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63}},
        },
        "spec": {
            "type": "object",
            "required": ["predictor"],
            "additionalProperties": False,
            "properties": {
                "predictor": {
                    "type": "object",
                    "required": ["containers"],
                    "properties": {
                        "minReplicas": {"type": "integer", "minimum": 0},
                        "maxReplicas": {"type": "integer", "minimum": 0},
                        "scaleMetric": {"enum": ["cpu", "memory", "concurrency", "rps"]},
                        "scaleTarget": {"type": "integer", "minimum": 1},
                        "containerConcurrency": {"type": "integer", "minimum": 0},
                        "timeout": {"type": "integer", "minimum": 1},
                        "canaryTrafficPercent": {"type": "integer", "minimum": 0, "maximum": 100},
                        "containers": {"type": "array", "minItems": 1},
                    },
                }
            },
        },
    },
}
#: Keys of the predictor that belong to ComponentExtensionSpec, not to the pod spec.
EXTENSION_KEYS = {
    "minReplicas",
    "maxReplicas",
    "scaleMetric",
    "scaleTarget",
    "containerConcurrency",
    "timeout",
    "canaryTrafficPercent",
    "logger",
    "batcher",
    "labels",
    "annotations",
}


def check_inference_service(doc: dict) -> None:
    jsonschema.validate(doc, KSERVE_SCHEMA)
    predictor = doc["spec"]["predictor"]
    pod_spec = {k: v for k, v in predictor.items() if k not in EXTENSION_KEYS}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": doc["metadata"]["name"]}, "spec": pod_spec}
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    # KServe's custom predictor rules
    container = predictor["containers"][0]
    assert container["name"] == "kserve-container"
    env = {e["name"]: e["value"] for e in container.get("env", [])}
    assert env.get("PROTOCOL", "v1") in ("v1", "v2")
    assert len(container["ports"]) == 1, "Knative forwards exactly one port"
    assert predictor.get("minReplicas", 1) <= predictor.get("maxReplicas", 1) or predictor.get("maxReplicas") == 0


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "gpu"])
def test_kserve_inference_service_validates(gpu):
    doc = yaml.safe_load(scaffold.render_manifests(options(gpu=gpu))["kserve.yaml"])
    check_inference_service(doc)
    container = doc["spec"]["predictor"]["containers"][0]
    assert container["ports"] == [{"name": "http1", "containerPort": 8080, "protocol": "TCP"}]
    assert {"name": "PROTOCOL", "value": "v2"} in container["env"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert doc["spec"]["predictor"]["scaleMetric"] == "concurrency"
    # Knative's queue-proxy drains before SIGTERM reaches the container, whose grace period is `timeout`
    env = {e["name"]: e["value"] for e in container["env"]}
    drain = float(env["SERVEKIT_SHUTDOWN_DELAY"]) + float(env["SERVEKIT_DRAIN_SECONDS"])
    assert 0 < drain < doc["spec"]["predictor"]["timeout"]


def test_kserve_check_catches_mistakes():
    doc = yaml.safe_load(scaffold.render_manifests(options())["kserve.yaml"])
    doc["spec"]["predictor"]["scaleMetric"] = "latency"
    with pytest.raises(jsonschema.ValidationError):
        check_inference_service(doc)
    doc = yaml.safe_load(scaffold.render_manifests(options())["kserve.yaml"])
    doc["spec"]["predictor"]["containers"][0]["ports"][0]["containerPort"] = "8080"
    with pytest.raises(kubernetes_validate.ValidationError):
        check_inference_service(doc)


# -- gunicorn.conf.py ------------------------------------------------------------------


def test_gunicorn_conf_matches_servekit_serve(monkeypatch):
    """The image's gunicorn config makes the same choices as ``servekit serve`` for the same variables."""
    from gunicorn.config import Config
    from servekit.server.gunicorn_app import ServekitApplication
    from servekit.server.settings import resolve

    env = {
        "SERVEKIT_HTTP_PORT": "9123",
        "SERVEKIT_HOST": "127.0.0.1",
        "SERVEKIT_WORKERS": "3",
        "SERVEKIT_THREADS": "5",
        "SERVEKIT_REQUEST_TIMEOUT": "90",
        "SERVEKIT_PRELOAD": "true",
        "SERVEKIT_LOG_LEVEL": "warning",
        "SERVEKIT_REQUEST_LOG_URL": "sqlite:///:memory:",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "")
    spec = importlib.util.spec_from_file_location("image_gunicorn_conf", scaffold.DOCKER_TEMPLATES / "gunicorn.conf.py")
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)  # sets up the server's shared folders and its owner, as in an image
    try:
        # gunicorn reads a config file the same way: every setting named at module level
        loaded = Config()
        for name, value in vars(conf).items():
            if name in loaded.settings:
                loaded.set(name, value)
        cfg = ServekitApplication(resolve(environ=env)).cfg
    finally:
        conf.on_exit(None)  # what gunicorn's master calls on its way out
    for key in (
        "bind",
        "workers",
        "worker_class",
        "threads",
        "timeout",
        "graceful_timeout",
        "keepalive",
        "loglevel",
        "preload_app",
        "proc_name",
        "errorlog",
        "accesslog",
    ):
        assert loaded.settings[key].value == cfg.settings[key].value, key
    assert loaded.bind == ["127.0.0.1:9123"] and loaded.workers == 3 and loaded.threads == 5
    assert loaded.timeout == 180 and loaded.preload_app is True
    assert loaded.worker_class_str == "servekit.server.slow_clients.HeaderTimeoutWorker"  # gthread + header deadline
    for hook in ("post_worker_init", "worker_exit", "child_exit", "when_ready"):
        assert callable(getattr(conf, hook)), hook


def test_gunicorn_conf_refuses_a_taken_port_in_one_line(monkeypatch):
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        monkeypatch.setenv("SERVEKIT_HOST", "127.0.0.1")
        monkeypatch.setenv("SERVEKIT_HTTP_PORT", str(port))
        monkeypatch.setenv("SERVEKIT_GRPC_PORT", "0")
        spec = importlib.util.spec_from_file_location("taken_conf", scaffold.DOCKER_TEMPLATES / "gunicorn.conf.py")
        with pytest.raises(SystemExit) as exited:
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
    message = str(exited.value)
    assert message.startswith("servekit: ") and str(port) in message and "\n" not in message


# -- servekit build ----------------------------------------------------------------------


#: The startup probe's seconds, given: the tests below are about the build context, and timing the
#: model's start (tests/scaffold/test_manifests.py's) takes as long as a start.
UNTIMED = ("--startup-seconds", "60")


@pytest.fixture
def model_folder(tmp_path) -> Path:
    folder = tmp_path / "iris"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.joblib").write_bytes(b"placeholder")
    return folder


@pytest.mark.slow  # a servekit or cookiecutter subprocess: out of the quick lane
def test_build_without_docker_fails_in_one_line_but_writes_the_context(model_folder, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "docker"  # a client whose engine does not answer, as on a laptop with Docker stopped
    fake.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
    fake.chmod(0o755)
    result = subprocess.run(
        [sys.executable, "-m", "servekit", "build", str(model_folder), "--tag", "iris:2", "--gpu", "--no-wheel"],
        env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("servekit build: no Docker engine answered"), result.stderr
    assert f"docker build --tag iris:2 {model_folder}" in lines[0] and "--context-only" in lines[0]
    names = sorted(str(p.relative_to(model_folder)) for p in model_folder.rglob("*") if p.is_file())
    assert names == [
        ".dockerignore",
        "1/model.joblib",
        "Dockerfile",
        "deploy/kserve-runtime.yaml",
        "deploy/kserve.yaml",
        "deploy/kubernetes.yaml",
        "gunicorn.conf.py",
        "requirements.txt",
    ]
    assert (model_folder / "requirements.txt").read_text().splitlines()[
        -1
    ] == f"servekit[sklearn,grpc]=={servekit.__version__}"
    dockerfile = (model_folder / "Dockerfile").read_text()
    assert "nvidia/cuda" in dockerfile and "SERVEKIT_MODEL_NAME=iris" in dockerfile
    assert "image: iris:2" in (model_folder / "deploy" / "kubernetes.yaml").read_text()


def test_build_context_only_succeeds_without_docker(model_folder, monkeypatch, capsys):
    monkeypatch.setattr(scaffold, "docker_available", lambda client=None: False)
    assert cli(["build", str(model_folder), "--context-only", "--no-wheel", *UNTIMED]) == 0
    assert "build context ready" in capsys.readouterr().out
    assert (model_folder / "Dockerfile").is_file()


def test_build_keeps_an_edited_dockerfile(model_folder, capsys):
    assert cli(["build", str(model_folder), "--no-docker", "--no-wheel", *UNTIMED]) == 0
    dockerfile = model_folder / "Dockerfile"
    edited = (
        "\n".join(line for line in dockerfile.read_text().splitlines() if scaffold.MARKER not in line) + "\n# mine\n"
    )
    dockerfile.write_text(edited)
    assert cli(["build", str(model_folder), "--no-docker", "--gpu", "--no-wheel", *UNTIMED]) == 0
    assert dockerfile.read_text() == edited
    assert "kept Dockerfile" in capsys.readouterr().out


@pytest.mark.slow
def test_source_install_puts_a_servekit_wheel_in_the_context(model_folder, capsys):
    """servekit from this checkout is on no index: the image must install the wheel in the context."""
    assert scaffold.installed_from() == ("source", ROOT)  # the editable install the tests run from
    result = subprocess.run(
        [sys.executable, "-m", "servekit", "build", str(model_folder), "--context-only"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = (model_folder / "wheels").iterdir()
    assert wheel.name == f"servekit-{servekit.__version__}-py3-none-any.whl"
    shipped = set(zipfile.ZipFile(wheel).namelist())
    assert {"servekit/scaffold/render.py", "servekit_sklearn/__init__.py"} <= shipped
    dockerfile = (model_folder / "Dockerfile").read_text()
    assert f"COPY wheels/{wheel.name} /build/wheels/{wheel.name}" in dockerfile
    assert f"RUN pip install --no-cache-dir /build/wheels/{wheel.name} -r requirements.txt" in dockerfile
    assert (model_folder / "requirements.txt").read_text().splitlines()[
        -1
    ] == f"servekit[sklearn,grpc]=={servekit.__version__}"
    lint = subprocess.run([HADOLINT, "--no-color", str(model_folder / "Dockerfile")], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout

    # --wheel PATH installs that wheel (and drops the previous one); --no-wheel goes back to the index
    mine = model_folder.parent / f"servekit-{servekit.__version__}.post1-py3-none-any.whl"
    shutil.copy(wheel, mine)
    assert cli(["build", str(model_folder), "--context-only", "--wheel", str(mine)]) == 0
    assert [p.name for p in (model_folder / "wheels").iterdir()] == [mine.name]
    assert f"/build/wheels/{mine.name} -r requirements.txt" in (model_folder / "Dockerfile").read_text()
    assert (
        f"warning: requirements.txt pins servekit=={servekit.__version__}" in capsys.readouterr().out
    )  # pip would refuse
    assert cli(["build", str(model_folder), "--context-only", "--no-wheel"]) == 0
    assert "RUN pip install --no-cache-dir -r requirements.txt" in (model_folder / "Dockerfile").read_text()
    assert list((model_folder / "wheels").iterdir()) == []


def test_wheel_option_refuses_what_is_not_a_wheel(model_folder, capsys):
    assert cli(["build", str(model_folder), "--context-only", "--wheel", str(model_folder / "1" / "model.joblib")]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("servekit build: --wheel: expected a servekit wheel file")
    assert out == ""  # refused before the model is timed, which takes as long as its start


def test_docker_available_needs_an_engine(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert scaffold.docker_available() is False
    fake = tmp_path / "docker"
    fake.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
    fake.chmod(0o755)
    assert scaffold.docker_available() is False  # a binary alone is not an engine


def test_detect_extras(tmp_path):
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "saved_model.pb").write_bytes(b"")
    (tmp_path / "model.py").write_text("")
    assert scaffold.detect_extras(tmp_path) == ["tensorflow"]
    assert scaffold.needs_torch(f"servekit[huggingface]=={servekit.__version__}\n")
    assert scaffold.needs_torch("torch==2.5.1  # pinned\n")
    assert not scaffold.needs_torch("servekit[sklearn]\n# torch later\n")


# -- servekit new: names ------------------------------------------------------------------


@pytest.mark.slow  # a servekit or cookiecutter subprocess: out of the quick lane
@pytest.mark.parametrize(
    "answers, message",
    [
        (["project_slug=Bad Name"], "folder name 'Bad Name' is not valid"),
        (["project_name=9 Lives"], "folder name '9-lives' is not valid"),
        (["model_name=../etc"], "model name '../etc' is not valid"),
        (["python_version=three"], "python version 'three' is not valid"),
    ],
)
def test_new_rejects_invalid_names(tmp_path, answers, message):
    args = [sys.executable, "-m", "servekit", "new", "--no-input", "--output-dir", str(tmp_path)]
    for answer in answers:
        args += ["--set", answer]
    result = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("servekit new: ") and message in lines[0], result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # a servekit or cookiecutter subprocess: out of the quick lane
def test_new_plugin_rejects_invalid_package_name(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "servekit",
            "new",
            "--plugin",
            "--no-input",
            "--output-dir",
            str(tmp_path),
            "--set",
            "package_name=class",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "servekit new --plugin: package name 'class' is not a valid lower-case Python identifier"
    ]


@pytest.mark.slow  # a servekit or cookiecutter subprocess: out of the quick lane
@pytest.mark.parametrize(
    "answers, line",
    [
        (
            ["framework=pytorch"],
            "servekit new: --set framework=pytorch: expected one of sklearn, torch, tensorflow, huggingface, xgboost, lightgbm, onnx, custom",
        ),
        (
            ["frmework=torch"],
            "servekit new: --set frmework: no such template variable; expected one of "
            "project_name, project_slug, model_name, framework, gpu, python_version",
        ),
        (["gpu=maybe"], "servekit new: --set gpu=maybe: expected yes or no"),
        (["framework"], "servekit new: --set expects KEY=VALUE, found 'framework'"),
    ],
)
def test_new_cli_mistakes_are_one_line(tmp_path, answers, line):
    args = [sys.executable, "-m", "servekit", "new", "--no-input", "--output-dir", str(tmp_path)]
    for answer in answers:
        args += ["--set", answer]
    result = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stderr.splitlines()) == (2, [line])
    assert list(tmp_path.iterdir()) == []


#: Makes ``import servekit`` fail in every Python started with it on PYTHONPATH (cookiecutter's hooks too).
BLOCK_SERVEKIT = """
import sys


class _NoServekit:
    def find_spec(self, name, path=None, target=None):
        if name == "servekit" or name.startswith("servekit."):
            raise ImportError("servekit is not installed here")


sys.meta_path.insert(0, _NoServekit())
"""


@pytest.mark.slow  # a servekit or cookiecutter subprocess: out of the quick lane
@pytest.mark.parametrize("framework, gpu", [("sklearn", "no"), ("huggingface", "yes")])
def test_plain_cookiecutter_renders_the_build_files_without_servekit(tmp_path, framework, gpu):
    """``cookiecutter cookiecutter/container`` where servekit is not importable writes the same files."""
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(BLOCK_SERVEKIT)
    env = {**os.environ, "PYTHONPATH": str(blocker)}
    probe = subprocess.run([sys.executable, "-c", "import servekit"], env=env, capture_output=True, text=True)
    assert probe.returncode != 0 and "not installed here" in probe.stderr  # the check below can fail
    out = tmp_path / "out"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "cookiecutter",
            "--no-input",
            "--output-dir",
            str(out),
            str(ROOT / "cookiecutter" / "container"),
            "project_name=Plain Demo",
            "model_name=Plain_Demo",
            f"framework={framework}",
            f"gpu={gpu}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    project = out / "plain-demo"
    # the same template text and renderer as `servekit build` for this project
    options = scaffold.BuildOptions(model_name="Plain_Demo", gpu=gpu == "yes", torch=framework == "huggingface")
    for name in scaffold.BUILD_FILES:
        if scaffold_render.wanted(name, options):
            assert (project / name).read_text() == scaffold.build_file(name, options), name
    assert "ARG BASE_IMAGE=python:3.12-slim" in (project / "Dockerfile").read_text() or gpu == "yes"
    assert ("download.pytorch.org/whl/cu126" in (project / "Dockerfile").read_text()) is (gpu == "yes")
    lint = subprocess.run([HADOLINT, "--no-color", str(project / "Dockerfile")], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout
    assert not (project / "_frameworks").exists() and (project / ".dockerignore").is_file()


def test_container_template_code_imports_no_servekit():
    """The hooks and the extension run in cookiecutter's Python, where servekit may be absent."""
    template = scaffold.CONTAINER_TEMPLATE
    for path in [*template.glob("hooks/*.py"), template / "servekit_files.py", scaffold_render.__file__]:
        imports = re.findall(r"^\s*(?:from|import)\s+(\S+)", Path(path).read_text(), re.MULTILINE)
        assert imports and not [m for m in imports if m.split(".")[0] in ("servekit", "")], (path, imports)


# -- packaging -------------------------------------------------------------------------------


def test_top_level_folders_are_the_packaged_templates():
    assert (ROOT / "cookiecutter").resolve() == (scaffold.TEMPLATES_ROOT / "cookiecutter").resolve()
    assert (ROOT / "templates").resolve() == scaffold.DOCKER_TEMPLATES.resolve()


@pytest.mark.slow
def test_wheel_ships_the_templates(tmp_path):
    """A wheel (not only the editable install) carries every template file."""
    source = tmp_path / "src"
    source.mkdir()
    shutil.copy(ROOT / "pyproject.toml", source)
    for name in ("README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, source)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "framework", source / "framework", ignore=ignore)
    shutil.copytree(ROOT / "plugins", source / "plugins", ignore=ignore)
    env = {**os.environ, "PIP_NO_INDEX": "1"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(source),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = (tmp_path / "dist").glob("servekit-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        str(p.relative_to(scaffold.TEMPLATES_ROOT.parents[2]))  # servekit/scaffold/templates/...
        for p in scaffold.TEMPLATES_ROOT.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert expected and expected <= names, sorted(expected - names)[:5]


def test_detect_extras_of_the_framework_plugins(tmp_path):
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.onnx").write_bytes(b"")
    (tmp_path / "1" / "model.bst").write_bytes(b"tree\nversion=v4\n")  # LightGBM's text format
    assert scaffold.detect_extras(tmp_path) == ["onnx", "lightgbm"]
    (tmp_path / "1" / "model.bst").write_bytes(b"{L\x00\x00\x00\x00\x00\x00\x00\x07learner")  # XGBoost's UBJSON
    assert scaffold.detect_extras(tmp_path) == ["onnx", "xgboost"]


def test_detect_extras_of_an_mlflow_folder(tmp_path):
    (tmp_path / "MLmodel").write_text("flavors:\n  python_function: {}\n  lightgbm: {data: model.lgb}\n")
    assert scaffold.detect_extras(tmp_path) == ["mlflow", "lightgbm"]


def test_build_takes_tls_and_key_secrets_from_the_command_line(model_folder, capsys):
    assert (
        cli(
            [
                "build",
                str(model_folder),
                "--context-only",
                "--no-wheel",
                "--tls-secret",
                "iris-tls",
                "--tls-client-ca",
                "--api-keys-secret",
                "iris-keys",
                *UNTIMED,
            ]
        )
        == 0
    )
    manifest = (model_folder / "deploy" / "kubernetes.yaml").read_text()
    assert "secretName: iris-tls" in manifest and "secretName: iris-keys" in manifest
    assert "SERVEKIT_TLS_CLIENT_CA" in manifest
    capsys.readouterr()
    assert cli(["build", str(model_folder), "--context-only", "--no-wheel", "--tls-client-ca"]) == 2
    assert "--tls-client-ca needs --tls-secret" in capsys.readouterr().err
