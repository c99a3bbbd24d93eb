"""Debian's ``prometheus`` for tests: the binary (or a skip saying how to install it), and a
server on 127.0.0.1 whose data lives in a temporary folder.

scripts/test.sh installs the ``prometheus`` package when missing and run as root.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
import requests
from servekit.testing import free_port


def binary(name: str) -> str:
    found = shutil.which(name)
    if not found:
        pytest.skip(f"{name} is not installed (Debian: apt-get install -y prometheus; scripts/test.sh does as root)")
    return found


class Prometheus:
    """Debian's prometheus on 127.0.0.1, its data in a temporary folder."""

    def __init__(self, folder: Path, config: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(folder / "prometheus.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                binary("prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.folder = folder
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (folder / "prometheus.log").read_text()[-3000:]
            try:
                if requests.get(self.url + "/-/ready", timeout=2).status_code == 200:
                    return
            except requests.RequestException:  # not listening yet, or not answering yet
                pass
            time.sleep(0.2)
        raise TimeoutError("prometheus did not get ready")

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        params = {"query": expr, **({"time": str(at)} if at is not None else {})}
        body = requests.get(self.url + "/api/v1/query", params=params, timeout=10).json()
        assert body["status"] == "success", (expr, body)
        return body["data"]["result"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
