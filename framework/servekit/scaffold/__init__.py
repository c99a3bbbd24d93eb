"""``servekit new`` and ``servekit build``: the project and container templates, and the renderer of their build files."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    # ``servekit.scaffold`` was one module before 0.2.0; its names still import from here for one release
    import importlib
    import importlib.util
    import warnings

    if name.startswith("__") or importlib.util.find_spec(f"{__name__}.{name}") is not None:
        raise AttributeError(name)  # a submodule: the import system loads it
    value = getattr(importlib.import_module("servekit.scaffold.project"), name, None)
    if value is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"servekit.scaffold.{name} moved to servekit.scaffold.project.{name} in servekit 0.2.0; the old name goes in 0.3.0",
        DeprecationWarning,
        2,
    )
    return value
