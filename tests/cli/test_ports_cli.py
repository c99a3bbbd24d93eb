"""``servekit serve`` refuses what cannot work in one line, before any worker starts.

A taken port (HTTP or gRPC) stops the second server with exit status 2 and one
line naming the port and its flag: gRPC binds with ``SO_REUSEPORT`` for its own
workers, which would otherwise let a second server share the port and take part
of the first one's traffic.  Mistyped flags and a missing ``--plugin`` are one
line too, never a traceback.  A server that starts says where it serves what.
"""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from servekit.testing import ServerProcess, free_port
from sklearn_models import fit_regressor

# every test runs `servekit serve` as a user does, in a process of its own
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    base = tmp_path_factory.mktemp("ports")
    fit_regressor(base / "linear")
    return base


def serve(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """``servekit serve`` as a user runs it; it must exit on its own."""
    cmd = [sys.executable, "-m", "servekit", "serve", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def assert_one_line(result: subprocess.CompletedProcess, *fragments: str) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""
    line = result.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, result.stderr
    assert line.startswith("servekit: ")
    for fragment in fragments:
        assert fragment in line, line
    return line


# -- mistakes on the command line ----------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--plugin", "missing.py"], ["--plugin", "missing.py"]),
        (["--plugin", "no_such_module_here"], ["--plugin", "no_such_module_here"]),
        (["--log-level", "verbose"], ["--log-level", "verbose"]),
        (["--http-port", "99999"], ["--http-port", "99999"]),
        (["--grpc-port", "-1"], ["--grpc-port", "-1"]),
        (["--workers", "none"], ["--workers", "none"]),
        (["--threads", "0"], ["--threads", "found 0"]),
        (["--threads", "-3"], ["--threads", "found -3"]),
    ],
)
def test_a_mistaken_flag_is_one_line_and_status_2(repo, args, fragments):
    assert_one_line(serve(str(repo), *args), *fragments)


def test_a_broken_config_file_is_one_line_naming_it(repo, tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text("workers: 2\nthreads: [1,\n")
    assert_one_line(serve(str(repo), "--config", str(config)), f"--config {config}", "not valid YAML", "line 3")


def test_plugins_listing_with_a_missing_plugin_is_one_line():
    cmd = [sys.executable, "-m", "servekit", "plugins", "--plugin", "missing.py"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == "servekit plugins: --plugin: plugin file not found: missing.py"


def test_a_broken_plugin_file_is_one_line(repo, tmp_path):
    plugin = tmp_path / "hooks.py"
    plugin.write_text("import servekit\n\ndef load(:\n")
    assert_one_line(serve(str(repo), "--plugin", str(plugin)), "--plugin", "SyntaxError")


def test_an_http_port_another_program_holds_is_refused(repo):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = serve(str(repo), "--host", "127.0.0.1", "--http-port", str(port), "--grpc-port", "0")
    assert_one_line(result, f"port {port} (--http-port)", "in use", "--http-port")


def test_http_and_grpc_on_one_port_is_refused(repo):
    pytest.importorskip("grpc")
    port = str(free_port())
    assert_one_line(serve(str(repo), "--http-port", port, "--grpc-port", port), "--http-port", "--grpc-port", port)


# -- a second server on a port the first one holds --------------------------------------------


def test_a_second_server_never_shares_a_port_with_the_first(repo):
    pytest.importorskip("grpc")
    tritonclient_grpc = pytest.importorskip("tritonclient.grpc")
    with ServerProcess(repo, grpc_port="auto", workers=2, threads=2) as first:
        host = ["--host", "127.0.0.1"]
        same_grpc = serve(str(repo), *host, "--http-port", str(free_port()), "--grpc-port", str(first.grpc_port))
        assert_one_line(same_grpc, f"port {first.grpc_port} (--grpc-port)", "choose a free port with --grpc-port")
        same_http = serve(str(repo), *host, "--http-port", str(first.http_port), "--grpc-port", str(free_port()))
        assert_one_line(same_http, f"port {first.http_port} (--http-port)", "choose a free port with --http-port")
        # the first server's two workers share its gRPC port, and it serves every call
        client = tritonclient_grpc.InferenceServerClient(f"127.0.0.1:{first.grpc_port}")
        assert all(client.is_model_ready("linear") for _ in range(20))
        assert first.output().count("gRPC listening") == 2


def test_the_start_up_log_says_where_each_protocol_is_served(repo):
    pytest.importorskip("grpc")
    with ServerProcess(repo, grpc_port="auto", workers=1, threads=2) as server:
        output = server.output()
    http = f"HTTP http://127.0.0.1:{server.http_port}: TF Serving REST /v1/models/NAME, V2 /v2"
    assert http in output and "OpenAI /v1/chat/completions" in output and "/openai/v1" in output
    grpc_line = f"gRPC 127.0.0.1:{server.grpc_port}: tensorflow.serving.PredictionService, "
    assert grpc_line in output and "inference.GRPCInferenceService" in output
    assert "1 model(s): linear; plugins: " in output and "sklearn" in output


def test_a_grpc_port_that_cannot_be_bound_is_fatal_with_the_flag(repo, servekit_app):
    pytest.importorskip("grpc")
    from servekit.server.grpc_server import build_server
    from servekit.server.settings import Settings

    dataplane = servekit_app(repo).application.extensions["servekit"]
    with socket.socket() as holder:  # no SO_REUSEPORT: nobody may share it
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(RuntimeError, match=rf"port {port} is in use.*--grpc-port"):
            build_server(dataplane, Settings(host="127.0.0.1", grpc_port=port))
