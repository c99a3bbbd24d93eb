"""``create_app(settings)``: the Flask app with one blueprint per protocol.

State lives in ``app.extensions["servekit"]`` (the :class:`DataPlane`).  One
error handler turns every :class:`ServekitError` into ``{"error": message}``
with the error's status; nothing else a handler raises leaks a stack trace.
"""

from __future__ import annotations

import hmac
import logging

import pluggy
from flask import Flask, request
from werkzeug.exceptions import HTTPException

from .. import limits, observability, plugins
from ..dataplane import DataPlane
from ..errors import ServekitError, Unauthorized
from ..protocols import generic, health, openai, openapi, status_page, v1, v2
from ..protocols.http import json_response
from ..repository import ModelRepository, discover
from ..settings import Settings
from ..types import BatchingConfig

log = logging.getLogger("servekit.server")

#: Routes that stay open when ``--api-key`` is set (default of ``--open-paths``).
OPEN_PATHS = ("/v2/health/", "/metrics")


def build_dataplane(settings: Settings, pm: pluggy.PluginManager | None = None) -> DataPlane:
    pm = pm or plugins.build_manager(settings.plugin)
    folders = discover(settings.model_paths, settings.model_name)
    repository = ModelRepository(
        folders,
        pm,
        poll_interval=settings.poll_interval,
        batching=BatchingConfig(settings.max_batch_size, settings.max_batch_time_ms),
    )
    return DataPlane(repository, load_wait=settings.request_timeout or 60.0)


def create_app(settings: Settings | None = None, dataplane: DataPlane | None = None, start: bool = True) -> Flask:
    settings = settings or Settings()
    dp = dataplane or build_dataplane(settings)
    app = Flask("servekit")
    app.config["MAX_CONTENT_LENGTH"] = settings.max_request_size
    app.extensions["servekit"] = dp
    app.extensions["servekit.settings"] = settings

    for blueprint in (health.bp, v1.bp, v2.bp, generic.bp, openai.bp, openapi.bp, status_page.bp):
        app.register_blueprint(blueprint)
    _install_error_handlers(app)
    if settings.api_key:
        _install_api_key(app, settings.api_key, settings.open_paths)
    limits.install(app, settings)  # WSGI layers: observability outside the limits
    observability.install(app, settings)

    pm = dp.repository.pm
    pm.hook.register_routes(app=app)
    if start:
        dp.repository.start()
    pm.hook.server_started(models=dp.model_names())
    return app


def _install_error_handlers(app: Flask) -> None:
    @app.errorhandler(ServekitError)
    def servekit_error(exc: ServekitError):
        return json_response({"error": exc.message}, exc.status)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException):
        status = exc.code or 500
        if status == 413:
            limit = app.config.get("MAX_CONTENT_LENGTH")
            message = f"request body too large; the limit is {limit} bytes"
        elif status == 404:
            message = f"no route for {request.method} {request.path}"
        elif status == 405:
            message = f"method {request.method} not allowed on {request.path}"
        else:
            message = exc.description or exc.name
        if openai.is_openai_path(request.path):  # routing errors skip the blueprint's handler
            return json_response(openai.error_body(exc), status)
        return json_response({"error": message}, status)

    @app.errorhandler(Exception)
    def unexpected(exc: Exception):
        log.exception("unhandled error on %s %s", request.method, request.path)
        return json_response({"error": f"internal server error ({type(exc).__name__})"}, 500)


def is_open_path(path: str, open_paths: list[str] | tuple[str, ...]) -> bool:
    """``/x/`` opens everything under it, ``/x`` that path and below, ``/`` only the root."""
    for entry in open_paths:
        if entry == "/":
            if path == "/":
                return True
        elif entry.endswith("/"):
            if path.startswith(entry):
                return True
        elif path == entry or path.startswith(entry + "/"):
            return True
    return False


def _install_api_key(app: Flask, key: str, open_paths: list[str] | tuple[str, ...] = OPEN_PATHS) -> None:
    expected = f"Bearer {key}".encode()

    @app.before_request
    def check_api_key():
        if is_open_path(request.path, open_paths):
            return
        given = request.headers.get("Authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            raise Unauthorized("missing or wrong API key; send 'Authorization: Bearer <key>'")
        return
