"""The wiring of observability into an app made by ``create_app``.

:func:`install` adds the outermost WSGI layer (:class:`ObserveMiddleware`), which
gives every request its id, counts it and times it exactly as the client saw it,
including the answers the limits give before Flask runs, and, when traces are on
(:mod:`.tracing`), holds its server span; Flask hooks carry the id into log lines
and write the request log; the metrics, log and status routes are ordinary
blueprints.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from logging import getLogger  # `logging` in this package is servekit.observability.logging
from typing import Any

from flask import Flask, request

from servekit.observability import (
    generation_metrics,
    labels,
    log_search,
    metrics,
    request_log,
    status_metrics,
    tracing,
)
from servekit.observability.logging import REQUEST_ID_HEADER, current_request_id, request_id_from
from servekit.observability.wsgi_body import ClosingBody, Once
from servekit.streams import close

access_log = getLogger("servekit.access")


class ObserveMiddleware:
    """Request id, in-flight gauge, request counter and latency for every request."""

    def __init__(self, app: Callable, dataplane: Any, *, log_access: bool = False):
        self.app = app
        self.dataplane = dataplane
        self.log_access = log_access

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        started = time.perf_counter()
        request_id = request_id_from(environ.get("HTTP_X_REQUEST_ID"))
        environ["servekit.request_id"] = request_id
        seen: dict[str, str] = {}
        timing, timing_token = generation_metrics.headers_for_answer()  # a whole generation's, TGI's names

        def start(status: str, headers: list, exc_info: Any = None):
            seen["status"] = status
            headers.append((REQUEST_ID_HEADER, request_id))
            headers.extend(timing)
            return start_response(status, headers, exc_info)

        metrics.request_started()
        traced = self._server_span(environ) if tracing.ON else None
        finish = Once(lambda: self._finish(environ, seen, started, traced))
        try:
            body = self.app(environ, start)
        except BaseException:
            seen.setdefault("status", "500")
            finish()
            raise
        finally:
            generation_metrics.headers_done(timing_token)
            if traced is not None:
                traced.leave()
        if traced is not None:
            body = _InSpan(body, traced)  # a stream's items are made under the request's span
        return ClosingBody(body, finish)

    def _server_span(self, environ: dict) -> tracing.ServerSpan:
        method, path = environ.get("REQUEST_METHOD", ""), environ.get("PATH_INFO", "")
        model = labels.model_of(path, self.dataplane.models)
        route = path.replace("/" + model, "/{name}", 1) if model else path  # few span names, not one per model
        traced = tracing.ServerSpan(
            f"{method} {route}",
            tracing.environ_carrier(environ),
            {"http.request.method": method, "url.path": path, tracing.MODEL: model},
        )
        traced.enter()
        environ["servekit.trace_id"] = traced.trace_id
        return traced

    def _finish(self, environ: dict, seen: dict[str, str], started: float, traced: Any = None) -> None:
        seconds = time.perf_counter() - started
        metrics.request_finished()
        path = environ.get("PATH_INFO", "")
        protocol = labels.protocol_of(path)
        model = environ.get("servekit.model") or labels.model_of(path, self.dataplane.models)
        status = int(seen.get("status", "500").split(" ", 1)[0])
        metrics.observe_request(model, protocol, status, seconds)
        if traced is not None:
            traced.end(status, attributes={"servekit.request_id": environ["servekit.request_id"]})
        if self.log_access:
            access_log.info(
                "%s %s %d %.1fms",
                environ.get("REQUEST_METHOD"),
                path,
                status,
                seconds * 1000,
                extra={
                    "request_id": environ["servekit.request_id"],
                    "method": environ.get("REQUEST_METHOD"),
                    "path": path,
                    "status": status,
                    "duration_ms": round(seconds * 1000, 3),
                    "protocol": protocol,
                    "model": model,
                    **({"trace_id": environ["servekit.trace_id"]} if "servekit.trace_id" in environ else {}),
                },
            )


class _InSpan:
    """A response body whose items are produced with the request's span current (a stream's work)."""

    def __init__(self, body: Iterable[bytes], traced: tracing.ServerSpan):
        self._body, self._traced = body, traced

    def __iter__(self) -> Iterator[bytes]:
        items = iter(self._body)
        while True:
            self._traced.enter()
            try:
                item = next(items)
            except StopIteration:
                return
            finally:
                self._traced.leave()
            yield item

    def close(self) -> None:
        close(self._body)


def _bind_request_id() -> None:
    """Put the id the middleware chose into this thread's logging context."""
    request.environ["servekit.request_id_token"] = current_request_id.set(
        request.environ.get("servekit.request_id") or request_id_from(request.headers.get(REQUEST_ID_HEADER))
    )


def _unbind_request_id(exc: BaseException | None = None) -> None:
    token = request.environ.pop("servekit.request_id_token", None)
    if token is not None:
        try:
            current_request_id.reset(token)
        except ValueError:  # reset from another context (streamed body closed elsewhere)
            current_request_id.set("")


def install(app: Flask, settings: Any) -> None:
    """Add metrics, request ids and the request log to ``app`` (after the limits)."""
    dp = app.extensions["servekit"]
    app.before_request(_bind_request_id)
    app.teardown_request(_unbind_request_id)
    app.register_blueprint(metrics.blueprint())
    app.register_blueprint(status_metrics.bp)
    app.register_blueprint(log_search.bp)
    tracing.configure()
    pm = dp.plugins
    if pm.get_plugin("servekit.metrics") is None:
        pm.register(metrics.BatchSizePlugin(dp), name="servekit.metrics")
    request_log.install(app, settings)
    app.wsgi_app = ObserveMiddleware(app.wsgi_app, dp, log_access=settings.access_log)  # type: ignore[method-assign]
