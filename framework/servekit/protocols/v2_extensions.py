"""Triton's statistics and model configuration extensions of the V2 protocol, over HTTP.

- ``GET /v2/models/stats``, ``/v2/models/NAME/stats`` and
  ``/v2/models/NAME/versions/V/stats``: counts and cumulative nanoseconds per
  model version (:mod:`servekit.statistics` says what each one measures and how
  the gunicorn workers' numbers are summed).
- ``GET /v2/models/NAME[/versions/V]/config``: a Triton-shaped model
  configuration derived from the model's metadata and ``servekit.yaml``.

tritonclient's ``get_inference_statistics`` and ``get_model_config`` call these
(Triton's example clients do after inferring), and gRPC's ``ModelStatistics`` and
``ModelConfig`` answer the same documents (:mod:`.grpc.v2`), built here.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint

from .. import statistics
from ..dataplane import DataPlane
from ..errors import BadRequest, NotFound
from ..types import ModelConfig, TensorSpec
from .http import dataplane, json_response

bp = Blueprint("v2_extensions", __name__)

#: The extension names ``GET /v2`` and gRPC ``ServerMetadata`` add for this module.
EXTENSIONS = ["statistics", "model_configuration"]


# -- statistics --------------------------------------------------------------------------------


@bp.get("/v2/models/stats")
@bp.get("/v2/models/<name>/stats")
@bp.get("/v2/models/<name>/versions/<version>/stats")
def model_stats(name: str | None = None, version: str | None = None):
    return json_response({"model_stats": model_statistics(dataplane(), name, version)})


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
        model = dp.repository.get_model(model_name)  # NotFound for an unknown model
        known = sorted(model.versions)
        if version:
            number = parse_version(version)
            if number not in known:
                raise NotFound(f"requested model version {version} of {model_name!r} is not available")
            known = [number]
        keys += [(model_name, str(v)) for v in known]
    totals = statistics.snapshot()
    return [_model_stats(n, v, totals.get((n, v), statistics.ModelStats())) for n, v in keys]


def parse_version(version: str) -> int:
    if not version.isdigit() or int(version) < 1:
        raise BadRequest(f"invalid model version {version!r}: expected a positive integer")
    return int(version)


def _model_stats(name: str, version: str, stats: statistics.ModelStats) -> dict[str, Any]:
    def duration(kind: str) -> dict[str, int]:
        return {"count": stats.counts.get(kind, 0), "ns": stats.ns.get(kind, 0)}

    return {
        "name": name,
        "version": version,
        "last_inference": stats.last_inference,
        "inference_count": stats.inference_count,
        "execution_count": stats.execution_count,
        "inference_stats": {
            **{kind: duration(kind) for kind in statistics.DURATIONS},
            "cache_hit": {"count": 0, "ns": 0},
            "cache_miss": {"count": 0, "ns": 0},
        },
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
    "BOOL": "TYPE_BOOL", "UINT8": "TYPE_UINT8", "UINT16": "TYPE_UINT16", "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64", "INT8": "TYPE_INT8", "INT16": "TYPE_INT16", "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64", "FP16": "TYPE_FP16", "FP32": "TYPE_FP32", "FP64": "TYPE_FP64",
    "BYTES": "TYPE_STRING", "BF16": "TYPE_BF16",
}


@bp.get("/v2/models/<name>/config")
@bp.get("/v2/models/<name>/versions/<version>/config")
def model_config(name: str, version: str | None = None):
    return json_response(model_configuration(dataplane(), name, version))


def model_configuration(dp: DataPlane, name: str, version: str | None) -> dict[str, Any]:
    """Triton's model configuration of a served model version (the latest when none is named).

    ``max_batch_size`` is the model's adaptive batching size (0: off); with
    batching on, ``dims`` leave out the batch dimension, as Triton's do.
    """
    mv = dp.resolve(name, parse_version(version) if version else None)
    config: ModelConfig = mv.config
    batch = max(0, config.batching.max_batch_size)
    platform = mv.metadata.platform
    signature = mv.metadata.signature()
    document: dict[str, Any] = {
        "name": name,
        "platform": platform,
        "backend": platform or "python",
        "version_policy": version_policy(config.version_policy),
        "max_batch_size": batch,
        "input": [_tensor(t, batch, with_format=True) for t in (signature.inputs if signature else [])],
        "output": [_tensor(t, batch) for t in (signature.outputs if signature else [])],
    }
    if batch > 1:
        delay_us = int(config.batching.max_batch_time_ms * 1000)
        document["dynamic_batching"] = {"max_queue_delay_microseconds": delay_us}
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

