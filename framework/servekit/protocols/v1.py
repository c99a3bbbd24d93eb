"""TensorFlow Serving's REST API (V1): status, metadata, predict, classify, regress, explain.

``/v1/models/NAME[/versions/V|/labels/L][/metadata]`` and
``POST /v1/models/NAME[/versions/V|/labels/L]:(predict|classify|regress|explain)``,
answered as ``tensorflow_model_server`` answers them.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
from flask import Blueprint, Response, request

from ..codecs import json as jsonc
from ..codecs import tf_json
from ..codecs.dtypes import V2_TO_TF
from ..dataplane import DataPlane, join_stream
from ..errors import BadRequest, ModelFailure, NotFound
from ..repository import ModelVersion
from ..types import ModelMetadata, Signature, TensorSpec
from .http import (
    Answer,
    dataplane,
    json_answer,
    json_response,
    parameters_of,
    parse_json_object,
    stream_requested,
)
from .streaming import log_headers, prediction_log_id, request_log_id, sse_predict

bp = Blueprint("v1", __name__)

_TARGET = re.compile(
    r"^(?P<name>[^/:]+)(?:/versions/(?P<version>\d+)|/labels/(?P<label>[^/:]+))?"
    r":(?P<verb>predict|classify|regress|explain)$"
)


# -- status and metadata ----------------------------------------------------------


def version_status(mv: ModelVersion) -> dict[str, Any]:
    return {
        "version": str(mv.version),
        "state": mv.state.value,
        "status": {"error_code": "UNKNOWN" if mv.error else "OK", "error_message": mv.error},
    }


def model_status(name: str, version: str | None = None, label: str | None = None) -> dict[str, Any]:
    """One document every client of the path reads: TF Serving, KServe V1 and OpenAI."""
    statuses = dataplane().repository.statuses(name, version, label)
    return {
        # KServe V1's model readiness ({"name", "ready"}), as its InferenceRESTClient reads it
        "name": name,
        "ready": any(mv.ready for mv in statuses),
        # OpenAI's model object, so OpenAI clients read the same route
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": "servekit",
        "model_version_status": [version_status(mv) for mv in statuses],
    }


def check_get_path(name: str, label: str | None = None) -> None:
    """TF Serving's GET paths take no ``:verb``: ``GET /v1/models/iris:predict`` is its 400."""
    if ":" in name or (label is not None and ":" in label):
        raise BadRequest(malformed_get() + " (:predict, :classify, :regress and :explain take POST)")


def malformed_get() -> str:
    return f"Malformed request: GET {request.path}"


@bp.get("/v1/models/<name>")
@bp.get("/v1/models/<name>/versions/<version>")
@bp.get("/v1/models/<name>/labels/<label>")
def status(name: str, version: str | None = None, label: str | None = None):
    check_get_path(name, label)
    return json_response(model_status(name, version, label))


@bp.get("/v1/models/<path:target>")
def malformed(target: str):
    """Any other GET below ``/v1/models/``, an encoded ``/`` inside a name or label included.

    The WSGI server decodes ``%2F`` before routing, so ``..%2F..%2Fetc`` arrives
    as ``../../etc``; without this rule it would reach the ``POST`` rule and
    answer 405.  No model, version or label has a ``/`` in its name: 404.
    """
    raise NotFound(malformed_get() + "; expected GET /v1/models/NAME[/versions/V|/labels/L][/metadata]")


def tensor_info(spec: TensorSpec) -> dict[str, Any]:
    if spec.shape is None:
        shape: dict[str, Any] = {"dim": [], "unknown_rank": True}
    else:
        shape = {"dim": [{"size": str(d), "name": ""} for d in spec.shape], "unknown_rank": False}
    return {
        "dtype": V2_TO_TF.get(spec.datatype, "DT_INVALID"),
        "tensor_shape": shape,
        "name": spec.tensor_name if spec.tensor_name is not None else spec.name,
    }


def signature_def(signature: Signature) -> dict[str, Any]:
    out: dict[str, Any] = {
        "inputs": {t.name: tensor_info(t) for t in signature.inputs},
        "outputs": {t.name: tensor_info(t) for t in signature.outputs},
        "method_name": signature.method_name,
    }
    if signature.defaults is not None:
        out["defaults"] = signature.defaults
    return out


def metadata_json(mv: ModelVersion, meta: ModelMetadata) -> dict[str, Any]:
    """TF Serving's GetModelMetadataResponse as JSON."""
    return {
        "model_spec": {"name": mv.name, "signature_name": "", "version": str(mv.version)},
        "metadata": {
            "signature_def": {
                "signature_def": {name: signature_def(sig) for name, sig in meta.signatures.items()}
            }
        },
    }


@bp.get("/v1/models/<name>/metadata")
@bp.get("/v1/models/<name>/versions/<version>/metadata")
@bp.get("/v1/models/<name>/labels/<label>/metadata")
def metadata(name: str, version: str | None = None, label: str | None = None):
    check_get_path(name, label)
    dp = dataplane()
    mv = dp.resolve(name, version, label)
    return json_response(metadata_json(mv, dp.metadata(mv)))


# -- inference ----------------------------------------------------------------------


@bp.post("/v1/models/<path:target>")
def infer(target: str):
    answer = infer_answer(dataplane(), target, request.get_data(cache=False), request.args.get("stream"))
    return answer.response() if isinstance(answer, Answer) else answer


def infer_answer(dp: DataPlane, target: str, raw: bytes, stream_query: str | None) -> Answer | Response:
    """``:predict|classify|regress|explain`` from the raw body (Flask and the fast lane).

    A streamed predict answers with an SSE :class:`Response`, itself a WSGI app.
    """
    match = _TARGET.match(target)
    if match is None:
        raise NotFound(
            f"Malformed request: POST /v1/models/{target}; expected "
            "/v1/models/NAME[/versions/V|/labels/L]:(predict|classify|regress|explain)"
        )
    body = parse_json_object(raw)
    mv = dp.resolve(match["name"], match["version"], match["label"])
    signature = signature_name(body)
    parameters = parameters_of(body)
    verb = match["verb"]
    if verb in ("classify", "regress"):
        examples = tf_json.decode_examples(body)
        if verb == "classify":
            results = dp.classify(mv, examples, parameters=parameters, signature_name=signature)
            return json_answer({"results": [[[str(label), float(score)] for label, score in r] for r in results]})
        results = dp.regress(mv, examples, parameters=parameters, signature_name=signature)
        return json_answer({"results": [float(v) for v in results]})
    inputs, row_format = tf_json.decode_predict_request(body)
    if verb == "explain":
        explanations = dp.explain(mv, inputs, parameters=parameters, signature_name=signature)
        return json_answer(tf_json.encode_explain_response(explanations, row_format))
    outputs = dp.predict(mv, inputs, parameters=parameters, signature_name=signature)
    return predict_answer(outputs, row_format, stream_requested(body, stream_query, from_request=False))


def predict_answer(outputs: Any, row_format: bool, stream: bool) -> Answer | Response:
    """A predict answer: SSE when asked to stream, else TF Serving's JSON."""
    if stream:
        return sse_predict(outputs, row_format)
    if not isinstance(outputs, (dict, list)) and hasattr(outputs, "__next__"):
        outputs = _joined(list(outputs))  # a streaming model asked for a plain answer
    ids = log_headers(request_log_id(), [prediction_log_id()])
    return Answer(jsonc.dumps(tf_json.encode_predict_response(outputs, row_format)), headers=ids)


def _joined(items: list[Any]) -> Any:
    """Tensor items joined along the first axis, as V2 and gRPC answer; anything else as a list."""
    if items and all(isinstance(i, dict) for i in items):
        try:
            return join_stream(items)
        except ModelFailure:
            return items
    if items and all(isinstance(i, (np.ndarray, np.generic, int, float)) for i in items):
        return np.concatenate([np.atleast_1d(i) for i in items])
    return items


def signature_name(body: dict[str, Any]) -> str | None:
    name = body.get("signature_name")
    if name is not None and not isinstance(name, str):
        raise BadRequest(f"'signature_name' must be a string, found {type(name).__name__}")
    return name or None
