"""A CPU install carries no CUDA: what the extras and a CPU image's requirements name, and what is installed.

On Linux, PyPI's ``xgboost`` wheel is the CUDA build (it requires ``nvidia-nccl-cu12``, some
470 MB) and ``tensorflow`` pulls CUDA through ``tensorflow[and-cuda]``; their CPU twins are
``xgboost-cpu`` and ``tensorflow-cpu``.  (torch is the one library whose CPU build comes from
its own index, which the CPU images add: ``render.TORCH_INDEX``.)
"""

from __future__ import annotations

import importlib.metadata
import re

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from repo_paths import REPO
from servekit.scaffold import project as scaffold

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

FRAMEWORKS = ["sklearn", "torch", "tensorflow", "huggingface", "xgboost", "lightgbm", "onnx", "custom"]
#: A distribution that brings CUDA on Linux, and the CPU build to name instead.
CUDA_BUILDS = {"xgboost": "xgboost-cpu", "tensorflow": "tensorflow-cpu", "tensorflow-gpu": "tensorflow-cpu"}
LINUX = {**default_environment(), "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"}
EXTRAS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def expand(requirements: list[str], environment: dict[str, str]) -> list[Requirement]:
    """The requirements a list names on that platform, servekit's own extras expanded."""
    found: list[Requirement] = []
    for text in requirements:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue
        if canonicalize_name(requirement.name) == "servekit":
            for extra in sorted(requirement.extras):
                found += expand(EXTRAS[extra], environment)
        else:
            found.append(requirement)
    return found


def cuda(requirements: list[Requirement]) -> list[str]:
    return [
        str(r)
        for r in requirements
        if canonicalize_name(r.name) in CUDA_BUILDS or r.name.startswith("nvidia-") or "and-cuda" in r.extras
    ]


@pytest.mark.parametrize("extra", ["xgboost", "all", "test"])
def test_the_extras_name_cpu_builds_on_linux(extra):
    assert not cuda(expand(EXTRAS[extra], LINUX)), "name the CPU build: " + str(CUDA_BUILDS)
    names = {canonicalize_name(r.name) for r in expand(EXTRAS[extra], LINUX)}
    assert "xgboost-cpu" in names


def test_macos_keeps_xgboost_which_has_no_cuda_there():
    macos = {**LINUX, "sys_platform": "darwin", "platform_system": "Darwin", "platform_machine": "arm64"}
    assert {canonicalize_name(r.name) for r in expand(EXTRAS["xgboost"], macos)} == {"xgboost"}


def requirement_lines(text: str) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("-")]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_cpu_image_installs_no_cuda(tmp_path, framework):
    project = scaffold.new_project(tmp_path, no_input=True, extra_context={"framework": framework}, wheel=None)
    requirements = requirement_lines((project / "requirements.txt").read_text())
    assert not cuda(expand(requirements, LINUX)), requirements


def test_a_gpu_xgboost_image_gets_the_cuda_build(tmp_path):
    project = scaffold.new_project(
        tmp_path, no_input=True, extra_context={"framework": "xgboost", "gpu": "yes"}, wheel=None
    )
    names = [Requirement(r).name for r in requirement_lines((project / "requirements.txt").read_text())]
    assert "xgboost" in names


def test_a_bare_xgboost_folder_gets_the_cpu_build(tmp_path):
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.json").write_text("{}")
    requirements = requirement_lines(scaffold.default_requirements(tmp_path))
    assert re.match(r"servekit\[xgboost,grpc\]==", requirements[0])
    assert not cuda(expand(requirements, LINUX))


def installed_closure(requirements: list[Requirement]) -> set[str]:
    """The installed distributions these requirements pull, transitively."""
    seen: set[str] = set()
    todo = [(r, "") for r in requirements]
    while todo:
        requirement, extra = todo.pop()
        name = canonicalize_name(requirement.name)
        if requirement.marker is not None and not requirement.marker.evaluate(
            {**default_environment(), "extra": extra}
        ):
            continue
        try:
            distribution = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # an optional dependency this environment left out
        key = f"{name}[{','.join(sorted(requirement.extras))}]"
        if key in seen:
            continue
        seen.add(key)
        for text in distribution.requires or []:
            for wanted in requirement.extras or {""}:
                todo.append((Requirement(text), wanted))
    return {key.split("[")[0] for key in seen}


def test_this_environment_s_servekit_all_holds_no_nvidia_library():
    everything = installed_closure(expand(EXTRAS["all"], default_environment()))
    assert "xgboost-cpu" in everything and "scikit-learn" in everything
    assert not sorted(n for n in everything if n.startswith("nvidia-") or n in CUDA_BUILDS)


def test_this_virtualenv_holds_no_nvidia_library():
    names = {canonicalize_name(d.metadata["Name"] or "") for d in importlib.metadata.distributions()}
    assert not sorted(n for n in names if n.startswith("nvidia-")), "reinstall xgboost as xgboost-cpu"
    assert "xgboost" not in names, "reinstall xgboost as xgboost-cpu: pip uninstall xgboost; pip install xgboost-cpu"
