"""A generated sklearn project's CPU image, built for real with Docker and run.

The session runs its own ``dockerd`` (``tests/support/docker_support.py``: ``--bridge=none
--iptables=false``, its own data root) and a Debian base image made from
Debian's packages; nothing is pulled from a registry.  The build goes through
``servekit build --base-image ... --pip-cert ... --docker-arg --network=host``
(pip reaches its index through the host's network and trusts the CA bundle
given as a build secret); containers run with ``--network host`` on free
loopback ports and are reached on 127.0.0.1 only.  Skips with the reason when
no daemon can start here (not root, Docker not installed).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import docker_support
import numpy as np
import pytest
import requests
from servekit.scaffold import project as scaffold
from servekit.server import slow_clients
from servekit.testing import free_port

pytestmark = pytest.mark.slow

MODEL = "boxed-iris"
TAG = "servekit-test/boxed-iris:1"
#: The drain inside the image (SERVEKIT_DRAIN_SECONDS) is 30 s; docker stop must allow more.
STOP_TIME = "40"


@pytest.fixture(scope="module")
def daemon() -> Iterator[docker_support.Daemon]:
    try:
        with docker_support.docker_daemon() as running:
            yield running
    except docker_support.Unavailable as exc:
        pytest.skip(f"no Docker daemon: {exc}")


@pytest.fixture(scope="module")
def base(daemon) -> str:
    try:
        return docker_support.base_image(daemon)
    except docker_support.Unavailable as exc:
        pytest.skip(f"no Debian base image: {exc}")


@pytest.fixture(scope="module")
def pip_cert(tmp_path_factory) -> tuple[Path, str]:
    """The CA bundle pip trusts on this machine (an intercepting proxy's CA included), plus a marker
    line that must never show up in the image."""
    bundle = Path(os.environ.get("PIP_CERT") or ssl.get_default_verify_paths().cafile or "")
    if not bundle.is_file():
        bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    marker = f"servekit-test-secret-{uuid.uuid4().hex}"
    cert = tmp_path_factory.mktemp("cert") / "ca-bundle.pem"
    cert.write_text(bundle.read_text() + f"\n# {marker}\n")  # text outside PEM blocks is ignored
    return cert, marker


def servekit(*args: str, env: dict[str, str], cwd: Path | None = None, timeout: float = 900):
    return subprocess.run(
        [sys.executable, "-m", "servekit", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def project(tmp_path_factory, daemon) -> Path:
    out = tmp_path_factory.mktemp("project")
    made = servekit("new", "--no-input", "--output-dir", str(out), "--set", "project_name=Boxed Iris",
                    "--set", "framework=sklearn", env=daemon.env)  # fmt: skip
    assert made.returncode == 0, made.stderr
    folder = out / MODEL
    trained = subprocess.run([sys.executable, "train.py"], cwd=folder, capture_output=True, text=True, timeout=300)
    assert trained.returncode == 0, trained.stderr
    # the image unpickles what this scikit-learn wrote: the same versions (Debian's Python is 3.11 too)
    with (folder / "requirements.txt").open("a") as requirements:
        requirements.write(f"scikit-learn=={version('scikit-learn')}\nnumpy=={np.__version__}\n")
    return folder


def build(project: Path, daemon, base: str, cert: Path):
    started = time.monotonic()
    result = servekit(
        "build", str(project), "--tag", TAG, "--base-image", base, "--pip-cert", str(cert),
        "--docker-arg", "--network=host", env=daemon.env,
    )  # fmt: skip
    return result, time.monotonic() - started


@pytest.fixture(scope="module")
def image(project, daemon, base, pip_cert) -> dict:
    result, seconds = build(project, daemon, base, pip_cert[0])
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    print(f"\ncold image build: {seconds:.1f} s")
    return {"output": output, "seconds": seconds}


def step_cached(output: str, needle: str) -> bool:
    """Whether the build step whose instruction holds ``needle`` came from the cache (BuildKit or classic)."""
    for match in re.finditer(r"^(#\d+) \[[^\]]*\] (.*)$", output, re.MULTILINE):
        if needle in match.group(2):
            return re.search(rf"^{match.group(1)} CACHED$", output, re.MULTILINE) is not None
    classic = re.search(rf"^Step \d+/\d+ : .*{re.escape(needle)}.*\n ---> Using cache$", output, re.MULTILINE)
    return classic is not None


def test_rebuild_reuses_the_dependency_layer(image, project, daemon, base, pip_cert):
    assert "DOCKER_BUILDKIT=1 docker build" in image["output"]  # the pip secret needs BuildKit
    assert not step_cached(image["output"], "pip install")  # a fresh daemon: the first build installs
    result, seconds = build(project, daemon, base, pip_cert[0])
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert step_cached(output, "pip install"), output[-4000:]  # the servekit wheel is byte for byte the same
    print(f"\nwarm rebuild: {seconds:.1f} s (cold {image['seconds']:.1f} s)")


def test_the_pip_certificate_is_in_no_layer(image, daemon, pip_cert):
    _, marker = pip_cert
    needle, seen, size = marker.encode(), b"", 0
    with subprocess.Popen([daemon.client, "save", TAG], env=daemon.env, stdout=subprocess.PIPE) as saving:
        assert saving.stdout is not None
        while chunk := saving.stdout.read(1 << 20):
            size += len(chunk)
            seen = seen[-len(needle) :] + chunk  # a marker split across two reads is found too
            assert needle not in seen
    assert saving.returncode == 0 and size > 10_000_000  # every layer of the image went through
    history = daemon.docker("history", "--no-trunc", TAG).stdout
    assert marker not in history and "pip-cert" not in history  # the builder stage is not in the image


class Container:
    def __init__(self, daemon, *run_args: str):
        self.daemon = daemon
        self.http, self.grpc = free_port(), free_port()
        self.name = f"servekit-test-{uuid.uuid4().hex[:10]}"
        daemon.docker(
            "run", "--detach", "--name", self.name, "--network", "host",
            "-e", "SERVEKIT_HOST=127.0.0.1", "-e", f"SERVEKIT_HTTP_PORT={self.http}",
            "-e", f"SERVEKIT_GRPC_PORT={self.grpc}", *run_args, TAG,
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{self.http}"

    def logs(self) -> str:
        result = self.daemon.docker("logs", self.name, check=False)
        return result.stdout + result.stderr

    def state(self) -> dict:
        return json.loads(self.daemon.docker("inspect", "--format", "{{json .State}}", self.name).stdout)

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.state()["Running"]:
                raise AssertionError(f"the container exited:\n{self.logs()[-4000:]}")
            try:
                if requests.get(self.url + "/v2/health/ready", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass  # not listening yet, or busy loading
            time.sleep(0.3)
        raise AssertionError(f"not ready in {timeout} s:\n{self.logs()[-4000:]}")

    def remove(self) -> None:
        self.daemon.docker("rm", "--force", self.name, check=False)


@pytest.fixture
def container(image, daemon) -> Iterator[Container]:
    running = Container(daemon, "--read-only", "--tmpfs", "/tmp", "--stop-timeout", STOP_TIME)
    try:
        running.wait_ready()
        yield running
    finally:
        running.remove()


def test_the_image_serves_v1_v2_grpc_and_metrics(container, project):
    import tritonclient.grpc as grpcclient

    v1 = json.loads((project / "requests" / "v1-predict.json").read_text())
    answer = requests.post(f"{container.url}/v1/models/{MODEL}:predict", json=v1, timeout=30)
    assert answer.status_code == 200, answer.text
    assert [p["label"] for p in answer.json()["predictions"]] == ["setosa", "virginica"]

    v2 = json.loads((project / "requests" / "v2-infer.json").read_text())
    answer = requests.post(f"{container.url}/v2/models/{MODEL}/infer", json=v2, timeout=30)
    assert answer.status_code == 200, answer.text
    assert {o["name"] for o in answer.json()["outputs"]} == {"label", "probabilities"}

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{container.grpc}")
    # each worker serves gRPC and is ready on its own: the connection may reach one still starting
    deadline = time.monotonic() + 60
    while not client.is_server_ready():
        assert time.monotonic() < deadline, f"gRPC never ready:\n{container.logs()[-4000:]}"
        time.sleep(0.3)
    tensor = grpcclient.InferInput("input", [2, 4], "FP64")
    tensor.set_data_from_numpy(np.array(v2["inputs"][0]["data"], dtype=np.float64).reshape(2, 4))
    result = client.infer(MODEL, [tensor])
    assert result.as_numpy("label").tolist() == [b"setosa", b"virginica"]
    client.close()

    # an HTTP request is counted as its answer closes, a moment after the client has it
    counted = re.compile(rf'^servekit_requests_total\{{[^}}]*model="{MODEL}"[^}}]*\}} [1-9]', re.MULTILINE)
    deadline = time.monotonic() + 15
    while True:
        metrics = requests.get(f"{container.url}/metrics", timeout=10)
        assert metrics.status_code == 200
        if counted.search(metrics.text) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert counted.search(metrics.text), [line for line in metrics.text.splitlines() if "requests_total" in line]

    assert container.daemon.docker("exec", container.name, "id", "-u").stdout.strip() == "10001"
    listing = container.daemon.docker("exec", container.name, "ls", "-A", "/app/model").stdout.split()
    assert "1" in listing and "model.py" in listing and "wheels" not in listing  # the wheel is no model file
    assert "gRPC off" not in container.logs()


def test_docker_stop_drains_a_request_in_flight(container, project):
    """SIGTERM (STOPSIGNAL) reaches gunicorn as PID 1, which drains: the request in flight is answered.

    The body is larger than what servekit gathers before a worker thread takes a request
    (``slow_clients.EARLY_BODY``), so a thread is reading it when the signal comes.
    """
    rows = 100_000
    body = json.dumps({"instances": [[5.1, 3.5, 1.4, 0.2]] * rows}).encode()
    half = len(body) * 3 // 4
    assert half > slow_clients.EARLY_BODY
    with socket.create_connection(("127.0.0.1", container.http), timeout=30) as conn:
        conn.sendall(
            f"POST /v1/models/{MODEL}:predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body[:half]
        )
        time.sleep(0.5)  # the worker has the request and waits for the rest of its body
        stop = subprocess.Popen(
            [container.daemon.client, "stop", "--time", STOP_TIME, container.name],
            env=container.daemon.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 30
        while "SIGTERM: readiness is 503" not in container.logs():  # the worker has the signal
            assert time.monotonic() < deadline, "no SIGTERM reached the server 30 s after docker stop"
            time.sleep(0.2)
        conn.sendall(body[half:])
        answer = http.client.HTTPResponse(conn)
        answer.begin()
        status, payload = answer.status, answer.read()
    assert status == 200, payload[:500]
    predictions = json.loads(payload)["predictions"]
    assert len(predictions) == rows and predictions[0]["label"] == "setosa"
    assert stop.wait(timeout=60) == 0, stop.stderr.read() if stop.stderr else ""
    state = container.state()
    assert (state["Running"], state["ExitCode"], state["OOMKilled"]) == (False, 0, False), container.logs()[-3000:]


def test_read_only_without_tmp_says_so_in_one_line(image, daemon):
    bare = Container(daemon, "--read-only")
    try:
        deadline = time.monotonic() + 60
        while bare.state()["Running"] and time.monotonic() < deadline:
            time.sleep(0.3)
        state = bare.state()
        logs = bare.logs()
        assert not state["Running"] and state["ExitCode"] != 0, logs
        assert "Traceback" not in logs, logs
        assert "--tmpfs /tmp" in logs and logs.strip().count("\n") == 0, logs
    finally:
        bare.remove()


@pytest.mark.parametrize(
    ("network", "said"),
    [
        # this daemon has no bridge (dockerd --bridge=none): no build step runs on the default network
        pytest.param([], "the Docker engine has no bridge network", id="default"),
        # steps run, pip reaches nothing
        pytest.param(["--docker-arg", "--network=none"], "pip in the build could not reach", id="none"),
    ],
)
def test_a_build_without_network_names_the_option_that_gives_it_one(
    image, project, daemon, base, pip_cert, network, said
):
    result = servekit(
        "build", str(project), "--tag", TAG + "-offline", "--base-image", base, "--pip-cert", str(pip_cert[0]),
        # another index setting than the image's, so the dependency layer is not taken from the cache
        "--pip-extra-index-url", "https://pypi.org/simple", *network, env=daemon.env,
    )  # fmt: skip
    assert result.returncode != 0, result.stdout[-3000:]
    last = (result.stderr.strip().splitlines() or [""])[-1]
    assert last.startswith(f"servekit build: {said}"), result.stdout[-6000:] + result.stderr
    assert "--docker-arg --network=host" in last


#: Docker's own client, which runs BuildKit only through the buildx plugin, where the machine has one.
NEWER_CLIENT = Path("/usr/local/bin/docker")


def test_pip_cert_builds_with_a_docker_client_without_buildx_first_in_path(image, project, daemon, base, pip_cert):
    if not NEWER_CLIENT.is_file() or NEWER_CLIENT.resolve() == Path(daemon.client).resolve():
        pytest.skip(f"no second docker client at {NEWER_CLIENT}")
    if scaffold.drives_buildkit(str(NEWER_CLIENT)):
        pytest.skip(f"{NEWER_CLIENT} has the buildx plugin here")
    env = {**daemon.env, "PATH": f"{NEWER_CLIENT.parent}{os.pathsep}{daemon.env['PATH']}"}
    result = servekit(
        "build", str(project), "--tag", TAG, "--base-image", base, "--pip-cert", str(pip_cert[0]),
        "--docker-arg", "--network=host", env=env,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert f"{NEWER_CLIENT} cannot run BuildKit" in output, output[-4000:]  # and says which client it took
