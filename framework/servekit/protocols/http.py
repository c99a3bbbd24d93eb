"""Helpers every HTTP protocol module shares: the data plane, bodies and JSON responses."""

from __future__ import annotations

from typing import Any

from flask import Response, current_app, request

from ..codecs import json as jsonc
from ..dataplane import DataPlane
from ..errors import BadRequest

JSON = "application/json"


def dataplane() -> DataPlane:
    return current_app.extensions["servekit"]


def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(jsonc.dumps(payload), status=status, mimetype=JSON, headers=headers)


def json_body() -> Any:
    """The request body parsed as JSON; an empty or malformed body is a 400."""
    body = request.get_data(cache=False)
    if not body:
        raise BadRequest("request body is empty; expected a JSON object")
    return jsonc.loads(body)


def json_object() -> dict[str, Any]:
    body = json_body()
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def stream_requested(body: dict[str, Any]) -> bool:
    """``?stream=true`` wins over a body ``"stream": true`` (SPEC: query parameter precedence)."""
    query = request.args.get("stream")
    if query is not None:
        return query.lower() in ("1", "true", "yes")
    value = body.get("stream", False)
    if not isinstance(value, bool):
        raise BadRequest(f"'stream' must be true or false, found {value!r}")
    return value


def parameters_of(body: dict[str, Any]) -> dict[str, Any]:
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise BadRequest("'parameters' must be an object")
    return parameters
