"""The code base passes ruff with the rules in pyproject.toml, and is ruff-formatted."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


def ruff() -> str:
    found = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(found).exists():
        pytest.fail("ruff is not installed; it is part of the test extra")
    return found


def test_ruff_finds_nothing():
    result = subprocess.run([ruff(), "check", "--no-cache", str(ROOT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_tree_is_ruff_formatted():
    result = subprocess.run(
        [
            ruff(),
            "format",
            "--check",
            "--no-cache",
            *(str(ROOT / d) for d in ("framework", "plugins", "tests", "bench")),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, "run `ruff format` (the pre-commit hook does):\n" + result.stdout + result.stderr
