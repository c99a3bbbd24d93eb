"""Generic single-model paths (Deeploy V1): ``POST /predict`` and ``POST /explain``.

``{"instances": ...}`` in, ``{"predictions": ...}`` / ``{"explanations": ...}`` out,
against the one served model (or the one named with ``--model-name``).
"""

from __future__ import annotations

from flask import Blueprint

from ..codecs import tf_json
from ..errors import BadRequest
from .http import dataplane, json_object, json_response, parameters_of, stream_requested
from .v1 import predict_response

bp = Blueprint("generic", __name__)


def _only_model():
    dp = dataplane()
    names = dp.model_names()
    if len(names) != 1:
        raise BadRequest(
            f"/predict and /explain need exactly one served model, found {len(names)}; "
            "use /v1/models/NAME:predict"
        )
    return dp, dp.resolve(names[0])


def _decode(body):
    if "instances" not in body:
        raise BadRequest("request has no 'instances'; expected {\"instances\": [...]}")
    return tf_json.decode_instances(body["instances"])


@bp.post("/predict")
def predict():
    body = json_object()
    dp, mv = _only_model()
    outputs = dp.predict(mv, _decode(body), parameters=parameters_of(body))
    return predict_response(outputs, True, stream_requested(body))


@bp.post("/explain")
def explain():
    body = json_object()
    dp, mv = _only_model()
    explanations = dp.explain(mv, _decode(body), parameters=parameters_of(body))
    return json_response(tf_json.encode_explain_response(explanations, True))
