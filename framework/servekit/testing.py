"""servekit's test helpers, shipped as a pytest plugin (entry point ``pytest11``).

Model containers and third-party plugins test the way servekit does:

- ``servekit_app(*paths, **settings)``: an in-process Flask test client over
  model folders, models loaded before it returns (fast unit tests).
- ``servekit_server(*paths, **settings)``: the real ``servekit serve`` under
  gunicorn on free loopback ports, ready before it returns; stopped at teardown.
- :class:`ServerProcess` for session-scoped servers shared between tests.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``servekit serve`` in a subprocess on free loopback ports.

    One HTTP worker unless ``workers=`` says otherwise (a test server need not
    fork one per CPU); the HTTP engine is ``--server`` or ``SERVEKIT_SERVER``.
    """

    #: What starts the command: ``launcher(command, stdout=..., stderr=..., env=...)`` returns a
    #: ``subprocess.Popen``, or an object that answers as one (``pid``, ``poll``, ``wait``,
    #: ``send_signal``, ``terminate``, ``kill``, ``returncode``). servekit's own suite forks its
    #: servers from a warm process this way (tests/support/server_forks.py in its repository).
    launcher: Callable[..., Any] = subprocess.Popen

    def __init__(self, *paths: str | Path, env: dict[str, str] | None = None, client_ssl: Any = None, **settings: Any):
        self.paths = [str(p) for p in paths]
        #: an ``ssl.SSLContext`` the readiness probe uses against a TLS server (its CA, a client cert)
        self.client_ssl = client_ssl
        self.http_port = settings.pop("http_port", None) or free_port()
        self.grpc_port = settings.pop("grpc_port", 0)
        if self.grpc_port == "auto":
            self.grpc_port = free_port()
        self.settings = {"poll_interval": 0.5, "workers": 1, **settings}
        self.env = env or {}
        self.proc: Any = None  # what the launcher returned
        # kept open: the server writes to it for its whole life, output() reads it back
        self.log = tempfile.NamedTemporaryFile(prefix="servekit-", suffix=".log", delete=False)  # noqa: SIM115

    @property
    def url(self) -> str:
        tls = self.settings.get("tls_cert") and self.settings.get("tls_scope", "all") == "all"
        return f"{'https' if tls else 'http'}://127.0.0.1:{self.http_port}"

    def command(self) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "servekit",
            "serve",
            *self.paths,
            "--host",
            "127.0.0.1",
            "--http-port",
            str(self.http_port),
            "--grpc-port",
            str(self.grpc_port),
        ]
        for key, value in self.settings.items():
            flag = "--" + key.replace("_", "-")
            values = value if isinstance(value, (list, tuple)) else [value]
            for v in values:
                if v is True:
                    cmd.append(flag)
                elif v is False:
                    cmd.append("--no-" + flag[2:])  # e.g. strict_readiness=False
                elif v is not None:
                    cmd += [flag, str(v)]
        return cmd

    def start(self, timeout: float = 120.0, wait: bool = True) -> ServerProcess:
        env = {**os.environ, **self.env}
        self.proc = type(self).launcher(self.command(), stdout=self.log, stderr=subprocess.STDOUT, env=env)
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 120.0) -> None:
        import urllib.error
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"servekit exited with {self.proc.returncode}:\n{self.output()}")
            try:
                with urllib.request.urlopen(self.url + "/v2/health/ready", timeout=2, context=self.client_ssl) as r:
                    if r.status == 200:
                        return
            except urllib.error.HTTPError as exc:
                _raise_if_never_ready(exc, self.output)
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"servekit not ready after {timeout}s:\n{self.output()}")

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-20000:]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def __enter__(self) -> ServerProcess:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _raise_if_never_ready(exc: Any, output: Any) -> None:
    """Fail at once when every first load finished and a model failed (strict readiness).

    Waiting longer would not help: the server stays unready until the model's
    folder is fixed.  A test that serves a broken model on purpose passes
    ``strict_readiness=False``.
    """
    import json

    try:
        reason = json.loads(exc.read() or b"{}").get("reason", "")
    except ValueError:
        return
    if "AVAILABLE version" in reason:
        raise RuntimeError(f"servekit is not ready: {reason}\n{output()}")


@pytest.fixture
def servekit_server():
    """Factory: ``servekit_server(model_dir, workers=2)`` -> a ready :class:`ServerProcess`."""
    started: list[ServerProcess] = []

    def start(*paths: str | Path, **settings: Any) -> ServerProcess:
        server = ServerProcess(*paths, **settings).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _buffered_client_class():
    from flask.testing import FlaskClient

    class BufferedClient(FlaskClient):
        """Reads every response whole and closes it, as a real server does.

        An unread streamed response would otherwise hold its request slot; pass
        ``buffered=False`` to read a stream yourself (and close it).
        """

        def open(self, *args: Any, **kwargs: Any):
            kwargs.setdefault("buffered", True)
            return super().open(*args, **kwargs)

    return BufferedClient


_OFF = ("0", "false", "no", "off")


@pytest.fixture
def servekit_app():
    """Factory: ``servekit_app(model_dir, plugin=[...])`` -> a Flask test client, models loaded."""
    from servekit.server.app import create_app
    from servekit.server.settings import Settings

    apps = []

    def make(*paths: str | Path, **settings: Any):
        # SERVEKIT_FAST_LANE=0 runs a suite through Flask alone, as ServerProcess does
        settings.setdefault("fast_lane", os.environ.get("SERVEKIT_FAST_LANE", "1").lower() not in _OFF)
        config = Settings(paths=[str(p) for p in paths], poll_interval=0, **settings)
        app = create_app(config, start=False)
        app.extensions["servekit"].repository.load_now()
        app.test_client_class = _buffered_client_class()
        apps.append(app)
        return app.test_client()

    yield make
    for app in apps:
        app.extensions["servekit"].repository.stop()
        app.extensions["servekit"].shadows.close()  # its shadow process, if a copy started one
