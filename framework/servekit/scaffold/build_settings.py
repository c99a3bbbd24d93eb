"""How ``servekit build`` builds one project, the same way each time.

Every build option has a twin in the project's ``servekit.yaml``, under
``build:`` (the server ignores that section)::

    build:
      gpu: true                      # the CUDA image (--gpu / --cpu)
      python_version: "3.11"         # python:3.11-slim (--python-version)
      cuda_version: 12.6.3           # --cuda-version
      base_image: registry.example.com/python:3.11-slim   # --base-image
      build_args: {HTTP_PROXY: http://proxy:3128}          # --build-arg KEY=VALUE
      docker_args: [--network=host]                        # --docker-arg
      pip_index_url: https://pypi.example.com/simple       # --pip-index-url
      pip_extra_index_urls: [https://more.example.com/simple]   # --pip-extra-index-url
      pip_cert: ../company-ca.pem    # --pip-cert, relative to the project
      tag: registry.example.com/iris:1                     # --tag
      model_name: iris               # --model-name

The command line wins over ``servekit.yaml``; what neither says comes from the
Dockerfile an earlier ``servekit build`` (or ``servekit new``) rendered, so a
GPU project stays a GPU project and a Python 3.11 one stays on 3.11, and then
from ``device: cuda`` in ``servekit.yaml``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import yaml

from servekit.scaffold.render import DEFAULT_CUDA, DEFAULT_PYTHON, MARKER

CONFIG_FILE = "servekit.yaml"
_STRINGS = ("python_version", "cuda_version", "base_image", "pip_index_url", "pip_cert", "tag", "model_name")
BUILD_KEYS = ("gpu", *_STRINGS, "build_args", "docker_args", "pip_extra_index_urls")
_PYTHON = re.compile(r"^3\.\d{1,2}$")
_BUILD_ARG = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class BuildSettingsError(ValueError):
    """A ``build:`` setting or build option that cannot work; the message is one line."""


@dataclass
class BuildSettings:
    """The resolved choices of one build."""

    gpu: bool = False
    python_version: str = DEFAULT_PYTHON
    cuda_version: str = DEFAULT_CUDA
    base_image: str = ""
    #: ``None``: docker passes the variable of that name from its environment (``--build-arg KEY``).
    build_args: dict[str, str | None] = field(default_factory=dict)
    docker_args: list[str] = field(default_factory=list)
    pip_index_url: str = ""
    pip_extra_index_urls: list[str] = field(default_factory=list)
    #: A CA bundle pip trusts inside the build, handed over as a build secret.
    pip_cert: Path | None = None
    tag: str | None = None
    model_name: str | None = None


def read_project_settings(folder: Path) -> dict[str, Any]:
    """The ``build:`` section of ``folder/servekit.yaml``, checked (``{}`` without one)."""
    path = folder / CONFIG_FILE
    if not path.is_file():
        return {}
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (yaml.YAMLError, OSError) as exc:
        raise BuildSettingsError(f"{CONFIG_FILE}: cannot read it: {' '.join(str(exc).split())}") from None
    build = raw.get("build") if isinstance(raw, dict) else None
    if build is None:
        return {}
    return check_project_settings(build)


def check_project_settings(build: Any) -> dict[str, Any]:
    """``build:`` as a dict of known keys with values of the right type; else :class:`BuildSettingsError`."""
    where = f"{CONFIG_FILE}: build"
    if not isinstance(build, dict):
        raise BuildSettingsError(f"{where}: expected a mapping of build settings")
    unknown = sorted(set(build) - set(BUILD_KEYS))
    if unknown:
        raise BuildSettingsError(f"{where}: unknown setting(s) {', '.join(unknown)}; expected {', '.join(BUILD_KEYS)}")
    checked: dict[str, Any] = {}
    for key, value in build.items():
        if value is None:
            continue
        if key == "gpu":
            if not isinstance(value, bool):
                raise BuildSettingsError(f"{where}.gpu: expected true or false, found {value!r}")
        elif key in _STRINGS:
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise BuildSettingsError(f"{where}.{key}: expected a string, found {value!r}")
            value = str(value)
        elif key == "build_args":
            if not isinstance(value, dict):
                raise BuildSettingsError(f"{where}.build_args: expected a mapping of names to values")
            value = {str(k): None if v is None else str(v) for k, v in value.items()}
        elif not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise BuildSettingsError(f"{where}.{key}: expected a list of strings")
        checked[key] = value
    return checked


def previous_choices(folder: Path) -> dict[str, Any]:
    """GPU or CPU, the Python and CUDA versions and the base image of a Dockerfile servekit rendered."""
    dockerfile = folder / "Dockerfile"
    if not dockerfile.is_file():
        return {}
    text = dockerfile.read_text(errors="replace")
    if MARKER not in text[:400]:
        return {}  # the user's own: servekit neither rewrites nor reads it
    header = text[:600]
    found: dict[str, Any] = {"gpu": "(GPU)" in header}
    base = re.search(r"^ARG BASE_IMAGE=(\S+)", text, re.MULTILINE)
    python = re.search(r"^ARG PYTHON_VERSION=(\S+)", text, re.MULTILINE)  # Dockerfiles before --base-image
    cuda = re.search(r"^ARG CUDA_BASE=nvidia/cuda:([^-\s]+)-", text, re.MULTILINE)
    if base:
        image = base.group(1)
        default_cpu = re.fullmatch(r"python:(3\.\d+)-slim", image)
        default_gpu = re.fullmatch(r"nvidia/cuda:([^-]+)-runtime-ubuntu24\.04", image)
        if default_cpu and not found["gpu"]:
            found["python_version"] = default_cpu.group(1)
        elif default_gpu and found["gpu"]:
            found["cuda_version"] = default_gpu.group(1)
        else:
            found["base_image"] = image
    if python:
        found["python_version"] = python.group(1)
    if cuda:
        found["cuda_version"] = cuda.group(1)
    return found


def _wants_cuda(folder: Path) -> bool:
    try:
        raw = yaml.safe_load((folder / CONFIG_FILE).read_text()) or {}
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(raw, dict) and str(raw.get("device", "")).startswith("cuda")


def resolve(folder: Path, given: dict[str, Any]) -> BuildSettings:
    """The settings of one build of ``folder``: ``given`` (the command line, ``None`` = not given)
    over ``servekit.yaml``'s ``build:``, over the previous Dockerfile's choices, over ``device:``."""
    project = read_project_settings(folder)
    previous = previous_choices(folder)
    chosen: dict[str, Any] = {"gpu": _wants_cuda(folder)}
    for layer in (previous, project):
        chosen.update({k: v for k, v in layer.items() if k not in ("build_args", "docker_args")})
    for key in BUILD_KEYS:
        if key in ("build_args", "docker_args", "pip_extra_index_urls"):
            continue
        if given.get(key) is not None:
            chosen[key] = given[key]
    only_previous = "base_image" in previous and "base_image" not in project and given.get("base_image") is None
    if only_previous and previous.get("gpu") != bool(chosen.get("gpu")):
        del chosen["base_image"]  # the last build's base was for the other kind of image
    settings = BuildSettings(
        gpu=bool(chosen.get("gpu")),
        python_version=str(chosen.get("python_version") or DEFAULT_PYTHON),
        cuda_version=str(chosen.get("cuda_version") or DEFAULT_CUDA),
        base_image=str(chosen.get("base_image") or ""),
        build_args={**project.get("build_args", {}), **parse_build_args(given.get("build_args") or [])},
        docker_args=[*project.get("docker_args", []), *(given.get("docker_args") or [])],
        pip_index_url=str(chosen.get("pip_index_url") or ""),
        pip_extra_index_urls=list(given.get("pip_extra_index_urls") or project.get("pip_extra_index_urls") or []),
        tag=chosen.get("tag"),
        model_name=chosen.get("model_name"),
    )
    if not _PYTHON.match(settings.python_version):
        raise BuildSettingsError(f"python version {settings.python_version!r} is not valid: expected e.g. 3.12")
    cert = given.get("pip_cert") or project.get("pip_cert")
    if cert:
        # the command line's path is the shell's; servekit.yaml's is the project's
        base = Path.cwd() if given.get("pip_cert") else folder
        settings.pip_cert = _checked_cert(folder, (base / Path(cert).expanduser()).resolve())
    return settings


def parse_build_args(items: list[str]) -> dict[str, str | None]:
    """``KEY=VALUE`` items of ``--build-arg`` (a bare ``KEY`` passes the variable of that name, as docker does)."""
    parsed: dict[str, str | None] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not _BUILD_ARG.match(key):
            raise BuildSettingsError(f"--build-arg expects KEY=VALUE, found {item!r}")
        parsed[key] = value if sep else None
    return parsed


def _checked_cert(folder: Path, cert: Path) -> Path:
    if not cert.is_file():
        raise BuildSettingsError(f"--pip-cert: no such file: {cert}")
    if cert.is_relative_to(folder.resolve()):
        raise BuildSettingsError(
            f"--pip-cert: {cert} is inside the build context, so the image would copy it; keep it outside {folder}"
        )
    return cert


def masked(url: str) -> str:
    """``url`` with its password replaced by ``***``, for printing a command line."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
