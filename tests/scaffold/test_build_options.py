"""``servekit build``'s options and a project's own build settings, without a Docker engine.

The real build of an image is ``tests/scaffold/test_docker_image.py``; here: what the
options put into the Dockerfile and the ``docker build`` command line, how the
command line, ``servekit.yaml``'s ``build:`` and an earlier build's choices
combine, and the checks that refuse a build that could not work.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from servekit.cli.commands import main as cli
from servekit.folders.layout import discover
from servekit.folders.servekit_yaml import ConfigError, parse_model_config
from servekit.scaffold import build_settings as scaffold_settings
from servekit.scaffold import project as scaffold
from servekit.server.gunicorn_app import ServekitApplication
from servekit.server.settings import resolve
from servekit.version import __version__

HADOLINT = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
WHEEL = f"servekit-{__version__}-py3-none-any.whl"


@pytest.fixture
def folder(tmp_path) -> Path:
    model = tmp_path / "iris"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.joblib").write_bytes(b"placeholder")
    return model


def context_only(folder: Path, *args: str) -> int:
    """``servekit build --context-only``, with the startup probe's seconds given: these tests are about the
    build context, and timing the model's start (tests/scaffold/test_manifests.py's) takes as long as a start."""
    return cli(["build", str(folder), "--context-only", "--no-wheel", *args, "--startup-seconds", "60"])


def dockerfile(folder: Path) -> str:
    return (folder / "Dockerfile").read_text()


# -- the Dockerfile ------------------------------------------------------------------


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "cuda"])
def test_every_option_renders_a_hadolint_clean_dockerfile(tmp_path, gpu):
    options = scaffold.BuildOptions(
        model_name="iris", gpu=gpu, torch=True, base_image="registry.example.com/base:1", pip_cert=True
    )
    options.servekit_wheel = WHEEL
    text = scaffold.render_dockerfile(options)
    assert "ARG BASE_IMAGE=registry.example.com/base:1" in text.splitlines()
    path = tmp_path / "Dockerfile"
    path.write_text(text)
    lint = subprocess.run([HADOLINT, "--no-color", str(path)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_the_pip_certificate_is_a_build_secret_of_the_install_step_only():
    options = scaffold.BuildOptions(model_name="iris", pip_cert=True)
    text = scaffold.render_dockerfile(options)
    run = text.split("RUN --mount=type=secret,id=pip-cert", 1)[1].split("\n# ", 1)[0]
    assert "PIP_CERT=/run/secrets/pip-cert pip install" in run
    instructions = [line for line in text.splitlines() if "pip-cert" in line and not line.startswith("#")]
    assert len(instructions) == 2  # the mount and the variable of that one step; no COPY, no ENV
    assert "--mount" not in scaffold.render_dockerfile(scaffold.BuildOptions(model_name="iris"))  # classic builder


def test_the_model_folder_is_copied_without_the_wheel():
    options = scaffold.BuildOptions(model_name="iris")
    options.servekit_wheel = WHEEL
    lines = scaffold.render_dockerfile(options).splitlines()
    assert "RUN rm -rf /build/model/wheels" in lines
    assert "COPY --from=builder --chown=10001:10001 /build/model /app/model" in lines
    assert "COPY --chown=10001:10001 . /app/model" not in lines
    # the dependency layer comes before the model's files, so a new model version keeps it cached
    install = next(i for i, line in enumerate(lines) if "pip install" in line)
    assert install < lines.index("COPY . /build/model")


def test_the_stop_timeout_the_image_names_covers_its_drain():
    """``docker stop`` must wait longer than gunicorn's own deadline for the image's variables."""
    text = scaffold.render_dockerfile(scaffold.BuildOptions(model_name="iris"))
    seconds = int(re.search(r"--stop-timeout (\d+) ", text).group(1))
    graceful = ServekitApplication(resolve(environ={})).cfg.graceful_timeout
    assert seconds > graceful and f"docker stop --time {seconds}" in text
    assert text.splitlines()[-2] == "STOPSIGNAL SIGTERM"


def test_kubernetes_grace_period_covers_delay_and_drain():
    for delay, drain in [(10, 30), (0, 5), (25, 90.5)]:
        options = scaffold.BuildOptions(model_name="iris", shutdown_delay=delay, drain_seconds=drain)
        pod = next(yaml.safe_load_all(scaffold.render_manifests(options)["kubernetes.yaml"]))["spec"]["template"]
        assert pod["spec"]["terminationGracePeriodSeconds"] > math.ceil(delay + drain)


# -- the docker build command --------------------------------------------------------


def test_build_command_passes_build_args_secrets_and_docker_options(tmp_path):
    cert = tmp_path / "ca.pem"
    settings = scaffold_settings.BuildSettings(
        build_args={"HTTP_PROXY": "http://proxy:3128", "NO_PROXY": None},
        docker_args=["--network=host", "--platform=linux/amd64"],
        pip_index_url="https://user:s3cret@pypi.example.com/simple",
        pip_extra_index_urls=["https://a.example.com/simple", "https://b.example.com/simple"],
        pip_cert=cert,
    )
    command = scaffold.build_command(Path("/ctx"), "iris:1", settings)
    assert command == [
        "docker", "build", "--tag", "iris:1",
        "--build-arg", "PIP_INDEX_URL=https://user:s3cret@pypi.example.com/simple",
        "--build-arg", "PIP_EXTRA_INDEX_URL=https://a.example.com/simple https://b.example.com/simple",
        "--build-arg", "HTTP_PROXY=http://proxy:3128",
        "--build-arg", "NO_PROXY",
        "--secret", f"id=pip-cert,src={cert}",
        "--network=host", "--platform=linux/amd64",
        "/ctx",
    ]  # fmt: skip
    shown = " ".join(scaffold.build_command(Path("/ctx"), "iris:1", settings, shown=True))
    assert "s3cret" not in shown and "https://user:***@pypi.example.com/simple" in shown
    assert scaffold.needs_buildkit(command)
    assert not scaffold.needs_buildkit(scaffold.build_command(Path("/ctx"), "iris:1"))


def test_the_command_line_takes_docker_options_as_they_are_written(folder, capsys):
    # `--docker-arg --network=host`: the value starts with '-', which argparse alone would refuse
    assert (
        context_only(folder, "--docker-arg", "--network=host", "--docker-arg=--pull=false", "--build-arg", "A=1") == 0
    )
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.endswith(f"docker build --tag iris:latest --build-arg A=1 --network=host --pull=false {folder}")


def test_build_arg_needs_a_name(folder, capsys):
    assert context_only(folder, "--build-arg", "=1") == 2
    assert capsys.readouterr().err == "servekit build: --build-arg expects KEY=VALUE, found '=1'\n"


def test_pip_cert_must_exist_and_stay_out_of_the_context(folder, tmp_path, capsys):
    assert context_only(folder, "--pip-cert", str(tmp_path / "missing.pem")) == 2
    assert "--pip-cert: no such file" in capsys.readouterr().err
    inside = folder / "ca.pem"
    inside.write_text("x")
    assert context_only(folder, "--pip-cert", str(inside)) == 2
    assert "is inside the build context, so the image would copy it" in capsys.readouterr().err
    outside = tmp_path / "ca.pem"
    outside.write_text("x")
    assert context_only(folder, "--pip-cert", str(outside)) == 0
    assert f"--secret id=pip-cert,src={outside}" in capsys.readouterr().out
    assert "RUN --mount=type=secret,id=pip-cert" in dockerfile(folder)


# -- the project's own choices -------------------------------------------------------


@pytest.mark.slow  # seconds of its own: out of the quick lane
def test_an_earlier_build_s_gpu_and_python_choices_hold(folder):
    assert context_only(folder, "--gpu", "--cuda-version", "12.4.1") == 0
    assert context_only(folder) == 0  # no --gpu: still the CUDA image
    assert "ARG BASE_IMAGE=nvidia/cuda:12.4.1-runtime-ubuntu24.04" in dockerfile(folder)
    assert context_only(folder, "--cpu", "--python-version", "3.11") == 0
    assert "ARG BASE_IMAGE=python:3.11-slim" in dockerfile(folder)
    assert context_only(folder) == 0
    assert "ARG BASE_IMAGE=python:3.11-slim" in dockerfile(folder)
    assert context_only(folder, "--base-image", "mirror.example.com/python:3.11") == 0
    assert context_only(folder) == 0
    assert "ARG BASE_IMAGE=mirror.example.com/python:3.11" in dockerfile(folder)
    assert context_only(folder, "--gpu") == 0  # a CPU base is no base for the CUDA image
    assert "ARG BASE_IMAGE=nvidia/cuda:12.6.3-runtime-ubuntu24.04" in dockerfile(folder)


def test_device_cuda_makes_a_gpu_image(folder):
    (folder / "servekit.yaml").write_text("device: cuda\n")
    assert context_only(folder) == 0
    assert "nvidia/cuda" in dockerfile(folder)
    assert "nvidia.com/gpu: 1" in (folder / "deploy" / "kubernetes.yaml").read_text()


@pytest.mark.slow  # seconds of its own: out of the quick lane
def test_servekit_yaml_build_settings_and_the_command_line_over_them(folder, tmp_path, capsys):
    cert = tmp_path / "company-ca.pem"
    cert.write_text("x")
    (folder / "servekit.yaml").write_text(
        yaml.safe_dump(
            {
                "device": "cuda",
                "build": {
                    "gpu": False,
                    "python_version": "3.11",
                    "base_image": "mirror.example.com/python:3.11-slim",
                    "build_args": {"HTTP_PROXY": "http://proxy:3128"},
                    "docker_args": ["--network=host"],
                    "pip_index_url": "https://pypi.example.com/simple",
                    "pip_extra_index_urls": ["https://more.example.com/simple"],
                    "pip_cert": "../company-ca.pem",
                    "tag": "registry.example.com/iris:7",
                },
            }
        )
    )
    parse_model_config(yaml.safe_load((folder / "servekit.yaml").read_text()))  # the server accepts the file
    assert context_only(folder) == 0
    out = capsys.readouterr().out.splitlines()[-1]
    assert "ARG BASE_IMAGE=mirror.example.com/python:3.11-slim" in dockerfile(folder)  # build.gpu over device
    assert out.endswith(
        "docker build --tag registry.example.com/iris:7 --build-arg PIP_INDEX_URL=https://pypi.example.com/simple "
        "--build-arg PIP_EXTRA_INDEX_URL=https://more.example.com/simple --build-arg HTTP_PROXY=http://proxy:3128 "
        f"--secret id=pip-cert,src={cert} --network=host {folder}"
    )
    assert "image: registry.example.com/iris:7" in (folder / "deploy" / "kubernetes.yaml").read_text()
    assert context_only(folder, "--gpu", "--tag", "iris:8", "--build-arg", "HTTP_PROXY=http://other:3128") == 0
    out = capsys.readouterr().out.splitlines()[-1]
    assert "--tag iris:8" in out and "HTTP_PROXY=http://other:3128" in out and "proxy:3128" not in out


@pytest.mark.parametrize(
    "build, message",
    [
        ("[gpu]", "build: expected a mapping of build settings"),
        ("{gpus: true}", "build: unknown setting(s) gpus; expected gpu, python_version"),
        ("{gpu: maybe}", "build.gpu: expected true or false, found 'maybe'"),
        ("{docker_args: --network=host}", "build.docker_args: expected a list of strings"),
        ("{python_version: '3'}", "python version '3' is not valid"),
    ],
)
def test_wrong_build_settings_are_one_line(folder, capsys, build, message):
    (folder / "servekit.yaml").write_text(f"build: {build}\n")
    assert context_only(folder) == 2
    err = capsys.readouterr().err
    assert err.startswith("servekit build: ") and message in err and err.count("\n") == 1, err


def test_the_server_refuses_a_build_section_that_is_no_mapping():
    with pytest.raises(ConfigError, match="'build' must be a mapping"):
        parse_model_config({"build": ["gpu"]})


def test_an_untrained_project_is_refused_before_docker_and_warned_about_without(tmp_path, capsys):
    project = tmp_path / "fresh"
    project.mkdir()
    (project / "train.py").write_text("")
    (project / "model.py").write_text("")
    (project / "requirements.txt").write_text(f"servekit[sklearn,grpc]=={__version__}\n")
    assert cli(["build", str(project), "--no-wheel"]) == 1
    err = capsys.readouterr().err
    assert err == (
        f"servekit build: {project} holds no trained version (no 1/, 2/... folder): the image would never "
        "become ready; run `python train.py` first\n"
    )
    assert not (project / "Dockerfile").exists()  # refused before anything was written
    assert context_only(project) == 0
    assert capsys.readouterr().out.startswith("warning: ")
    (project / "1").mkdir()
    assert not scaffold.untrained(project)


def test_a_repository_of_trained_models_is_trained(tmp_path):
    (tmp_path / "iris" / "1").mkdir(parents=True)
    (tmp_path / "iris" / "1" / "model.joblib").write_bytes(b"")
    (tmp_path / "deploy").mkdir()
    (tmp_path / "deploy" / "kubernetes.yaml").write_text("")
    assert not scaffold.untrained(tmp_path)
    (tmp_path / "iris" / "1" / "model.joblib").unlink()
    (tmp_path / "iris" / "1").rmdir()
    assert scaffold.untrained(tmp_path)  # deploy/ is no model


def test_a_bare_folder_of_hooks_alone_is_a_model(tmp_path):
    (tmp_path / "model.py").write_text("")
    assert not scaffold.untrained(tmp_path)  # its hooks may make the model themselves
    (tmp_path / "model.py").unlink()
    (tmp_path / "helper.py").write_text("")
    assert scaffold.untrained(tmp_path)


def test_requirements_without_the_grpc_extra_are_warned_about(folder, capsys):
    assert context_only(folder) == 0
    assert "grpc" in (folder / "requirements.txt").read_text()  # written with the extra
    assert "without the grpc extra" not in capsys.readouterr().out
    (folder / "requirements.txt").write_text(f"servekit[sklearn]=={__version__}\n")
    assert context_only(folder) == 0
    assert "warning: requirements.txt installs servekit without the grpc extra" in capsys.readouterr().out
    assert not scaffold.lacks_grpc(f"servekit[all]=={__version__}\n") and not scaffold.lacks_grpc("servekit[ grpc ]\n")


# -- serving a project folder -------------------------------------------------------------


def test_serving_dot_names_the_model_after_the_folder(folder, monkeypatch):
    monkeypatch.chdir(folder)
    assert discover([Path(".")]) == {"iris": Path(".")}


def test_a_helper_script_beside_model_folders_keeps_a_repository(tmp_path):
    for name in ("iris", "wine"):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "1" / "model.joblib").write_bytes(b"")
    (tmp_path / "train_all.py").write_text("")
    assert sorted(discover([tmp_path])) == ["iris", "wine"]
    (tmp_path / "model.py").write_text("")  # the hooks of a model: the folder is one model again
    assert list(discover([tmp_path])) == [tmp_path.name]


@pytest.mark.slow
def test_the_servekit_wheel_is_the_same_bytes_each_build(tmp_path, monkeypatch):
    """Fixed timestamps: an unchanged servekit gives an identical wheel, so docker keeps its layer."""
    import hashlib

    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    origin, source = scaffold.installed_from()
    assert origin == "source" and source is not None
    digests = []
    for attempt in ("a", "b"):
        into = tmp_path / attempt
        into.mkdir()
        monkeypatch.setenv("SERVEKIT_CACHE_DIR", str(tmp_path / f"cache-{attempt}"))  # each one really built
        wheel = scaffold.build_wheel(source, into)
        digests.append(hashlib.sha256(wheel.read_bytes()).hexdigest())
        if attempt == "a":
            import time

            time.sleep(2.1)  # a zip file's timestamps have a resolution of 2 s
    assert digests[0] == digests[1]

    # the cache then answers for the same files: a second `servekit new` copies, builds nothing
    (kept,) = (tmp_path / "cache-b" / "wheels").glob("*/servekit-*.whl")
    kept.write_bytes(b"the kept wheel")
    into = tmp_path / "c"
    into.mkdir()
    assert scaffold.build_wheel(source, into).read_bytes() == b"the kept wheel"
