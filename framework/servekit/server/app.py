"""``create_app(settings)``: the Flask app with one blueprint per protocol.

State lives in ``app.extensions["servekit"]`` (the :class:`DataPlane`) and
``app.extensions["servekit.control"]`` (the :class:`ControlPlane` beside it).  One
error handler turns every :class:`ServekitError` into ``{"error": message}``
with the error's status; nothing else a handler raises leaks a stack trace.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pluggy
from flask import Flask, request
from werkzeug.exceptions import HTTPException
from werkzeug.routing import Rule

from servekit import hosts, storage
from servekit.codecs import bounds
from servekit.control import ControlPlane, transport
from servekit.control.plan import Planner
from servekit.dataplane import traffic
from servekit.dataplane.data_plane import DataPlane
from servekit.dataplane.repository import ModelRepository
from servekit.dataplane.response_cache import ResponseCache
from servekit.errors import MethodNotAllowed, NotFound, PayloadTooLarge, ServekitError, render, retry_headers
from servekit.folders.layout import discover, repository_roots
from servekit.hooks import manager as plugins
from servekit.hosts.shadow_pipe import ShadowProcess
from servekit.observability import middleware as observability
from servekit.protocols import generic, health, openai, retrieval, triton_generate, v1, v2
from servekit.protocols.http import json_response
from servekit.protocols.warmup import Warmer
from servekit.server import fastlane, limits, quotas
from servekit.server.auth import ApiKey
from servekit.server.pages import openapi, status_page
from servekit.server.settings import Settings
from servekit.types import BatchingConfig

log = logging.getLogger("servekit.server")


def build_dataplane(settings: Settings, pm: pluggy.PluginManager | None = None) -> DataPlane:
    pm = pm or plugins.build_manager(settings.plugin)
    if transport.address() is None:  # no owner elsewhere: this process fills the storage cache
        storage.prepare_paths(settings.paths)
    folders = discover(settings.model_paths, settings.model_name)
    batching = BatchingConfig(settings.max_batch_size, settings.max_batch_time_ms)
    planner = Planner(
        folders,
        roots=repository_roots(settings.model_paths),
        batching=batching,
        explicit=settings.model_control_mode == "explicit",
    )
    repository = ModelRepository(
        folders, pm, poll_interval=settings.poll_interval, batching=batching, planner=planner, placement=hosts
    )
    dataplane = DataPlane(
        repository, load_wait=settings.request_timeout or 60.0, strict_readiness=settings.strict_readiness
    )
    repository.warm = Warmer(dataplane)  # a version takes traffic only after its warm-up
    return dataplane


class LazyBuilderRule(Rule):
    """Werkzeug's rule, with its URL builder made on first use.

    Werkzeug writes and compiles Python code for two URL builders per rule as the
    rule is added; servekit builds no URL from its routes, and those compiles were
    two thirds of an app's creation (70 of 105 ms for 83 rules), paid by every
    worker as it starts and by every app a test makes.
    """

    def _compile_builder(self, append_unknown: bool = True) -> Any:
        made: Any = None

        def build(rule: Rule, **values: Any) -> tuple[str, str]:
            nonlocal made
            if made is None:
                made = Rule._compile_builder(rule, append_unknown).__get__(rule, None)
            return made(**values)

        return build


def create_app(settings: Settings | None = None, dataplane: DataPlane | None = None, start: bool = True) -> Flask:
    settings = settings or Settings()
    dp = dataplane or build_dataplane(settings)
    app = Flask("servekit")
    app.url_rule_class = LazyBuilderRule
    app.config["MAX_CONTENT_LENGTH"] = settings.max_request_size
    bounds.configure(
        max_tensor_elements=settings.max_tensor_elements,
        max_request_size=settings.max_request_size,
        max_request_inputs=settings.max_request_inputs,
    )
    app.extensions["servekit"] = dp
    if settings.response_cache_bytes > 0 and dp.response_cache is None:
        dp.response_cache = ResponseCache(settings.response_cache_bytes)
        dp.repository.on_release = dp.response_cache.forget
    app.extensions["servekit.settings"] = settings
    control = ControlPlane(
        dp.repository,
        poll_interval=settings.poll_interval,
        memory_budget=settings.model_memory_budget,
        request_timeout=settings.request_timeout,
    )
    app.extensions["servekit.control"] = control
    if settings.model_memory_budget > 0:
        dp.on_demand = control.ensure  # a model the budget unloaded loads again for its request

    blueprints = (health.bp, v1.bp, v2.bp, triton_generate.bp, generic.bp, openai.bp, retrieval.bp)
    for blueprint in (*blueprints, openapi.bp, status_page.bp):
        app.register_blueprint(blueprint)
    app.extensions[generic.TEXT_PREDICT] = retrieval.predict_answer  # TEI's /predict bodies
    _install_error_handlers(app)
    api_key = ApiKey.from_settings(settings)
    if api_key is not None:
        app.extensions["servekit.api_key"] = api_key
        _install_api_key(app, api_key)
    # WSGI layers, outermost first: observability, the limits, the keys' quotas, the fast lane, Flask
    if settings.fast_lane:
        fastlane.install(app, dp, api_key)
    app.wsgi_app = _Tickets(app.wsgi_app)  # type: ignore[method-assign]
    quotas.install(app, api_key)
    limits.install(app, settings)
    observability.install(app, settings)
    _install_shadows(app, dp)

    app.extensions["servekit.request_hooks"] = _request_hooks(app)  # the fast lane runs these itself
    pm = dp.plugins
    pm.hook.register_routes(app=app)
    if start:
        control.start()
    pm.hook.server_started(models=dp.model_names())
    return app


def _install_shadows(app: Flask, dp: DataPlane) -> None:
    """``shadow:`` copies run in a process of each worker's, at idle CPU priority, and are logged
    through the request log's store (:mod:`servekit.hosts.shadow_pipe`)."""
    dp.shadows.close()  # a data plane reused by a new app: its earlier process finishes
    dp.shadows = ShadowProcess(dp.plugins, dp.repository.batching, app.extensions.get("servekit.request_log"))


def _request_hooks(app: Flask) -> set:
    registries = (app.before_request_funcs, app.after_request_funcs, app.url_value_preprocessors)
    return {f for registry in registries for funcs in registry.values() for f in funcs}


def _install_error_handlers(app: Flask) -> None:
    @app.errorhandler(ServekitError)
    def servekit_error(exc: ServekitError):
        return json_response(render(exc, request.path), exc.status, retry_headers(exc))

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException):
        return servekit_error(_as_servekit_error(exc, app.config.get("MAX_CONTENT_LENGTH")))

    @app.errorhandler(Exception)
    def unexpected(exc: Exception):
        log.exception("unhandled error on %s %s", request.method, request.path)
        return servekit_error(ServekitError(f"internal server error ({type(exc).__name__})"))


def _as_servekit_error(exc: HTTPException, limit: int | None) -> ServekitError:
    """Werkzeug's routing and body errors in the one error tree, with servekit's wording."""
    status = exc.code or 500
    if status == 413:
        return PayloadTooLarge(f"request body too large; the limit is {limit} bytes")
    if status == 404:
        return NotFound(f"no route for {request.method} {request.path}")
    if status == 405:
        return MethodNotAllowed(f"method {request.method} not allowed on {request.path}")
    error = ServekitError(exc.description or exc.name)
    error.status = status
    if status < 500:
        error.openai_type = "invalid_request_error"
    return error


class _Tickets:
    """WSGI: each POST's place in its model's queue and its canary (``servekit.dataplane.traffic``):
    the ``Servekit-Priority`` and ``Servekit-Timeout-Ms`` headers, its connection, its headers."""

    def __init__(self, inner: Any):
        self.inner = inner

    def __call__(self, environ: dict, start_response: Any) -> Any:
        if environ.get("REQUEST_METHOD") != "POST":
            traffic.start(None)
            return self.inner(environ, start_response)
        try:
            traffic.start(traffic.from_environ(environ))
        except ServekitError as exc:
            body = json.dumps(render(exc, environ.get("PATH_INFO", ""))).encode()
            start_response(
                f"{exc.status} Bad Request", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
            )
            return [body]
        return self.inner(environ, start_response)


def _install_api_key(app: Flask, api_key: ApiKey) -> None:
    @app.before_request
    def check_api_key():
        api_key.check(request.path, request.headers.get("Authorization"))
