"""The README's Quickstart is true: the serve script serves HTTP on :8080 *and* gRPC on :8081.

The script installs ``servekit[EXTRAS]`` and execs ``servekit serve examples/models``.
Installing is the one step a test cannot repeat, so this test reads which extras
the script installs, checks that they include gRPC, then runs the rest of the
script's path as it does: train the example with ``examples/train_iris.py`` and
start the ``servekit`` console script on the example folder (a copy, on free
ports), and calls it over HTTP and over gRPC with the README's own snippet.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from processes import wait_ready
from repo_paths import REPO as ROOT
from servekit.testing import free_port

pytestmark = pytest.mark.slow

SCRIPT = ROOT / "scripts" / "serve-examples.sh"


def script_extras() -> list[str]:
    match = re.search(r'bootstrap\.sh"?\s+([\w,-]+)', SCRIPT.read_text())
    assert match, "serve-examples.sh no longer sources bootstrap.sh with its extras"
    return match.group(1).split(",")


def test_the_serve_script_installs_grpc_as_the_quickstart_promises():
    assert "grpc" in script_extras()
    readme = (ROOT / "README.md").read_text()
    assert ":8081 (gRPC)" in readme and f'pip install -e ".[{",".join(script_extras())}]"' in readme
    assert 'exec servekit serve examples/models "$@"' in SCRIPT.read_text()


def readme_grpc_snippet() -> str:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    (snippet,) = [b for b in blocks if "tritonclient.grpc" in b]
    return snippet


def test_served_as_the_quickstart_does_grpc_answers(tmp_path):
    pytest.importorskip("grpc")
    pytest.importorskip("tritonclient.grpc")
    models = tmp_path / "models"
    shutil.copytree(ROOT / "examples" / "models", models)
    subprocess.run([sys.executable, str(ROOT / "examples" / "train_iris.py"), str(models)], check=True, timeout=300)
    http_port, grpc_port = free_port(), free_port()
    servekit = shutil.which("servekit", path=str(Path(sys.executable).parent)) or "servekit"
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        [
            servekit,
            "serve",
            str(models),
            "--host",
            "127.0.0.1",
            "--http-port",
            str(http_port),
            "--grpc-port",
            str(grpc_port),
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_ready(f"http://127.0.0.1:{http_port}", proc, tmp_path / "serve.log")
        snippet = readme_grpc_snippet().replace("localhost:8081", f"127.0.0.1:{grpc_port}")
        run = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == "[b'setosa']"
        assert f"gRPC 127.0.0.1:{grpc_port}: " in (tmp_path / "serve.log").read_text()
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()
