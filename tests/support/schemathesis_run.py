"""Each operation of an OpenAPI document fuzzed by schemathesis, every failure kept.

schemathesis' own pytest loader needs pytest internals that pytest 9 dropped, so
each operation's strategy runs under hypothesis here, deterministically.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings


def fuzz_operations(operations: list[Any], call: Callable[[Any], None], examples: int) -> tuple[list[str], int]:
    """Run ``call(case)`` on ``examples`` generated cases of each operation: (failures, requests sent)."""
    failures: list[str] = []
    calls = {"n": 0}
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=examples,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
            phases=[Phase.explicit, Phase.generate],
        )
        def check(case):
            calls["n"] += 1
            call(case)

        try:
            check()
        except BaseException as exc:  # keep going (hypothesis raises exception groups): report every failure
            if isinstance(exc, KeyboardInterrupt):
                raise
            failures.append(f"{operation.method.upper()} {operation.path}: {str(exc)[:1500]}")
    return failures, calls["n"]
