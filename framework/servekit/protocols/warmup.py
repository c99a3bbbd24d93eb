"""Warm-up: sample requests a version answers before it takes traffic.

A version is AVAILABLE only once its warm-up has succeeded, so the first real
requests do not pay for lazy initialisation (TensorFlow's graph tracing, CUDA
kernels, caches); while a new version warms up, the version it replaces keeps
serving.  A failing warm-up fails the load: state END, with the request that
failed in the reason.  The requests come from:

- ``warmup:`` in ``servekit.yaml``: ``{v1: body}`` (a TF Serving REST predict
  body), ``{v2: body}`` (a V2 infer body) or ``{file: path}`` (such a body in a
  JSON file beside the version), each with an optional ``count``;
- a SavedModel's ``assets.extra/tf_serving_warmup_requests`` (TF Serving's
  TFRecord file of ``PredictionLog`` records), run as TF Serving runs it;
- Triton's ``model_warmup`` in a load's configuration (mapped onto the first).

Requests run through the data plane as protocols run them, so a version in a
model host warms the host.
"""

from __future__ import annotations

import json
import logging
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from servekit.codecs import tensor_proto, tf_json
from servekit.codecs import v2 as v2_codec
from servekit.codecs.json import dumps
from servekit.dataplane.data_plane import DataPlane
from servekit.dataplane.repository import ModelVersion

log = logging.getLogger("servekit.warmup")

#: TF Serving's warm-up file, inside a SavedModel version folder.
TF_SERVING_FILE = Path("assets.extra") / "tf_serving_warmup_requests"
#: TF Serving reads at most this many records (its kMaxNumRecords).
MAX_RECORDS = 1000


class Warmer:
    """Runs a loading version's warm-up; set as the repository's ``warm``."""

    def __init__(self, dataplane: DataPlane):
        self.dataplane = dataplane

    def __call__(self, mv: ModelVersion) -> None:
        started, count = time.perf_counter(), 0
        for where, run in requests_of(mv):
            try:
                run(self.dataplane, mv)
            except Exception as exc:
                raise RuntimeError(f"warm-up {where} failed: {_reason(exc)}") from exc
            count += 1
        if count:
            log.info(
                "warmed up %s version %d: %d request(s) in %.2fs",
                mv.name,
                mv.version,
                count,
                time.perf_counter() - started,
            )


def _reason(exc: Exception) -> str:
    return getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"


def requests_of(mv: ModelVersion) -> Iterator[tuple[str, Any]]:
    """``(where, run)`` for every warm-up request of ``mv``, in order."""
    for i, item in enumerate(mv.config.warmup):
        kind, body = item["kind"], item["body"]
        if kind == "file":
            kind, body = _read_file(mv.path, body)
        run = _v1 if kind == "v1" else _v2
        for n in range(item["count"]):
            yield f"request {i + 1} ({kind}, run {n + 1})", _bound(run, body)
    tf_file = mv.path / TF_SERVING_FILE
    if tf_file.is_file():
        for i, record in enumerate(tf_records(tf_file)):
            yield f"record {i + 1} of {TF_SERVING_FILE}", _bound(_tf_record, record)


def _bound(run: Any, body: Any) -> Any:
    return lambda dp, mv: run(dp, mv, body)


def _read_file(folder: Path, name: str) -> tuple[str, dict[str, Any]]:
    path = (folder / name).resolve()
    if folder.resolve() not in path.parents:
        raise RuntimeError(f"warm-up file {name!r} is outside the version folder")
    try:
        body = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"warm-up file {name!r} cannot be read as JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RuntimeError(f"warm-up file {name!r} must hold a request object")
    is_v2 = isinstance(body.get("inputs"), list) and all(
        isinstance(t, dict) and "datatype" in t for t in body["inputs"]
    )
    return ("v2" if is_v2 else "v1"), body


def _v1(dp: DataPlane, mv: ModelVersion, body: dict[str, Any]) -> None:
    inputs, _ = tf_json.decode_predict_request(body)
    _drain(dp.predict(mv, inputs, parameters=body.get("parameters"), signature_name=body.get("signature_name")))


def _v2(dp: DataPlane, mv: ModelVersion, body: dict[str, Any]) -> None:
    dp.infer(mv, v2_codec.decode_infer_request(dumps(body)))


def _tf_record(dp: DataPlane, mv: ModelVersion, record: bytes) -> None:
    from servekit.protocols.grpc.protos.tensorflow_serving.apis import prediction_log_pb2

    entry = prediction_log_pb2.PredictionLog.FromString(record)
    if entry.WhichOneof("log_type") != "predict_log":
        raise RuntimeError("only PredictLog records are supported (classify, regress and multi-inference are not)")
    request = entry.predict_log.request
    inputs = {name: tensor_proto.to_numpy(t, f"input {name!r}") for name, t in request.inputs.items()}
    outputs = dp.predict(
        mv,
        inputs,
        signature_name=request.model_spec.signature_name or None,
        output_names=list(request.output_filter) or None,
    )
    _drain(outputs)


def _drain(outputs: Any) -> None:
    """A streamed answer is read to its end, as a client would."""
    if hasattr(outputs, "__next__"):
        for _ in outputs:
            pass


def tf_records(path: Path) -> Iterator[bytes]:
    """The records of a TFRecord file: each a little-endian length, its CRC, the data, its CRC.

    The CRCs (masked CRC32C) are not checked; a truncated file is an error.
    """
    with path.open("rb") as handle:
        for _ in range(MAX_RECORDS):
            header = handle.read(12)
            if not header:
                return
            if len(header) < 12:
                raise RuntimeError(f"{path.name}: truncated record header")
            (length,) = struct.unpack("<Q", header[:8])
            data = handle.read(length)
            if len(data) < length or len(handle.read(4)) < 4:
                raise RuntimeError(f"{path.name}: truncated record")
            yield data
