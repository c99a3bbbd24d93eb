"""What the V2 protocol says about the server and its models, built once for HTTP and gRPC.

:mod:`.v2` answers these documents as JSON; :mod:`.grpc.v2` turns the same
documents into its messages (``json_format.ParseDict``), so the two wires
cannot drift apart:

- server metadata (the extensions both wires implement) and model metadata;
- Triton's repository extension: the index, and what a load refuses or reports;
- Triton's statistics extension: counts and cumulative nanoseconds per model
  version (:mod:`servekit.observability.statistics` says what each one measures and how the
  gunicorn workers' numbers are summed);
- Triton's model configuration extension: the folder's ``config.pbtxt``
  (:mod:`servekit.folders.triton_config`) with the model's metadata and
  ``servekit.yaml`` laid over it.

tritonclient's ``get_inference_statistics`` and ``get_model_config`` read the
last two (Triton's example clients do after inferring).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from servekit.dataplane.data_plane import DataPlane
from servekit.dataplane.repository import Model, State
from servekit.errors import BadRequest, NotFound, malformed_version
from servekit.folders import triton_config as triton_model_config
from servekit.observability import statistics
from servekit.types import ModelConfig, TensorSpec
from servekit.version import __version__

#: What server metadata reports under ``extensions`` (Triton's names), on both wires.
EXTENSIONS = [
    "binary_tensor_data",
    "classification",
    "model_repository",
    "parameters",
    "statistics",
    "model_configuration",
]


def version_number(version: str | None) -> int | None:
    """A version as a request names it: empty for the latest, else a number (a 400 otherwise).

    A number no version has (``0`` included) is looked up and not found, a 404, as
    on every route that takes a version (:func:`servekit.dataplane.repository` parses
    the same way)."""
    if not version:
        return None
    if not (version.isascii() and version.isdigit()):  # "¹" is a digit int() refuses
        raise BadRequest(malformed_version(version))
    return int(version)


# -- metadata ------------------------------------------------------------------------------


def server_metadata(extensions: list[str]) -> dict[str, Any]:
    return {"name": "servekit", "version": __version__, "extensions": extensions}


def model_metadata(dp: DataPlane, name: str, version: str | int | None) -> dict[str, Any]:
    """``GET /v2/models/NAME[/versions/V]`` and gRPC ``ModelMetadata``."""
    mv = dp.resolve(name, version)
    meta = dp.metadata(mv)
    signature = meta.signature()
    return {
        "name": name,
        "versions": [str(v.version) for v in dp.model(name).available()],
        "platform": meta.platform,
        "inputs": [_tensor_metadata(t) for t in (signature.inputs if signature else [])],
        "outputs": [_tensor_metadata(t) for t in (signature.outputs if signature else [])],
    }


def _tensor_metadata(spec: TensorSpec) -> dict[str, Any]:
    # V2 has no "unknown rank"; a single -1 is the closest it can say.
    return {"name": spec.name, "datatype": spec.datatype, "shape": spec.shape if spec.shape is not None else [-1]}


# -- model repository extension ------------------------------------------------------------

#: TF Serving's version states as the repository extension names them.
_INDEX_STATE = {
    State.AVAILABLE: "READY",
    State.START: "LOADING",
    State.LOADING: "LOADING",
    State.UNLOADING: "UNLOADING",
    State.END: "UNAVAILABLE",
    State.UNKNOWN: "UNAVAILABLE",
}


def repository_index(dp: DataPlane, ready_only: bool) -> list[dict[str, Any]]:
    """Every model (and version) with its state; ``ready_only`` keeps the ``READY`` ones."""
    models = dp.models
    entries = []
    for name in sorted(models):
        entries += _index_entries(models[name])
    return [e for e in entries if e["state"] == "READY"] if ready_only else entries


def _index_entries(model: Model) -> list[dict[str, Any]]:
    if not model.versions:
        if model.unloaded:
            reason = model.reason or "unloaded"
        elif model.config_error:
            reason = model.config_error
        else:
            reason = "not loaded yet"
        return [{"name": model.name, "state": "UNAVAILABLE", "reason": reason}]
    return [
        {"name": model.name, "version": str(mv.version), "state": _INDEX_STATE[mv.state], "reason": mv.error}
        for mv in sorted(model.versions.values(), key=lambda v: v.version)
    ]


def load_arguments(name: str, parameters: dict[str, Any]) -> tuple[Any, dict[str, bytes] | None]:
    """A load's ``config`` (Triton's JSON model configuration) and ``file:<path>`` files.

    Over HTTP a file's content is base64 text, over gRPC bytes; any other
    parameter is refused by name.
    """
    config = parameters.get("config")
    if config is not None and not isinstance(config, (str, bytes)):
        raise BadRequest(f"failed to load {name!r}: the config parameter must be a string of JSON")
    files = {}
    for key, value in parameters.items():
        if key == "config":
            continue
        if not key.startswith("file:"):
            raise BadRequest(f"failed to load {name!r}: unknown load parameter {key!r} (config, file:<path>)")
        files[key] = _file_content(name, key, value)
    return config, files or None


def _file_content(name: str, key: str, value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise BadRequest(f"failed to load {name!r}: {key} must hold the file's content in base64") from None
    raise BadRequest(f"failed to load {name!r}: {key} must hold the file's content (base64 over HTTP, bytes over gRPC)")


def unload_dependents(parameters: dict[str, Any]) -> bool:
    """An unload's ``unload_dependents``; servekit has no ensembles, so nothing depends on a model."""
    unknown = sorted(set(parameters) - {"unload_dependents"})
    if unknown:
        raise BadRequest(f"unknown unload parameter(s) {', '.join(unknown)} (unload_dependents)")
    value = parameters.get("unload_dependents", False)
    if not isinstance(value, bool):
        raise BadRequest(f"'unload_dependents' must be true or false, found {value!r}")
    return value


# -- statistics --------------------------------------------------------------------------------


def model_statistics(dp: DataPlane, name: str | None, version: str | None) -> list[dict[str, Any]]:
    """Triton's ``model_stats`` list: every model, one model's versions, or one version.

    The versions listed are those this worker knows (loaded or failed); a
    version named explicitly must be one of them.
    """
    if version and not name:
        raise BadRequest("a version needs a model name")
    names = [name] if name else dp.model_names()
    keys: list[tuple[str, str]] = []
    for model_name in names:
        model = dp.model(model_name)  # NotFound for an unknown model
        known = sorted(model.versions)
        if version:
            number = version_number(version)
            if number not in known:
                raise NotFound(f"requested model version {version} of {model_name!r} is not available")
            known = [number]
        keys += [(model_name, str(v)) for v in known]
    totals = statistics.snapshot()
    return [_model_stats(n, v, totals.get((n, v), statistics.ModelStats())) for n, v in keys]


def _model_stats(name: str, version: str, stats: statistics.ModelStats) -> dict[str, Any]:
    def duration(kind: str) -> dict[str, int]:
        return {"count": stats.counts.get(kind, 0), "ns": stats.ns.get(kind, 0)}

    return {
        "name": name,
        "version": version,
        "last_inference": stats.last_inference,
        "inference_count": stats.inference_count,
        "execution_count": stats.execution_count,
        "inference_stats": {kind: duration(kind) for kind in statistics.DURATIONS},
        "batch_stats": [_batch_stats(rows, *stats.batches[rows]) for rows in sorted(stats.batches)],
        "memory_usage": [],
    }


def _batch_stats(rows: int, count: int, ns: int) -> dict[str, Any]:
    # servekit times pre- and postprocessing per request, not per call
    zero = {"count": count, "ns": 0}
    return {
        "batch_size": rows,
        "compute_input": zero,
        "compute_infer": {"count": count, "ns": ns},
        "compute_output": zero,
    }


# -- model configuration ---------------------------------------------------------------------

#: V2 datatypes as Triton's model configuration spells them.
CONFIG_TYPES = {
    "BOOL": "TYPE_BOOL",
    "UINT8": "TYPE_UINT8",
    "UINT16": "TYPE_UINT16",
    "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64",
    "INT8": "TYPE_INT8",
    "INT16": "TYPE_INT16",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "FP16": "TYPE_FP16",
    "FP32": "TYPE_FP32",
    "FP64": "TYPE_FP64",
    "BYTES": "TYPE_STRING",
    "BF16": "TYPE_BF16",
}


def model_configuration(dp: DataPlane, name: str, version: str | None) -> dict[str, Any]:
    """Triton's model configuration of a served model version (the latest when none is named).

    The folder's ``config.pbtxt``, when it has one, is the document: every field
    it holds is answered. servekit lays over it what it decides itself: the
    model's name, ``version_policy``, ``max_batch_size`` and ``dynamic_batching``
    while it batches the model, ``sequence_batching`` (with its idle time) for a
    sequence model only; ``input`` and ``output`` come from the model's metadata when the file
    lists none. With a batch dimension (``max_batch_size`` above 0) ``dims``
    leave it out, as Triton's do.
    """
    mv = dp.resolve(name, version_number(version))
    config: ModelConfig = mv.config
    base = triton_model_config.of_version(mv) or {}
    batch = triton_model_config.batch_size(mv)
    signature = mv.metadata.signature()
    if "platform" in base or "backend" in base:
        platform, backend = str(base.get("platform", "")), str(base.get("backend", ""))
    else:
        platform = mv.metadata.platform
        backend = platform or "python"
    inputs = base.get("input") or [_tensor(t, batch, with_format=True) for t in (signature.inputs if signature else [])]
    outputs = base.get("output") or [_tensor(t, batch) for t in (signature.outputs if signature else [])]
    document: dict[str, Any] = {
        "name": name,
        "platform": platform,
        "backend": backend,
        "version_policy": version_policy(config.version_policy),
        "max_batch_size": batch,
        "input": [{"data_type": "TYPE_INVALID", "format": "FORMAT_NONE", "dims": [], **t} for t in inputs],
        "output": [{"data_type": "TYPE_INVALID", "dims": [], **t} for t in outputs],
    }
    document.update((key, value) for key, value in base.items() if key not in document)
    # how requests are scheduled is servekit's to say: its batching, its sequences
    document.pop("dynamic_batching", None)
    if config.sequence is None:
        document.pop("sequence_batching", None)
    scheduled = "sequence_batching" in document or "ensemble_scheduling" in document
    if config.batching.max_batch_size > 1 and not scheduled:
        delay_us = int(config.batching.max_batch_time_ms * 1000)
        document["dynamic_batching"] = {**base.get("dynamic_batching", {}), "max_queue_delay_microseconds": delay_us}
    if config.sequence is not None and "ensemble_scheduling" not in document:
        idle_us = int(config.sequence.max_idle_ms * 1000)
        document["sequence_batching"] = {**base.get("sequence_batching", {}), "max_sequence_idle_microseconds": idle_us}
    return document


def version_policy(policy: Any) -> dict[str, Any]:
    if policy == "all":
        return {"all": {}}
    if policy == "latest":
        return {"latest": {"num_versions": 1}}
    ((kind, value),) = policy.items()
    if kind == "latest":
        n = value["num_versions"] if isinstance(value, dict) else value  # checked by check_version_policy
        return {"latest": {"num_versions": int(n)}}
    versions = value["versions"] if isinstance(value, dict) else value
    return {"specific": {"versions": [int(v) for v in versions]}}


def _tensor(spec: TensorSpec, batch: int, *, with_format: bool = False) -> dict[str, Any]:
    dims = [-1] if spec.shape is None else list(spec.shape)
    if batch > 0 and spec.shape:
        dims = dims[1:]
    out: dict[str, Any] = {
        "name": spec.name,
        "data_type": CONFIG_TYPES.get(spec.datatype, "TYPE_INVALID"),
        "dims": dims,
    }
    if with_format:
        out["format"] = image_format(dims)
    return out


def image_format(dims: list[int]) -> str:
    """NHWC or NCHW for an image-shaped input (3 dims, 1 or 3 channels), else none."""
    if len(dims) == 3:
        if dims[2] in (1, 3) and dims[0] not in (1, 3):
            return "FORMAT_NHWC"
        if dims[0] in (1, 3) and dims[2] not in (1, 3):
            return "FORMAT_NCHW"
    return "FORMAT_NONE"
