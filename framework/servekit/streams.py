"""Streamed results: the one test for "is this a stream" and the one way to close one.

A model streams by returning a generator (or any iterator) from ``predict`` or
``complete``; every layer that passes such a result on (the data plane, the
batcher, the protocols, the request log) asks :func:`is_stream`, and every layer
that stops consuming one early calls :func:`close`, so closing the response
(client gone) reaches the model's generator and stops it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Plain values that may be iterable but are never a stream (checked first: it is cheap).
_PLAIN = (np.ndarray, dict, list, tuple, str, bytes)


def is_stream(value: Any) -> bool:
    """Whether a hook's result is a stream of items rather than one answer."""
    return not isinstance(value, _PLAIN) and hasattr(value, "__next__")


def close(items: Any) -> None:
    """Close an iterator that has a ``close`` (a generator, a response body); others need none."""
    closer = getattr(items, "close", None)
    if closer is not None:
        closer()
