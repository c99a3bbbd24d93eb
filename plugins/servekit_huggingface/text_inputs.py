"""The ``text`` (and ``text_pair``) inputs of the plugin's encoders and classifiers, as
V1, V2 and gRPC decode them: named BYTES tensors, or one unnamed tensor of texts (V1 rows
of ``[text, text_pair]`` too).  No heavy imports."""

from __future__ import annotations

from typing import Any

import numpy as np
from servekit.errors import BadRequest


def texts_of(inputs: Any) -> tuple[list[str], list[str] | None]:
    """``text`` (and ``text_pair``) as lists of strings: named tensors, or one unnamed tensor of texts."""
    if isinstance(inputs, dict):
        unknown = sorted(set(inputs) - {"text", "text_pair"})
        if unknown or "text" not in inputs:
            raise BadRequest(f"expected the inputs 'text' and optionally 'text_pair', found {sorted(inputs)}")
        texts = strings(inputs["text"], "text")
        pairs = strings(inputs["text_pair"], "text_pair") if "text_pair" in inputs else None
        if pairs is not None and len(pairs) != len(texts):
            raise BadRequest(f"'text' has {len(texts)} rows but 'text_pair' has {len(pairs)}")
        return texts, pairs
    array = np.asarray(inputs, dtype=object)
    if array.ndim == 2 and array.shape[1] == 2:  # V1 rows of [text, text_pair]
        return strings(array[:, 0], "text"), strings(array[:, 1], "text_pair")
    return strings(array, "text"), None


def strings(values: Any, name: str) -> list[str]:
    array = np.asarray(values, dtype=object).reshape(-1)
    out = []
    for value in array:
        if isinstance(value, bytes):
            out.append(value.decode("utf-8", errors="replace"))
        elif isinstance(value, str):
            out.append(value)
        else:
            raise BadRequest(f"input {name!r} must hold strings, found {type(value).__name__}")
    return out
