"""Triton's classification extension: an output answered as its top-N classes.

A requested output with the ``classification`` parameter (HTTP
``{"name": "OUT", "parameters": {"classification": 3}}``, gRPC's
``int64_param``) is answered as a ``BYTES`` tensor of ``"value:index"``
strings, ``"value:index:label"`` when the model has labels, highest value
first, as Triton's ``TopkClassifications`` writes them: numbers as C++'s
``std::to_string`` prints them (``0.750000``, ``3``).

Shape, as Triton: a model that batches (``max_batch_size`` above 0 in its
configuration, servekit's ``batching.max_batch_size``) keeps the batch
dimension and ranks each row, ``[batch, min(N, row elements)]``; any other
output is ranked as a whole, ``[min(N, elements)]``.

Labels of an output, first found:

1. ``label_filename`` of the output in the folder's Triton ``config.pbtxt``;
2. for a pipeline (a Triton ensemble), the labels of the step output that
   makes it, found the same way for that step's model, as Triton's ensembles
   take their composing models' labels;
3. the labels the model's metadata gives the output (``TensorSpec.labels``:
   scikit-learn's ``classes_`` for ``predict_proba``);
4. ``labels.txt`` in the version folder, else in the model folder.

A label file holds one label per line; line *i* names index *i*.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from servekit.errors import BadRequest, ServekitError
from servekit.folders import triton_config as triton_model_config
from servekit.folders.pipeline import Pipeline, Step

log = logging.getLogger("servekit.dataplane")

#: Triton ranks these datatypes; any other is refused as it refuses it.
RANKED_KINDS = "iuf"
LABEL_FILE = "labels.txt"


def top_classes(arr: np.ndarray, count: int, *, batched: bool, labels: list[str] | None = None) -> np.ndarray:
    """``arr`` as its top ``count`` classes: a ``BYTES`` object array of ``value:index[:label]``."""
    arr = np.asarray(arr)
    if arr.dtype.kind not in RANKED_KINDS or arr.dtype == np.float16:
        datatype = _datatype_name(arr)
        raise BadRequest(f"class result not available for output due to unsupported type '{datatype}'")
    rows = arr.reshape(arr.shape[0], -1) if batched and arr.ndim else arr.reshape(1, -1)
    width = min(count, rows.shape[1])
    out = np.empty((rows.shape[0], width), dtype=object)
    for r, row in enumerate(rows):
        values = row.tolist()
        # highest first; Python's sort is stable, so equal values stay in index order
        order = sorted(range(len(values)), key=lambda i: -values[i])
        for k, index in enumerate(order[:width]):
            text = f"{_number(values[index])}:{index}"
            if labels is not None and index < len(labels):
                text += f":{labels[index]}"
            out[r, k] = text.encode("utf-8")
    return out if batched and arr.ndim else out.reshape(width)


def _number(value: Any) -> str:
    """A value as C++'s ``std::to_string`` writes it (``%f`` for floating point, ``%d`` else)."""
    if isinstance(value, float):
        return f"{value:f}"
    return str(int(value))


def _datatype_name(arr: np.ndarray) -> str:
    if arr.dtype == np.float16:
        return "FP16"
    return {"b": "BOOL", "O": "BYTES", "S": "BYTES", "U": "BYTES"}.get(arr.dtype.kind, str(arr.dtype).upper())


# -- labels ---------------------------------------------------------------------------------


def labels_for(mv: Any, output: str, spec_labels: list[str] | None) -> list[str] | None:
    """The labels of ``output`` of version ``mv`` (see the module's docstring), cached on it."""
    cache: dict[str, list[str] | None] = mv.__dict__.setdefault("_class_labels", {})
    if output not in cache:
        cache[output] = _find_labels(mv, output, spec_labels)
    return cache[output]


def _find_labels(mv: Any, output: str, spec_labels: list[str] | None) -> list[str] | None:
    folder = triton_model_config.model_folder(mv)
    named = config_label_files(triton_model_config.of_version(mv)).get(output)
    if named is not None:
        return read_label_file(folder / named)
    if isinstance(mv.model, Pipeline):
        found = mv.model.output_labels(output)
        if found is not None:
            return found
    if spec_labels is not None:
        return [str(label) for label in spec_labels]
    for candidate in (Path(mv.path) / LABEL_FILE, folder / LABEL_FILE):
        if candidate.is_file():
            return read_label_file(candidate)
    return None


def step_labels(resolve: Callable[[str, int | None], Any]) -> Callable[[Step, str], list[str] | None]:
    """``labels_of`` for a pipeline whose steps ``resolve(model, version)`` finds (the repository's)."""

    def labels_of(step: Step, output: str) -> list[str] | None:
        try:
            step_mv = resolve(step.model, step.version)
            signature = step_mv.metadata.signature()
            spec = next((s for s in signature.outputs if s.name == output), None) if signature else None
            return labels_for(step_mv, output, spec.labels if spec is not None else None)
        except ServekitError as exc:  # not loaded, or its label file unreadable: no labels, as Triton
            log.warning("pipeline step %s: no labels for %s: %s", step.model, output, exc.message)
            return None

    return labels_of


def config_label_files(config: dict[str, Any] | None) -> dict[str, str]:
    """Output name -> ``label_filename`` from a folder's Triton configuration (:mod:`.triton_model_config`)."""
    outputs = (config or {}).get("output", [])
    return {str(o["name"]): str(o["label_filename"]) for o in outputs if o.get("label_filename") and o.get("name")}


def read_label_file(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the label file {path.name} cannot be read: {exc}") from None
