"""TensorFlow Serving's REST API (V1): status, metadata, predict, classify, regress, explain.

``/v1/models/NAME[/versions/V|/labels/L][/metadata]`` and
``POST /v1/models/NAME[/versions/V|/labels/L]:(predict|classify|regress|explain)``,
answered as ``tensorflow_model_server`` answers them.
"""

from __future__ import annotations

import re
from typing import Any

from flask import Blueprint, Response, request

from servekit.codecs import tf_json
from servekit.dataplane.data_plane import DataPlane, check_inputs
from servekit.errors import BadRequest, NotFound
from servekit.observability import tracing
from servekit.protocols import tf_documents as documents
from servekit.protocols.http import (
    Answer,
    check_fields,
    dataplane,
    json_answer,
    json_response,
    parameters_of,
    parse_json_object,
    stream_requested,
)
from servekit.protocols.streaming import predict_answer

bp = Blueprint("v1", __name__)

_TARGET = re.compile(
    r"^(?P<name>[^/:]+)(?:/versions/(?P<version>\d+)|/labels/(?P<label>[^/:]+))?"
    r":(?P<verb>predict|classify|regress|explain)$"
)
#: a target below a version that is no number, or with a verb TF Serving does not have: its
#: 400 "Malformed request" (a name or label holding an encoded ``/`` is a 404: TF Serving,
#: which does not decode the path, looks it up and does not find it)
_TARGET_SHAPE = re.compile(r"^[^/:]+(?:/versions/.*|(?:/labels/[^/:]+)?:[^/:]*)$")
#: a GET below a version whose segment is no number: TF Serving's 400 too
_VERSION_SHAPE = re.compile(r"^[^/:]+/versions/(?!\d+(?:/metadata)?$)")
#: the members each verb's body takes: TF Serving's (``signature_name`` and the inputs or
#: examples) and servekit's ``parameters`` (handed to the model) and ``stream`` (predict);
#: any other is refused, naming it
VERB_FIELDS = {
    "predict": ("signature_name", "instances", "inputs", "parameters", "stream"),
    "explain": ("signature_name", "instances", "inputs", "parameters"),
    "classify": ("signature_name", "context", "examples", "parameters"),
    "regress": ("signature_name", "context", "examples", "parameters"),
}
EXPECTED_GET = "expected GET /v1/models/NAME[/versions/V|/labels/L][/metadata], V a number"
EXPECTED_POST = "expected POST /v1/models/NAME[/versions/V|/labels/L]:(predict|classify|regress|explain), V a number"


# -- status and metadata ----------------------------------------------------------


def check_get_path(name: str, label: str | None = None, version: str | None = None) -> None:
    """TF Serving's GET paths take no ``:verb`` (``GET /v1/models/iris:predict`` is its 400)
    and a version that is a number (``/versions/abc`` is the same 400: its path pattern
    does not match, as on every V1 route)."""
    if ":" in name or (label is not None and ":" in label):
        raise BadRequest(malformed_get() + " (:predict, :classify, :regress and :explain take POST)")
    if version is not None and not (version.isascii() and version.isdigit()):
        raise BadRequest(f"{malformed_get()}; {EXPECTED_GET}")


def malformed_get() -> str:
    return f"Malformed request: GET {request.path}"


@bp.get("/v1/models/<name>")
@bp.get("/v1/models/<name>/versions/<version>")
@bp.get("/v1/models/<name>/labels/<label>")
def status(name: str, version: str | None = None, label: str | None = None):
    check_get_path(name, label, version)
    return json_response(documents.model_status(dataplane(), name, version, label))


@bp.get("/v1/models/<path:target>")
def malformed(target: str):
    """Any other GET below ``/v1/models/``, an encoded ``/`` inside a name or label included.

    The WSGI server decodes ``%2F`` before routing, so ``..%2F..%2Fetc`` arrives
    as ``../../etc``; without this rule it would reach the ``POST`` rule and
    answer 405.  No model or label has a ``/`` in its name: 404 (TF Serving, which does not
    decode the path, looks the name up and does not find it).  A version is a number, so
    ``/versions/../1`` is TF Serving's 400, as every malformed version is.
    """
    if _VERSION_SHAPE.match(target):
        raise BadRequest(f"{malformed_get()}; {EXPECTED_GET}")
    raise NotFound(f"{malformed_get()}; {EXPECTED_GET}")


@bp.get("/v1/models/<name>/metadata")
@bp.get("/v1/models/<name>/versions/<version>/metadata")
@bp.get("/v1/models/<name>/labels/<label>/metadata")
def metadata(name: str, version: str | None = None, label: str | None = None):
    check_get_path(name, label, version)
    dp = dataplane()
    mv = dp.resolve(name, version, label)
    return json_response(documents.metadata_json(mv, dp.metadata(mv)))


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
        malformed = f"Malformed request: POST /v1/models/{target}; {EXPECTED_POST}"
        raise BadRequest(malformed) if _TARGET_SHAPE.match(target) else NotFound(malformed)
    body = parse_json_object(raw)
    verb = match["verb"]
    mv = dp.resolve(match["name"], match["version"], match["label"])
    check_fields(body, VERB_FIELDS[verb], f":{verb}")
    signature = signature_name(body)
    parameters = parameters_of(body)
    if verb in ("classify", "regress"):
        examples = tf_json.decode_examples(body)
        if verb == "classify":
            results = dp.classify(mv, examples, parameters=parameters, signature_name=signature)
            return json_answer({"results": [[[str(label), float(score)] for label, score in r] for r in results]})
        results = dp.regress(mv, examples, parameters=parameters, signature_name=signature)
        return json_answer({"results": [float(v) for v in results]})
    with tracing.span("servekit.decode"):
        inputs, row_format = tf_json.decode_predict_request(body)
    check_declared_shapes(mv, inputs, signature)
    if verb == "explain":
        explanations = dp.explain(mv, inputs, parameters=parameters, signature_name=signature)
        return json_answer(tf_json.encode_explain_response(explanations, row_format))
    outputs = dp.predict(mv, inputs, parameters=parameters, signature_name=signature)
    with tracing.span("servekit.encode"):  # a stream's items encode as it is sent, under the request's span
        return predict_answer(outputs, row_format, stream_requested(body, stream_query))


def check_declared_shapes(mv: Any, inputs: Any, signature: str | None) -> None:
    """The 400 V2 answers for a shape the model's metadata rules out (``-1``: any size).

    Rows of one tensor (``"instances": [[...], ...]``) arrive as one array: it is
    the signature's input when the signature declares exactly one.  A TensorFlow
    model is not held to its signature, as TF Serving does not hold it (nor does
    servekit's gRPC ``Predict``): a SavedModel may take shapes its signature does
    not say, and TF Serving's clients send them.
    """
    if mv.metadata.platform == "tensorflow":
        return
    if not isinstance(inputs, dict):
        declared = mv.metadata.signature(signature)
        if declared is None or len(declared.inputs) != 1:
            return
        inputs = {declared.inputs[0].name: inputs}
    check_inputs(mv, inputs, signature)


def signature_name(body: dict[str, Any]) -> str | None:
    name = body.get("signature_name")
    if name is not None and not isinstance(name, str):
        raise BadRequest(f"'signature_name' must be a string, found {type(name).__name__}")
    return name or None
