"""The fast lane: inference requests answered without Flask's request machinery.

Flask's request and response objects, its URL routing and its before/after
hooks cost more than half of a small request (docs/performance.md).  The fast
lane is a plain WSGI callable in front of the Flask app: for ``POST`` on V2
``.../infer``, V1 ``/v1/models/...:predict|classify|regress|explain`` and the
generic ``/predict`` it reads the body once and calls the very function the
Flask route calls (:func:`servekit.protocols.v2.infer_answer`,
:func:`servekit.protocols.v1.infer_answer`,
:func:`servekit.protocols.generic.predict_answer`), then writes the
:class:`~servekit.protocols.http.Answer`'s bytes.  There is no second
implementation: decoding, the data plane and encoding are shared, errors render
through :func:`servekit.errors.render` as Flask's handler renders them.

What wraps every request stays around the fast lane: the limits (size, gzip,
backpressure, timeout) and the observability layer (request id, metrics, access
log) are WSGI layers outside it; the API key is checked here with the same
:class:`~servekit.server.auth.ApiKey` Flask uses.  The fast lane steps aside, and Flask
answers, whenever the app has more than servekit's own hooks: a plugin that adds
``before_request``/``after_request`` functions or routes that shadow these
paths, or any ``log_request`` implementation (the request log's hooks read
Flask's request).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs

from flask import Flask
from werkzeug.exceptions import HTTPException

from servekit.codecs import json as jsonc
from servekit.codecs.v2 import HEADER_LENGTH
from servekit.dataplane.data_plane import DataPlane
from servekit.errors import ServekitError, render, retry_headers
from servekit.observability.logging import current_request_id
from servekit.protocols import generic, retrieval, v1, v2
from servekit.protocols.http import Answer
from servekit.routes import GENERIC_PREDICT, V1_TARGET, V2_INFER
from servekit.server.auth import ApiKey

log = logging.getLogger("servekit.fastlane")

#: The Flask endpoints whose work the fast lane does; a path Flask routes elsewhere is left to Flask.
ENDPOINTS = frozenset({"v2.infer", "v1.infer", "generic.predict"})
_HEADER_LENGTH_KEY = "HTTP_" + HEADER_LENGTH.upper().replace("-", "_")
_STATUS = {s.value: f"{s.value} {s.phrase}" for s in HTTPStatus}
_ROUTE_CACHE_SIZE = 4096


class FastLane:
    """WSGI: the inference routes straight to the protocol functions; everything else to Flask."""

    def __init__(self, app: Flask, dataplane: DataPlane, api_key: ApiKey | None = None):
        self.app = app
        self.flask = app.wsgi_app
        self.dp = dataplane
        self.api_key = api_key
        self._routes: dict[str, Callable[[dict, str, bytes], Any] | None] = {}
        self._usable: bool | None = None  # decided at the first request, after plugins added routes

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") != "POST" or not self._enabled():
            return self.flask(environ, start_response)
        path = environ.get("PATH_INFO", "")
        handler = self._handler(path)
        if handler is None:
            return self.flask(environ, start_response)
        answer = self._answer(environ, path, handler)
        if not isinstance(answer, Answer):  # a streamed answer: a werkzeug Response, itself WSGI
            return answer(environ, start_response)
        headers = [("Content-Type", answer.content_type), ("Content-Length", str(len(answer.body)))]
        headers += answer.headers.items()
        start_response(_STATUS.get(answer.status) or str(answer.status), headers)
        return [answer.body]

    def _answer(self, environ: dict, path: str, handler: Callable[[dict, str, bytes], Any]) -> Any:
        token = current_request_id.set(environ.get("servekit.request_id") or "")
        try:
            if self.api_key is not None:
                self.api_key.check(path, environ.get("HTTP_AUTHORIZATION"))
            return handler(environ, path, read_body(environ))
        except ServekitError as exc:
            return Answer(jsonc.dumps(render(exc, path)), exc.status, headers=retry_headers(exc))
        except Exception as exc:
            log.exception("unhandled error on POST %s", path)
            error = ServekitError(f"internal server error ({type(exc).__name__})")
            return Answer(jsonc.dumps(render(error, path)), 500)
        finally:
            current_request_id.reset(token)

    # -- which requests take the lane ----------------------------------------------------

    def _enabled(self) -> bool:
        if self._usable is None:  # plugins registered their hooks and routes before the first request
            foreign = foreign_request_hooks(self.app)
            if self.dp.plugins.hook.log_request.get_hookimpls():
                foreign.append("log_request")
            self._usable = not foreign
            if foreign:
                log.info("fast lane off: the app has request hooks it cannot run (%s)", ", ".join(foreign))
        return self._usable

    def _handler(self, path: str) -> Callable[[dict, str, bytes], Any] | None:
        try:
            return self._routes[path]
        except KeyError:
            pass
        handler = self._match(path)
        if len(self._routes) < _ROUTE_CACHE_SIZE:
            self._routes[path] = handler
        return handler

    def _match(self, path: str) -> Callable[[dict, str, bytes], Any] | None:
        """The handler for ``path``, only where Flask itself would route it to the same view."""
        try:
            endpoint, _ = self.app.url_map.bind("localhost").match(path, "POST")
        except HTTPException:
            return None
        if endpoint not in ENDPOINTS:
            return None
        if (m := V2_INFER.match(path)) is not None:
            name, version = m["name"], m["version"]
            return lambda environ, _path, body: v2.infer_answer(
                self.dp, name, version, body, environ.get(_HEADER_LENGTH_KEY), explain=False
            )
        if (m := V1_TARGET.match(path)) is not None:
            target = m["target"]
            return lambda environ, _path, body: v1.infer_answer(self.dp, target, body, stream_query(environ))
        if path == GENERIC_PREDICT:
            return lambda environ, _path, body: generic.predict_answer(
                self.dp, body, stream_query(environ), retrieval.predict_answer
            )
        return None


def foreign_request_hooks(app: Flask) -> list[str]:
    """Request hooks on the inference blueprints (or the app) that servekit did not install."""
    own = app.extensions.get("servekit.request_hooks", set())
    found = []
    for registry in (app.before_request_funcs, app.after_request_funcs, app.url_value_preprocessors):
        for scope in (None, "v1", "v2", "generic"):
            found += [f.__qualname__ for f in registry.get(scope, []) if f not in own]
    return found


def read_body(environ: dict) -> bytes:
    """The request body, as werkzeug reads it: by ``Content-Length``, or to the end of a chunked body."""
    stream = environ["wsgi.input"]
    length = environ.get("CONTENT_LENGTH")
    if length:
        return stream.read(int(length))
    if environ.get("wsgi.input_terminated"):
        return stream.read()
    return b""


def stream_query(environ: dict) -> str | None:
    """The ``stream`` query parameter's first value, as ``request.args.get("stream")``."""
    query = environ.get("QUERY_STRING")
    if not query or "stream" not in query:
        return None
    values = parse_qs(query, keep_blank_values=True).get("stream")
    return values[0] if values else None


def install(app: Flask, dataplane: DataPlane, api_key: ApiKey | None) -> FastLane:
    """Put the fast lane in front of ``app.wsgi_app`` (inside the limits and observability layers)."""
    lane = FastLane(app, dataplane, api_key)
    app.wsgi_app = lane  # type: ignore[method-assign]
    app.extensions["servekit.fastlane"] = lane
    return lane
