"""Helpers every HTTP protocol module shares: the data plane, bodies and JSON responses."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flask import Response, current_app, request

from servekit.codecs import json as jsonc
from servekit.dataplane.data_plane import DataPlane
from servekit.errors import BadRequest

JSON = "application/json"


@dataclass
class Answer:
    """A protocol's whole answer as bytes: what a Flask route and the fast lane both send.

    Handlers that build an :class:`Answer` take plain values (the body bytes, the
    path's parts) instead of reading Flask's ``request``, so the same function
    answers under Flask and under :mod:`servekit.server.fastlane`.
    """

    body: bytes
    status: int = 200
    content_type: str = JSON
    headers: dict[str, str] = field(default_factory=dict)

    def response(self) -> Response:
        return Response(self.body, status=self.status, content_type=self.content_type, headers=self.headers)


def json_answer(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Answer:
    return Answer(jsonc.dumps(payload), status, JSON, headers or {})


def dataplane() -> DataPlane:
    return current_app.extensions["servekit"]


def control() -> Any:
    """The app's :class:`servekit.control.ControlPlane`: model load, unload, config reload."""
    return current_app.extensions["servekit.control"]


def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(jsonc.dumps(payload), status=status, mimetype=JSON, headers=headers)


def json_body() -> Any:
    """The request body parsed as JSON; an empty or malformed body is a 400."""
    return parse_json(request.get_data(cache=False))


def parse_json(body: bytes) -> Any:
    if not body:
        raise BadRequest("request body is empty; expected a JSON object")
    return jsonc.loads(body)


def json_object() -> dict[str, Any]:
    return parse_json_object(request.get_data(cache=False))


def parse_json_object(body: bytes) -> dict[str, Any]:
    doc = parse_json(body)
    if not isinstance(doc, dict):
        raise BadRequest("request body must be a JSON object")
    return doc


def stream_requested(body: dict[str, Any], query: str | None) -> bool:
    """``?stream=true`` wins over a body ``"stream": true``: the query parameter takes precedence.

    ``query`` is the ``stream`` query parameter's first value (``None`` when absent).
    """
    if query is not None:
        return query.lower() in ("1", "true", "yes")
    value = body.get("stream", False)
    if not isinstance(value, bool):
        raise BadRequest(f"'stream' must be true or false, found {value!r}")
    return value


def check_fields(body: dict[str, Any], known: tuple[str, ...], what: str) -> None:
    """Refuse a body member ``what`` does not take: it would be answered as if not sent."""
    for key in body:
        if key not in known:
            raise BadRequest(f"{what} does not take the field {key!r}; it takes {', '.join(known)}")


def parameters_of(body: dict[str, Any]) -> dict[str, Any]:
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise BadRequest("'parameters' must be an object")
    return parameters
