"""Tiny models for the limits, fault, metrics and OpenAPI tests: each a ``model.py`` folder.

- ``slow``: sleeps as many seconds as its first input value (capped at 30), answers ``2 * x``;
- ``raiser``: its ``predict`` raises ``ValueError`` with a recognisable message;
- ``ticker``: streams ``n`` events ``delay`` seconds apart for ``{"instances": [[n, delay]]}``;
- plus ``linear`` (y = 2*x0 + 3*x1 + 1) from the shared conftest.
"""

from __future__ import annotations

import socket
import textwrap
import time
from pathlib import Path

from sklearn_models import fit_regressor

SLOW = """
import time

import numpy as np

import servekit


@servekit.hookimpl
def load(path):
    return "slow"


@servekit.hookimpl
def predict(inputs):
    x = np.asarray(inputs, dtype=float)
    time.sleep(min(30.0, float(x.flat[0])) if x.size else 0.0)
    return x * 2
"""

RAISER = """
import servekit


@servekit.hookimpl
def load(path):
    return "raiser"


@servekit.hookimpl
def predict(inputs):
    raise ValueError("boom: this model refuses every input")
"""

TICKER = """
import time

import numpy as np

import servekit


@servekit.hookimpl
def load(path):
    return "ticker"


@servekit.hookimpl
def predict(inputs):
    n, delay = (float(v) for v in np.asarray(inputs, dtype=float).reshape(-1)[:2])

    def ticks():
        for i in range(int(n)):
            time.sleep(delay)
            yield np.array([i])

    return ticks()
"""

MODELS = {"slow": SLOW, "raiser": RAISER, "ticker": TICKER}


def write_model_py(base: Path, name: str, source: str) -> Path:
    folder = base / name / "1"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(textwrap.dedent(source).lstrip())
    return folder


def hardening_repo(base: Path, *, extra_linear: tuple[str, ...] = ()) -> Path:
    """A repository with ``linear``, ``slow``, ``raiser``, ``ticker`` (and more linear copies)."""
    fit_regressor(base / "linear")
    for name in extra_linear:
        fit_regressor(base / name)
    for name, source in MODELS.items():
        write_model_py(base, name, source)
    return base


def worker_pids(master_pid: int) -> set[int]:
    """The gunicorn workers of a master: its children, read from /proc."""
    pids = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == master_pid:
            pids.add(int(stat.parent.name))
    return pids


def post_huge_body(host: str, port: int, path: str, size: int, chunk: int = 1 << 20) -> tuple[bytes, int, float]:
    """Announce a ``size``-byte body and send it until the server answers.

    Returns ``(response bytes, body bytes sent, seconds to the answer)``.  A
    server that enforces its limit answers after the headers, long before
    ``size`` bytes have gone out.
    """
    started = time.perf_counter()
    sock = socket.create_connection((host, port), timeout=30)
    sent = 0
    try:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {size}\r\n\r\n".encode()
        )
        block = b"7" * chunk
        sock.setblocking(False)
        response = b""
        while sent < size and not response:
            try:
                response = sock.recv(65536)
                break
            except BlockingIOError:
                pass
            try:
                sent += sock.send(block[: min(chunk, size - sent)])
            except BlockingIOError:
                time.sleep(0.001)
            except (BrokenPipeError, ConnectionResetError):
                break
        sock.setblocking(True)
        sock.settimeout(30)
        elapsed = time.perf_counter() - started
        while True:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            response += data
        return response, sent, elapsed
    finally:
        sock.close()
