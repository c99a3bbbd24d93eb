"""A module imported at its first use, for test modules that would import a heavy framework at collection.

A parallel run collects every test module in every worker, so a module-level
``pytest.importorskip("tensorflow")`` costs seconds in each worker, even in those
that run none of its tests.  :func:`lazy_module` skips the module the same way
when the package is missing (looked up, not imported) and imports it on the
first attribute read.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import pytest


class LazyModule:
    """Stands for the module ``name``; the first read of a public attribute imports it."""

    def __init__(self, name: str) -> None:
        self.__dict__["_name"] = name

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("_"):  # pytest looks for fixture markers on every module attribute
            raise AttributeError(attribute)
        return getattr(importlib.import_module(self.__dict__["_name"]), attribute)


def lazy_module(name: str) -> LazyModule:
    """``pytest.importorskip(name)`` at module level, with the import put off until first use.

    ``name`` may be a submodule (``tensorflow.core.framework.tensor_pb2``): whether its
    top-level package is installed decides the skip, without importing it.
    """
    top = name.partition(".")[0]
    if importlib.util.find_spec(top) is None:
        pytest.skip(f"could not import {top!r}: not installed", allow_module_level=True)
    return LazyModule(name)
