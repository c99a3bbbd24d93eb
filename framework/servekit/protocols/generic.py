"""Generic single-model paths (Deeploy V1): ``POST /predict`` and ``POST /explain``.

A ``/predict`` body with TEI's ``inputs`` (and no ``instances``) is TEI's text
classification: the server hands it to :func:`servekit.protocols.retrieval.predict_answer`
(``text_predict``; protocols do not import each other).

``{"instances": ...}`` in, ``{"predictions": ...}`` / ``{"explanations": ...}`` out,
against the one served model (or the one named with ``--model-name``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import Blueprint, Response, current_app, request

from servekit.codecs import tf_json
from servekit.dataplane.data_plane import DataPlane
from servekit.dataplane.repository import ModelVersion
from servekit.errors import BadRequest
from servekit.protocols.http import (
    Answer,
    check_fields,
    dataplane,
    json_object,
    json_response,
    parameters_of,
    parse_json_object,
    stream_requested,
)
from servekit.protocols.streaming import predict_answer as answer_of

bp = Blueprint("generic", __name__)

#: ``app.extensions`` key of the handler for TEI's ``/predict`` bodies (``inputs``)
TEXT_PREDICT = "servekit.text_predict"


def _only_model(dp: DataPlane) -> ModelVersion:
    names = dp.model_names()
    if len(names) != 1:
        raise BadRequest(
            f"/predict and /explain need exactly one served model, found {len(names)}; use /v1/models/NAME:predict"
        )
    return dp.resolve(names[0])


#: the members a body takes: its rows, the model's ``parameters`` and, for predict, ``stream``
PREDICT_FIELDS = ("instances", "parameters", "stream")
EXPLAIN_FIELDS = ("instances", "parameters")


def _decode(body):
    if "instances" not in body:
        raise BadRequest("request has no 'instances'; expected {\"instances\": [...]}")
    return tf_json.decode_instances(body["instances"])


@bp.post("/predict")
def predict():
    text_predict = current_app.extensions.get(TEXT_PREDICT)
    answer = predict_answer(dataplane(), request.get_data(cache=False), request.args.get("stream"), text_predict)
    return answer.response() if isinstance(answer, Answer) else answer


def predict_answer(
    dp: DataPlane,
    raw: bytes,
    stream_query: str | None,
    text_predict: Callable[[DataPlane, dict[str, Any]], Answer] | None = None,
) -> Answer | Response:
    """``POST /predict`` from the raw body (Flask and the fast lane); TEI's body goes to ``text_predict``."""
    body = parse_json_object(raw)
    if text_predict is not None and "instances" not in body and "inputs" in body:
        return text_predict(dp, body)
    check_fields(body, PREDICT_FIELDS, "/predict")
    mv = _only_model(dp)
    outputs = dp.predict(mv, _decode(body), parameters=parameters_of(body))
    return answer_of(outputs, True, stream_requested(body, stream_query))


@bp.post("/explain")
def explain():
    body = json_object()
    check_fields(body, EXPLAIN_FIELDS, "/explain")
    dp = dataplane()
    mv = _only_model(dp)
    explanations = dp.explain(mv, _decode(body), parameters=parameters_of(body))
    return json_response(tf_json.encode_explain_response(explanations, True))
