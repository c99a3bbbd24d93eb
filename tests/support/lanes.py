"""The suite's two lanes: the quick one (``-m "not slow"``) and the whole suite.

A module whose tests are all slow says so once, ``pytestmark = pytest.mark.slow``
at its top level; the quick lane then does not even import it (``conftest.py``),
so the frameworks such modules import (torch, TensorFlow) stay out of it.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path


@cache
def wholly_slow(path: Path) -> bool:
    """Whether every test of the module is slow (``pytestmark = pytest.mark.slow`` at module level)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            return "slow" in ast.unparse(node.value)
    return False


def quick_lane(markexpr: str) -> bool:
    """Whether a run selects the quick lane: ``-m "not slow"``, however it is spaced."""
    return " ".join(markexpr.split()) == "not slow"
