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


#: On a CPU a forward pass costs about as much as this many more padded tokens (MiniLM-L6:
#: 16 rows of 61 to 127 tokens ran 1.42x faster on one core as four passes than as one):
#: passes are cut where a row would pad more than that.  On a GPU padding is nearly free.
CPU_PASS_TOKENS = 32


def pass_cost(device: str) -> int:
    """What a forward pass costs in padded tokens on ``device`` (:func:`token_batches`)."""
    return CPU_PASS_TOKENS if device == "cpu" else 0


def token_batches(lengths: list[int], max_rows: int, max_tokens: int | None, pass_tokens: int = 0) -> list[list[int]]:
    """Row indices grouped into forward passes: by length (shortest first, so a pass pads little),
    each pass at most ``max_rows`` rows and at most ``max_tokens`` padded tokens (its rows times its
    longest row, as TEI counts them); a row over the budget alone still makes a pass of its own.

    With ``pass_tokens`` the cuts are chosen to spend the fewest padded tokens plus
    ``pass_tokens`` a pass (an exact split of the sorted rows, by dynamic programming);
    with 0, each pass takes as many rows as the bounds allow."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    if pass_tokens <= 0:
        return _filled(order, lengths, max_rows, max_tokens)
    sizes = [lengths[i] for i in order]
    cost = [0.0] + [float("inf")] * len(sizes)  # cost[end]: the best split of the first ``end`` rows
    start_of = [0] * (len(sizes) + 1)
    for end in range(1, len(sizes) + 1):
        longest = sizes[end - 1]
        for start in range(end - 1, max(end - max_rows, 0) - 1, -1):
            rows = end - start
            if rows > 1 and max_tokens is not None and rows * longest > max_tokens:
                break
            spent = cost[start] + rows * longest + pass_tokens
            if spent < cost[end]:
                cost[end], start_of[end] = spent, start
    batches: list[list[int]] = []
    end = len(sizes)
    while end:
        batches.append(order[start_of[end] : end])
        end = start_of[end]
    return batches[::-1]


def _filled(order: list[int], lengths: list[int], max_rows: int, max_tokens: int | None) -> list[list[int]]:
    batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        full = len(current) >= max_rows
        over = max_tokens is not None and (len(current) + 1) * lengths[index] > max_tokens
        if current and (full or over):
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches
