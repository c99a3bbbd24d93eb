"""``servekit build`` names the option that fixes a first image build's known failures.

Docker's and pip's own failure texts (``tests/data/build_failures/``, recorded from the
real programs) go through the code that relays a build's output; the real-image test
(``test_docker_image.py``) fails builds for real on its own daemon.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from repo_paths import REPO
from servekit.scaffold import build_failures
from servekit.scaffold import project as scaffold

RECORDED = REPO / "tests" / "data" / "build_failures"
#: What a build without a registry prints (BuildKit, then the classic builder): written after Docker's
#: messages (the real-image test's daemon has no registry to fail against).
NO_REGISTRY_BUILDKIT = (
    "#3 [internal] load metadata for docker.io/library/python:3.12-slim\n"
    '#3 ERROR: failed to do request: Head "https://registry-1.docker.io/v2/library/python/manifests/3.12-slim": '
    "dial tcp: lookup registry-1.docker.io on 127.0.0.53:53: server misbehaving\n"
    "ERROR: failed to solve: python:3.12-slim: failed to resolve source metadata for "
    'docker.io/library/python:3.12-slim: failed to do request: Head "https://registry-1.docker.io/v2/library/'
    'python/manifests/3.12-slim": dial tcp: lookup registry-1.docker.io on 127.0.0.53:53: server misbehaving\n'
)
NO_REGISTRY_CLASSIC = (
    "Step 1/24 : ARG BASE_IMAGE=python:3.12-slim\n"
    "Step 2/24 : FROM ${BASE_IMAGE} AS builder\n"
    'Get "https://registry-1.docker.io/v2/": dial tcp: lookup registry-1.docker.io: Temporary failure in name '
    "resolution\n"
)


def relayed(text: str, attempt: build_failures.Attempt, capsys) -> tuple[int, list[str], list[str]]:
    """``text`` through :func:`run_docker_build`, from a command that prints it and fails as docker does."""
    command = ["bash", "-c", 'printf "%s" "$FAILURE"; exit 1']
    status = scaffold.run_docker_build(command, {**os.environ, "FAILURE": text}, attempt, echo=print)
    out, err = capsys.readouterr()
    return status, out.splitlines(), err.splitlines()


@pytest.mark.parametrize(
    ("recording", "attempt", "option"),
    [
        ("pip-no-network.txt", build_failures.Attempt(), "--docker-arg --network=host"),
        ("pip-no-network.txt", build_failures.Attempt(host_network=True), "--pip-index-url URL"),
        ("pip-untrusted-certificate.txt", build_failures.Attempt(), "--pip-cert CA.pem"),
        ("dockerd-without-bridge.txt", build_failures.Attempt(), "--docker-arg --network=host"),
        ("docker-28-without-buildx.txt", build_failures.Attempt(pip_cert=True, buildkit_secret=True), "docker-buildx"),
    ],
)
def test_a_known_failure_ends_with_the_option_that_fixes_it(recording, attempt, option, capsys):
    text = (RECORDED / recording).read_text()
    status, out, err = relayed(text, attempt, capsys)
    assert status == 1
    assert out == text.splitlines()  # Docker's output is relayed as it came
    assert len(err) == 1 and err[0].startswith("servekit build: ") and option in err[0], err


@pytest.mark.parametrize("text", [NO_REGISTRY_BUILDKIT, NO_REGISTRY_CLASSIC], ids=["buildkit", "classic"])
def test_no_registry_names_a_local_base_image(text, capsys):
    _, _, err = relayed(text, build_failures.Attempt(), capsys)
    assert len(err) == 1 and "--base-image IMAGE" in err[0], err


def test_a_certificate_still_refused_with_pip_cert_says_what_the_bundle_lacks(capsys):
    text = (RECORDED / "pip-untrusted-certificate.txt").read_text()
    _, _, err = relayed(text, build_failures.Attempt(pip_cert=True), capsys)
    assert len(err) == 1 and "must hold the CA" in err[0], err


def test_an_unknown_failure_adds_nothing(capsys):
    status, out, err = relayed(
        "Step 9/24 : RUN pip install -r requirements.txt\nKilled\n", build_failures.Attempt(), capsys
    )
    assert status == 1 and out[-1] == "Killed" and err == []


def test_a_build_that_succeeds_adds_nothing(capsys):
    status = scaffold.run_docker_build(["bash", "-c", "echo done"], dict(os.environ), build_failures.Attempt())
    out, err = capsys.readouterr()
    assert status == 0 and out == "done\n" and err == ""


#: This machine's clients, as in the issue: Docker 28 without buildx first in PATH, Debian's 20.10 after it.
NEWER, DEBIAN = Path("/usr/local/bin/docker"), Path("/usr/bin/docker")


@pytest.mark.skipif(
    not (NEWER.is_file() and DEBIAN.is_file()),
    reason="needs Docker's client in /usr/local/bin and Debian's in /usr/bin",
)
def test_a_secret_build_takes_the_client_that_runs_buildkit(monkeypatch, tmp_path):
    if scaffold.drives_buildkit(str(NEWER)):
        pytest.skip(f"{NEWER} has the buildx plugin here")
    monkeypatch.setenv("PATH", f"{NEWER.parent}{os.pathsep}{DEBIAN.parent}")
    assert scaffold.docker_clients()[:2] == [str(NEWER), str(DEBIAN)]
    assert scaffold.docker_client(buildkit=True) == str(DEBIAN)  # Debian's 20.10 has BuildKit built in
    assert scaffold.docker_client(buildkit=False) == str(NEWER)  # the first on PATH otherwise
    # and what the first one says when asked for BuildKit is what the recording holds
    asked = [str(NEWER), "build", "--secret", "id=x,src=/dev/null", str(tmp_path)]
    said = subprocess.run(asked, env={**os.environ, "DOCKER_BUILDKIT": "1"}, capture_output=True, text=True)
    assert build_failures.BUILDX_MISSING in said.stdout + said.stderr
