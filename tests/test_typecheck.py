"""framework/ and plugins/ pass mypy with the configuration in pyproject.toml.

Not strict: a function without annotations is not checked (a ``model.py`` hook
may be written without them), but every annotation that is there must hold.
mypy keeps its cache in ``.mypy_cache``, so a rerun checks only what changed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


def _mypy(*args: str) -> subprocess.CompletedProcess:
    mypy = shutil.which("mypy") or str(Path(sys.executable).parent / "mypy")
    if not Path(mypy).exists():
        pytest.fail("mypy is not installed; it is part of the test extra")
    return subprocess.run([mypy, *args], cwd=ROOT, capture_output=True, text=True, check=False)


@pytest.mark.slow  # a minute of its own: out of the quick lane
def test_mypy_finds_nothing():
    result = _mypy()
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow  # seconds of its own: out of the quick lane
def test_the_configuration_catches_a_wrong_annotation(tmp_path):
    wrong = tmp_path / "wrong.py"
    wrong.write_text(
        "from servekit.types import TensorSpec\n\n\ndef name(spec: TensorSpec) -> int:\n    return spec.name\n"
    )
    # the project's own cache (.mypy_cache): after test_mypy_finds_nothing only wrong.py is new
    result = _mypy("--config-file", str(ROOT / "pyproject.toml"), str(wrong))
    assert result.returncode == 1 and 'Incompatible return value type (got "str", expected "int")' in result.stdout


def test_mypy_checks_the_packages_and_sees_the_stubs():
    """The configuration points at both trees, and the protobuf stubs type the gRPC messages."""
    config = (ROOT / "pyproject.toml").read_text()
    assert 'files = ["framework/servekit", "plugins"]' in config
    stubs = sorted((ROOT / "framework/servekit/protocols/grpc/protos").rglob("*_pb2.pyi"))
    modules = sorted((ROOT / "framework/servekit/protocols/grpc/protos").rglob("*_pb2.py"))
    assert [p.with_suffix("") for p in stubs] == [p.with_suffix("") for p in modules]
    assert (ROOT / "framework/servekit/py.typed").exists()
