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


#: TEI's default ``--max-batch-tokens``: padded tokens one encoder forward pass may hold
DEFAULT_MAX_BATCH_TOKENS = 16384


def token_batches(lengths: list[int], max_rows: int, max_tokens: int | None) -> list[list[int]]:
    """Row indices grouped into forward passes: by length (shortest first, so a pass pads little),
    each pass at most ``max_rows`` rows and at most ``max_tokens`` padded tokens (its rows times its
    longest row, as TEI counts them); a row over the budget alone still makes a pass of its own."""
    batches: list[list[int]] = []
    current: list[int] = []
    for index in sorted(range(len(lengths)), key=lengths.__getitem__):
        full = len(current) >= max_rows
        over = max_tokens is not None and (len(current) + 1) * lengths[index] > max_tokens
        if current and (full or over):
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches
