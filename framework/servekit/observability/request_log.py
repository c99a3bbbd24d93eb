"""The request/prediction log: every inference request and its predictions, retrievable by id.

Each inference request (a POST on V1, V2, OpenAI or the generic paths) has a
``requestLogId`` and each prediction in its answer (a V1 answer, an OpenAI
choice, a V2 batch row, a streamed event) a ``predictionLogId``.  The protocols
hand each prediction to the request's :class:`Predictions` as they produce it
(:func:`predictions`), and send the ids it gives (``X-Request-Log-Id`` /
``X-Prediction-Log-Ids`` headers, or a stream's closing ``: servekit-metadata``
comment); the log never reads the server's own answers back.  An answer whose
protocol handed nothing is stored whole, as one prediction.
``GET /v1/logs/requests/ID`` and ``GET /v1/logs/predictions/ID`` read them back.

Records reach storage through the ``log_request`` hook, so any plugin can ship
them elsewhere; the built-in store is :mod:`.log_store`, which spools each one
(:mod:`.log_spool`) as the hook is called.  The hook is called before the
answer's last byte goes out: for a whole answer, before its first; for a stream,
before its closing chunk.  Bodies are kept up to :data:`MAX_BODY` bytes each.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import orjson
from flask import Blueprint, Flask, Response, current_app, g, has_request_context, request

from servekit.errors import NotFound
from servekit.observability import labels, tracing
from servekit.observability.logging import current_request_id
from servekit.streams import close
from servekit.types import PredictionLog, RequestLog, maybe_json

if TYPE_CHECKING:
    from servekit.observability.log_store import SqlRequestLog

log = logging.getLogger("servekit.request_log")

MAX_BODY = 64 * 1024
MAX_ID_HEADER = 100  # more predictions than this: ids only through the log API


# -- ids: defined here only; the protocols hand them out -----------------------------------

REQUEST_LOG_HEADER = "X-Request-Log-Id"
PREDICTION_LOG_HEADER = "X-Prediction-Log-Ids"
METADATA_COMMENT = "servekit-metadata"  # a stream's closing ``: servekit-metadata {...}``

#: The predictions of the request being logged; ``None`` when the log is off for it.
_logging: ContextVar[Predictions | None] = ContextVar("servekit_request_log", default=None)


def request_log_id() -> str:
    """The current request's ``requestLogId``, shared with the protocols through ``flask.g``.

    A logging plugin that sets ``g.request_log_id`` first has its id reused.
    """
    if not has_request_context():
        return str(uuid.uuid4())
    if "request_log_id" not in g:
        g.request_log_id = str(uuid.uuid4())
    return g.request_log_id


def prediction_log_id() -> str:
    """A new id for one prediction (a predict answer, a streamed item, a completion choice)."""
    return str(uuid.uuid4())


class Predictions:
    """The predictions of one answer, handed over by the protocol as it produces them.

    Each :meth:`add` gives the prediction's id; while the request is logged
    (``keep``) the prediction itself is kept too, as JSON text, up to
    :data:`MAX_BODY` bytes over the whole answer.
    """

    def __init__(self, request_log_id: str, keep: bool):
        self.request_log_id = request_log_id
        self.keep = keep
        self.records: list[PredictionLog] = []
        self._kept = 0

    def add(self, output: Any) -> str:
        pid = prediction_log_id()
        text = ""
        if self.keep and self._kept < MAX_BODY:
            text = _as_json(output)
            text = text if self._kept + len(text) <= MAX_BODY else ""
            self._kept += len(text)
        self.records.append(PredictionLog(pid, len(self.records), text))
        return pid

    def add_rows(self, outputs: dict[str, Any]) -> None:
        """Named tensors sharing a first (batch) dimension: one prediction per row."""
        sizes = {len(v) if getattr(v, "ndim", 0) else None for v in outputs.values()}
        if len(sizes) != 1 or None in sizes:
            self.add(outputs)
            return
        for i in range(sizes.pop() or 0):
            self.add({name: value[i : i + 1].reshape(-1) for name, value in outputs.items()})

    @property
    def ids(self) -> list[str]:
        return [p.prediction_log_id for p in self.records]

    def headers(self) -> dict[str, str]:
        """The ids as headers of a whole (not streamed) answer."""
        return {REQUEST_LOG_HEADER: self.request_log_id, PREDICTION_LOG_HEADER: ",".join(self.ids)}

    def trailer(self) -> bytes:
        """A stream's closing comment, carrying the ids of every event it sent."""
        doc = orjson.dumps({"requestLogId": self.request_log_id, "predictionLogIds": self.ids})
        return b": " + METADATA_COMMENT.encode() + b" " + doc + b"\n\n"


def predictions() -> Predictions:
    """The current request's predictions: the logged ones, or ids only when the log is off."""
    return _logging.get() or Predictions(request_log_id(), keep=False)


def logged() -> Predictions | None:
    """The current request's predictions only while it is logged (a protocol then hands rows)."""
    return _logging.get()


def _as_json(output: Any) -> str:
    try:
        return orjson.dumps(output, option=orjson.OPT_SERIALIZE_NUMPY, default=_plain).decode()
    except TypeError:
        return ""


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError


def _clip(data: bytes | str) -> str:
    if isinstance(data, bytes):
        data = data[:MAX_BODY].decode("utf-8", errors="replace")
    return data[:MAX_BODY]


# -- the Flask side -----------------------------------------------------------------------------


bp = Blueprint("request_logs", __name__)


def _store() -> SqlRequestLog:
    store = current_app.extensions.get("servekit.request_log")
    if store is None:
        raise NotFound("request logging is off (--request-log-url off)")
    return store


def _json(payload: Any) -> Response:
    return Response(json.dumps(payload), mimetype="application/json")


@bp.get("/v1/logs/requests/<request_log_id>")
def get_request_log(request_log_id: str):
    record = _store().get(request_log_id)
    if record is None:
        raise NotFound(f"no request log with id {request_log_id!r}")
    return _json(record.to_json())


@bp.get("/v1/logs/predictions/<prediction_log_id>")
def get_prediction_log(prediction_log_id: str):
    record = _store().get_by_prediction(prediction_log_id)
    match = [p for p in (record.predictions if record else []) if p.prediction_log_id == prediction_log_id]
    if record is None or not match:
        raise NotFound(f"no prediction log with id {prediction_log_id!r}")
    p = match[0]
    return _json(
        {
            "predictionLogId": p.prediction_log_id,
            "requestLogId": record.request_log_id,
            "index": p.index,
            "model": record.model,
            "output": maybe_json(p.output),
        }
    )


class _TeeInput:
    """``wsgi.input`` that keeps the first :data:`MAX_BODY` bytes read, for the log."""

    def __init__(self, stream: Any):
        self._stream = stream
        self.head = bytearray()

    def _keep(self, data: bytes) -> bytes:
        if len(self.head) < MAX_BODY:
            self.head += data[: MAX_BODY - len(self.head)]
        return data

    def read(self, *args: Any) -> bytes:
        return self._keep(self._stream.read(*args))

    def readline(self, *args: Any) -> bytes:
        return self._keep(self._stream.readline(*args))

    def readlines(self, *args: Any) -> list[bytes]:
        return [self._keep(line) for line in self._stream.readlines(*args)]

    def __iter__(self):
        return iter(self.readline, b"")


def _before() -> None:
    if not _hook_impls(current_app):
        return  # nobody keeps records (the default): no bookkeeping on the hot path
    if request.method == "POST" and labels.protocol_of(request.path) in labels.INFERENCE:
        g.servekit_log_started = time.perf_counter()
        g.servekit_log_tee = request.environ["wsgi.input"] = _TeeInput(request.environ["wsgi.input"])
        g.servekit_predictions = Predictions(request_log_id(), keep=True)
        _logging.set(g.servekit_predictions)
        labels.answering_version.set(None)  # set again when the data plane resolves this request's version


def _teardown(_exc: BaseException | None) -> None:
    _logging.set(None)  # the thread's next request starts unlogged


def _after(response: Response) -> Response:
    started = g.pop("servekit_log_started", None)
    tee = g.pop("servekit_log_tee", None)
    handed: Predictions | None = g.pop("servekit_predictions", None)
    if started is None or handed is None:
        return response
    response.headers[REQUEST_LOG_HEADER] = handed.request_log_id
    record = _record(handed.request_log_id, bytes(tee.head) if tee else b"", response.status_code)
    app = current_app._get_current_object()  # type: ignore[attr-defined]  # the app behind the proxy
    if response.is_streamed:
        response.response = _StreamLog(response.response, record, handed, started, app)
        return response
    body = response.get_data()
    if response.status_code < 400:
        record.predictions = handed.records or _whole(body)
        if PREDICTION_LOG_HEADER not in response.headers and len(record.predictions) <= MAX_ID_HEADER:
            response.headers[PREDICTION_LOG_HEADER] = ",".join(p.prediction_log_id for p in record.predictions)
    record.response_body = _clip(body)
    record.duration_ms = (time.perf_counter() - started) * 1000
    _emit(app, record)
    return response


def _whole(body: bytes) -> list[PredictionLog]:
    """An answer whose protocol handed no predictions: one, the whole body (as sent)."""
    return [PredictionLog(prediction_log_id(), 0, _clip(body) if len(body) <= MAX_BODY else "")]


def _record(rid: str, request_body: bytes, status: int) -> RequestLog:
    served = current_app.extensions["servekit"].models
    protocol = labels.protocol_of(request.path)
    # the path names the model, or the protocol said which one answered (OpenAI's body)
    model = labels.model_of(request.path, served) or request.environ.get("servekit.model") or ""
    if not model and protocol == "generic" and len(served) == 1:
        model = next(iter(served))
    request.environ["servekit.model"] = model  # the metrics' label too
    return RequestLog(
        request_log_id=rid,
        request_id=current_request_id.get(),
        created=time.time(),
        method=request.method,
        path=request.path,
        protocol=protocol,
        model=model,
        status=status,
        duration_ms=0.0,
        request_body=_clip(request_body),
        response_body="",
        version=_version(request.path),
        trace_id=tracing.current_trace_id(),
    )


def _version(path: str) -> str:
    """The version that answered, else the one the path names (a request refused before resolving)."""
    answered = labels.answering_version.get()
    if answered is not None:
        return str(answered)
    if "/versions/" not in path:
        return ""
    return path.split("/versions/", 1)[1].split("/", 1)[0].split(":", 1)[0]


def _hook_impls(app: Flask) -> list[Any]:
    return app.extensions["servekit"].plugins.hook.log_request.get_hookimpls()


def _emit(app: Flask, record: RequestLog) -> None:
    emit(app.extensions["servekit"].plugins, record)


def emit(pm: Any, record: RequestLog) -> None:
    """Call every ``log_request`` implementation of the plugin manager ``pm``; one that fails
    neither fails the request nor keeps the record from the others (a shadow process logs so too)."""
    hook = pm.hook.log_request
    for impl in reversed(hook.get_hookimpls()):  # pluggy's order: last registered first
        try:
            impl.function(*[{"record": record}[name] for name in impl.argnames])
        except Exception:
            log.exception("log_request of plugin %s failed", impl.plugin_name)


#: the chunks that end a stream: the record is kept before they go out
_STREAM_ENDS = (b": " + METADATA_COMMENT.encode(), b"data: [DONE]")


class _StreamLog:
    """Passes an SSE body through; the record, with the predictions the protocol handed, is
    kept before the stream's closing chunk (``data: [DONE]``, the ids' comment) goes out, or
    when a stream without one ends or its client leaves."""

    def __init__(self, body: Any, record: RequestLog, handed: Predictions, started: float, app: Flask):
        self._body, self._record, self._handed, self._started, self._app = body, record, handed, started, app
        self._kept = False

    def __iter__(self):
        for chunk in self._body:
            if not self._kept and isinstance(chunk, bytes) and chunk.startswith(_STREAM_ENDS):
                self._keep()
            yield chunk

    def _keep(self) -> None:
        self._kept = True
        self._record.predictions = list(self._handed.records)
        self._record.duration_ms = (time.perf_counter() - self._started) * 1000
        self._record.response_body = f"(a stream of {len(self._handed.records)} predictions)"
        _emit(self._app, self._record)

    def close(self) -> None:
        try:
            close(self._body)
        finally:
            if not self._kept:
                self._keep()


def install(app: Flask, settings: Any) -> SqlRequestLog | None:
    """Register the built-in store (when ``--request-log-url`` names one) and the logging hooks.

    Off by default: keeping every request and response costs about a third of a
    small model's throughput (docs/performance.md).
    """
    from servekit.observability.log_store import SqlRequestLog

    app.register_blueprint(bp)
    app.before_request(_before)
    app.after_request(_after)
    app.teardown_request(_teardown)
    url = settings.request_log_url
    if not url or url.lower() in ("off", "none", "false", "0"):
        return None
    if url.lower() == "sqlite":
        import tempfile

        url = "sqlite:///" + os.path.join(tempfile.mkdtemp(prefix="servekit-logs-"), "requests.db")
    store = SqlRequestLog(url, spool=getattr(settings, "request_log_spool", "") or None)
    if not getattr(settings, "preload", False):
        store.start()  # ship what gone processes left; with --preload each worker starts on first use
    pm = app.extensions["servekit"].plugins
    if pm.get_plugin("servekit.request_log") is not None:
        pm.unregister(name="servekit.request_log")  # a data plane reused by a new app
    pm.register(store, name="servekit.request_log")
    app.extensions["servekit.request_log"] = store
    return store
