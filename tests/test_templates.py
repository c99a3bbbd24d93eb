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
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from servekit import scaffold
from servekit.cli import main as cli

ROOT = Path(__file__).resolve().parents[1]
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
    if variant["gpu"]:
        assert "ARG CUDA_BASE=nvidia/cuda:12.6.3-runtime-ubuntu24.04" in lines
    else:
        assert all("python:${PYTHON_VERSION}-slim" in f for f in froms)
    if variant["torch"]:
        flavour = "cu126" if variant["gpu"] else "cpu"
        assert f"PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/{flavour}" in text
    else:
        assert "PIP_EXTRA_INDEX_URL" not in text
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
    assert [d["kind"] for d in docs] == ["Deployment", "Service", "HorizontalPodAutoscaler"]
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
EXTENSION_KEYS = {"minReplicas", "maxReplicas", "scaleMetric", "scaleTarget", "containerConcurrency",
                  "timeout", "canaryTrafficPercent", "logger", "batcher", "labels", "annotations"}


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
    assert doc["spec"]["predictor"]["scaleMetric"] == "concurrency"


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
    from servekit.settings import resolve

    env = {"SERVEKIT_HTTP_PORT": "9123", "SERVEKIT_HOST": "127.0.0.1", "SERVEKIT_WORKERS": "3",
           "SERVEKIT_THREADS": "5", "SERVEKIT_REQUEST_TIMEOUT": "90", "SERVEKIT_PRELOAD": "true",
           "SERVEKIT_LOG_LEVEL": "warning", "SERVEKIT_REQUEST_LOG_URL": "sqlite:///:memory:"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "")
    spec = importlib.util.spec_from_file_location("image_gunicorn_conf", scaffold.DOCKER_TEMPLATES / "gunicorn.conf.py")
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    # gunicorn reads a config file the same way: every setting named at module level
    loaded = Config()
    for name, value in vars(conf).items():
        if name in loaded.settings:
            loaded.set(name, value)
    cfg = ServekitApplication(resolve(environ=env)).cfg
    for key in ("bind", "workers", "worker_class", "threads", "timeout", "graceful_timeout", "keepalive",
                "loglevel", "preload_app", "proc_name", "errorlog", "accesslog"):
        assert loaded.settings[key].value == cfg.settings[key].value, key
    assert loaded.bind == ["127.0.0.1:9123"] and loaded.workers == 3 and loaded.threads == 5
    assert loaded.timeout == 180 and loaded.preload_app is True and loaded.worker_class_str == "gthread"
    for hook in ("post_worker_init", "worker_exit", "child_exit"):
        assert callable(getattr(conf, hook)), hook


# -- servekit build ----------------------------------------------------------------------


@pytest.fixture
def model_folder(tmp_path) -> Path:
    folder = tmp_path / "iris"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.joblib").write_bytes(b"placeholder")
    return folder


def test_build_without_docker_writes_files_and_says_how(model_folder, capsys, monkeypatch):
    monkeypatch.setattr(scaffold, "docker_available", lambda: False)
    assert cli(["build", str(model_folder), "--tag", "iris:2", "--gpu"]) == 0
    out = capsys.readouterr().out
    assert f"docker build --tag iris:2 {model_folder}" in out
    assert "no Docker engine answered" in out
    names = sorted(str(p.relative_to(model_folder)) for p in model_folder.rglob("*") if p.is_file())
    assert names == [".dockerignore", "1/model.joblib", "Dockerfile", "deploy/kserve.yaml",
                     "deploy/kubernetes.yaml", "gunicorn.conf.py", "requirements.txt"]
    assert (model_folder / "requirements.txt").read_text().splitlines()[-1] == "servekit[sklearn]==0.1.0"
    dockerfile = (model_folder / "Dockerfile").read_text()
    assert "nvidia/cuda" in dockerfile and "SERVEKIT_MODEL_NAME=iris" in dockerfile
    assert "image: iris:2" in (model_folder / "deploy" / "kubernetes.yaml").read_text()


def test_build_keeps_an_edited_dockerfile(model_folder, capsys):
    assert cli(["build", str(model_folder), "--no-docker"]) == 0
    dockerfile = model_folder / "Dockerfile"
    edited = "\n".join(line for line in dockerfile.read_text().splitlines() if scaffold.MARKER not in line) + "\n# mine\n"
    dockerfile.write_text(edited)
    assert cli(["build", str(model_folder), "--no-docker", "--gpu"]) == 0
    assert dockerfile.read_text() == edited
    assert "kept Dockerfile" in capsys.readouterr().out


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
    assert scaffold.needs_torch("servekit[huggingface]==0.1.0\n")
    assert scaffold.needs_torch("torch==2.5.1  # pinned\n")
    assert not scaffold.needs_torch("servekit[sklearn]\n# torch later\n")


# -- servekit new: names ------------------------------------------------------------------


@pytest.mark.parametrize(
    "answers, message",
    [
        (["project_slug=Bad Name"], "folder name 'Bad Name' is not valid"),
        (["model_name=../etc"], "model name '../etc' is not valid"),
        (["python_version=three"], "python version 'three' is not valid"),
    ],
)
def test_new_rejects_invalid_names(tmp_path, answers, message):
    args = [sys.executable, "-m", "servekit", "new", "--no-input", "--output-dir", str(tmp_path)]
    for answer in answers:
        args += ["--set", answer]
    result = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert message in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_new_plugin_rejects_invalid_package_name(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "servekit", "new", "--plugin", "--no-input", "--output-dir", str(tmp_path),
         "--set", "package_name=class"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 1
    assert "package name 'class' is not a valid" in result.stderr


# -- packaging -------------------------------------------------------------------------------


def test_top_level_folders_are_the_packaged_templates():
    assert (ROOT / "cookiecutter").resolve() == (scaffold.TEMPLATES_ROOT / "cookiecutter").resolve()
    assert (ROOT / "templates").resolve() == scaffold.DOCKER_TEMPLATES.resolve()


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
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"), str(source)],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = (tmp_path / "dist").glob("servekit-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        "servekit/" + str(p.relative_to(scaffold.TEMPLATES_ROOT.parent))
        for p in scaffold.TEMPLATES_ROOT.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert expected and expected <= names, sorted(expected - names)[:5]
