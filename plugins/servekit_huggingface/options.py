"""Reading the plugin's ``options`` from ``servekit.yaml`` (no heavy imports)."""

from __future__ import annotations

from typing import Any


def positive_option(options: dict[str, Any], key: str, zero: bool = False) -> int | None:
    """``options[key]`` as a positive integer (or zero when allowed), ``None`` when unset."""
    value = options.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < (0 if zero else 1):
        kind = "a non-negative" if zero else "a positive"
        raise ValueError(f"options.{key} must be {kind} integer, found {value!r}")
    return value
