"""Reading an ``MLmodel`` file: its flavors, and its signature as servekit tensors.

The file is YAML; its ``signature`` holds JSON strings (``inputs``,
``outputs``): a list of columns (``{"type": "double", "name": "age"}``) or of
tensors (``{"type": "tensor", "tensor-spec": {"dtype": "float64", "shape":
[-1, 4]}}``).  Both are read here without mlflow, so a native flavor needs no
mlflow installed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from servekit import numpy_to_v2
from servekit.types import TensorSpec

MLMODEL = "MLmodel"
#: MLflow column types -> V2 datatypes
COLUMN_TYPES = {
    "double": "FP64",
    "float": "FP32",
    "long": "INT64",
    "integer": "INT32",
    "boolean": "BOOL",
    "string": "BYTES",
    "binary": "BYTES",
    "datetime": "BYTES",
}


def read_mlmodel(folder: Path) -> dict[str, Any]:
    try:
        doc = yaml.safe_load((folder / MLMODEL).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{MLMODEL}: not readable YAML ({exc})") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("flavors"), dict):
        raise ValueError(f"{MLMODEL}: expected a mapping with 'flavors'")
    return doc


def signature_specs(doc: dict[str, Any], part: str) -> list[TensorSpec] | None:
    """The signature's ``inputs`` or ``outputs`` as tensors; ``None`` when the model has no signature."""
    raw = (doc.get("signature") or {}).get(part)
    if not raw:
        return None
    entries = json.loads(raw) if isinstance(raw, str) else raw
    specs = []
    for i, entry in enumerate(entries):
        name = entry.get("name") or ("input" if part == "inputs" else "predictions") + (f"_{i}" if i else "")
        if entry.get("type") == "tensor":
            tensor = entry.get("tensor-spec") or {}
            specs.append(TensorSpec(name, numpy_to_v2(np.dtype(tensor.get("dtype", "float64"))), tensor.get("shape")))
        else:
            datatype = COLUMN_TYPES.get(str(entry.get("type")), "BYTES")
            # a DataFrame column: NaN is pandas's missing value, handed on as MLflow's own server does
            specs.append(TensorSpec(name, datatype, [-1], allow_nan=datatype.startswith("FP")))
    return specs


def is_columns(doc: dict[str, Any]) -> bool:
    """Whether the signature's inputs are named columns (a DataFrame), not tensors."""
    raw = (doc.get("signature") or {}).get("inputs")
    if not raw:
        return False
    entries = json.loads(raw) if isinstance(raw, str) else raw
    return bool(entries) and all(e.get("type") != "tensor" and e.get("name") for e in entries)
