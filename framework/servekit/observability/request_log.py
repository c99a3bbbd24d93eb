"""The request/prediction log: every inference request and its predictions, retrievable by id.

Each inference request (a POST on V1, V2, OpenAI or the generic paths) has a
``requestLogId`` and each prediction in its answer (a row of ``predictions``, an
OpenAI choice, a V2 batch row, a streamed event) a ``predictionLogId``.  The
protocols hand them out (``X-Request-Log-Id`` / ``X-Prediction-Log-Ids``
headers, or a stream's closing ``: servekit-metadata`` comment) and the log
stores what the client got, making ids only for answers that carry none.
``GET /v1/logs/requests/ID`` and ``GET /v1/logs/predictions/ID`` read them back.

Records reach storage through the ``log_request`` hook, so any plugin can ship
them elsewhere; the built-in store is :mod:`.log_store`.  Bodies are kept up to
:data:`MAX_BODY` bytes each.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from typing import TYPE_CHECKING, Any

import orjson
from flask import Blueprint, Flask, Response, current_app, g, has_request_context, request

from ..errors import NotFound
from ..streams import close
from ..types import PredictionLog, RequestLog, maybe_json
from . import labels
from .logging import current_request_id

if TYPE_CHECKING:
    from .log_store import SqlRequestLog

log = logging.getLogger("servekit.request_log")

MAX_BODY = 64 * 1024
MAX_PARSED = 1024 * 1024  # larger answers are not split (one id, no outputs): parsing costs
MAX_ID_HEADER = 100  # more predictions than this: ids only through the log API


# -- ids: defined here only; the protocols hand them out -----------------------------------

REQUEST_LOG_HEADER = "X-Request-Log-Id"
PREDICTION_LOG_HEADER = "X-Prediction-Log-Ids"
METADATA_COMMENT = "servekit-metadata"  # a stream's closing ``: servekit-metadata {...}``
_TRAILER = b": " + METADATA_COMMENT.encode() + b" "


def request_log_id() -> str:
    """The current request's ``requestLogId``, shared with the protocols through ``flask.g``.

    The protocols put the ids they hand out in the response (headers, or a
    stream's closing comment); the log stores what the client got and makes ids
    only for answers that carry none.  A logging plugin that sets
    ``g.request_log_id`` first has its id reused.
    """
    if not has_request_context():
        return str(uuid.uuid4())
    if "request_log_id" not in g:
        g.request_log_id = str(uuid.uuid4())
    return g.request_log_id


def prediction_log_id() -> str:
    """A new id for one prediction (a predict answer, a streamed item, a completion choice)."""
    return str(uuid.uuid4())


# -- splitting an answer into predictions -----------------------------------------------


def split_predictions(body: Any) -> list[Any]:
    """The predictions in a response document, one per row / choice / item."""
    if not isinstance(body, dict):
        return [body]
    for key in ("predictions", "results", "explanations", "choices", "data"):
        if isinstance(body.get(key), list):
            return list(body[key])
    outputs = body.get("outputs")
    if isinstance(outputs, list) and outputs and all(isinstance(o, dict) and "data" in o for o in outputs):
        return _v2_rows(outputs)
    if isinstance(outputs, dict) and outputs:
        columns = {k: v for k, v in outputs.items() if isinstance(v, list)}
        lengths = {len(v) for v in columns.values()}
        if len(columns) == len(outputs) and len(lengths) == 1:
            n = lengths.pop()
            return [{k: v[i] for k, v in columns.items()} for i in range(n)]
    if isinstance(outputs, list):
        return list(outputs)
    return [body]


def _v2_rows(outputs: list[dict[str, Any]]) -> list[Any]:
    """V2 tensors are flat ``data`` with a ``shape``: row i is each output's i-th slice."""
    try:
        rows = {int(o["shape"][0]) for o in outputs if o.get("shape")}
        if len(rows) != 1:
            return [{"outputs": outputs}]
        n = rows.pop()
        split: list[dict[str, Any]] = [{} for _ in range(n)]
        for o in outputs:
            data = o["data"]
            width = len(data) // n if n else 0
            for i in range(n):
                split[i][o["name"]] = data[i * width:(i + 1) * width]
        return split
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return [{"outputs": outputs}]


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
    return _json({"predictionLogId": p.prediction_log_id, "requestLogId": record.request_log_id,
                  "index": p.index, "model": record.model, "output": maybe_json(p.output)})


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


def _after(response: Response) -> Response:
    started = g.pop("servekit_log_started", None)
    tee = g.pop("servekit_log_tee", None)
    if started is None:
        return response
    rid = response.headers.get(REQUEST_LOG_HEADER) or request_log_id()
    response.headers[REQUEST_LOG_HEADER] = rid
    record = _record(rid, bytes(tee.head) if tee else b"", response.status_code)
    app = current_app._get_current_object()  # type: ignore[attr-defined]  # the app behind the proxy
    if response.is_streamed:
        response.response = _StreamLog(response.response, record, started, app)
        return response
    body = response.get_data()
    given = [i for i in response.headers.get(PREDICTION_LOG_HEADER, "").split(",") if i]
    if response.status_code < 400:
        record.predictions = _predictions(body, given)
        if not given and len(record.predictions) <= MAX_ID_HEADER:
            response.headers[PREDICTION_LOG_HEADER] = ",".join(p.prediction_log_id for p in record.predictions)
    record.response_body = _clip(body)
    record.duration_ms = (time.perf_counter() - started) * 1000
    _emit(app, record)
    return response


def _record(rid: str, request_body: bytes, status: int) -> RequestLog:
    served = current_app.extensions["servekit"].repository.models
    protocol = labels.protocol_of(request.path)
    model = labels.model_of(request.path, served)
    if not model and request_body:
        model = _body_model(request_body, served)
    if not model and protocol == "generic" and len(served) == 1:
        model = next(iter(served))
    request.environ["servekit.model"] = model  # the metrics' label too
    return RequestLog(
        request_log_id=rid, request_id=current_request_id.get(), created=time.time(),
        method=request.method, path=request.path, protocol=protocol, model=model, status=status,
        duration_ms=0.0, request_body=_clip(request_body), response_body="",
    )


def _body_model(body: bytes, served: Any) -> str:
    """OpenAI requests name their model in the body."""
    try:
        name = json.loads(body).get("model")
    except (ValueError, AttributeError):
        return ""
    return name if isinstance(name, str) and name in served else ""


def _predictions(body: bytes, given: list[str]) -> list[PredictionLog]:
    """The answer's predictions under the ids the client got (``given``), or new ids."""
    items: list[Any] = []
    document: Any = None
    if len(body) <= MAX_PARSED:
        try:
            document = orjson.loads(body)
            items = split_predictions(document)
        except orjson.JSONDecodeError:  # binary V2 answers, NaN tokens: stored unsplit
            items = []
    if given and len(given) != len(items):
        # the protocol numbered the answer differently (one id for a whole batch)
        items = [document] if len(given) == 1 and document is not None and len(body) <= MAX_BODY else []
    ids = given or [prediction_log_id() for _ in items or [None]]
    keep = len(body) <= MAX_BODY
    return [
        PredictionLog(pid, i, json.dumps(items[i]) if keep and i < len(items) else "")
        for i, pid in enumerate(ids)
    ]


def _hook_impls(app: Flask) -> list[Any]:
    return app.extensions["servekit"].repository.pm.hook.log_request.get_hookimpls()


def _emit(app: Flask, record: RequestLog) -> None:
    """Call every ``log_request`` implementation; one that fails neither fails the
    request nor keeps the record from the others."""
    hook = app.extensions["servekit"].repository.pm.hook.log_request
    for impl in reversed(hook.get_hookimpls()):  # pluggy's order: last registered first
        try:
            impl.function(*[{"record": record}[name] for name in impl.argnames])
        except Exception:
            log.exception("log_request of plugin %s failed", impl.plugin_name)


class _StreamLog:
    """Passes an SSE body through, keeping each ``data:`` event as one prediction.

    The ids are the ones the stream's closing ``: servekit-metadata`` comment
    gives the client (matched by order); a stream without one gets new ids.
    """

    def __init__(self, body: Any, record: RequestLog, started: float, app: Flask):
        self._body, self._record, self._started, self._app = body, record, started, app
        self._buffer = b""
        self._events: list[str] = []
        self._kept = 0
        self._trailer_ids: list[str] = []

    def __iter__(self):
        for chunk in self._body:
            self._scan(chunk if isinstance(chunk, bytes) else chunk.encode())
            yield chunk

    def _scan(self, chunk: bytes) -> None:
        self._buffer += chunk
        while b"\n\n" in self._buffer:
            event, self._buffer = self._buffer.split(b"\n\n", 1)
            if event.startswith(_TRAILER):
                try:
                    self._trailer_ids = list(json.loads(event[len(_TRAILER):]).get("predictionLogIds") or [])
                except (ValueError, AttributeError):
                    pass
                continue
            data = b"\n".join(line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:"))
            if not data or data == b"[DONE]":
                continue
            text = _clip(data) if self._kept + len(data) <= MAX_BODY else ""
            self._kept += len(text)
            self._events.append(text)

    def close(self) -> None:
        try:
            close(self._body)
        finally:
            ids = self._trailer_ids or [prediction_log_id() for _ in self._events]
            self._record.predictions = [
                PredictionLog(pid, i, self._events[i] if i < len(self._events) else "")
                for i, pid in enumerate(ids)
            ]
            self._record.duration_ms = (time.perf_counter() - self._started) * 1000
            self._record.response_body = f"(a stream of {len(self._events)} events)"
            _emit(self._app, self._record)


def install(app: Flask, settings: Any) -> SqlRequestLog | None:
    """Register the built-in store (when ``--request-log-url`` names one) and the logging hooks.

    Off by default: keeping every request and response costs about a third of a
    small model's throughput (docs/performance.md).
    """
    from .log_store import SqlRequestLog

    app.register_blueprint(bp)
    app.before_request(_before)
    app.after_request(_after)
    url = settings.request_log_url
    if not url or url.lower() in ("off", "none", "false", "0"):
        return None
    if url.lower() == "sqlite":
        import tempfile

        url = "sqlite:///" + os.path.join(tempfile.mkdtemp(prefix="servekit-logs-"), "requests.db")
    store = SqlRequestLog(url)
    pm = app.extensions["servekit"].repository.pm
    if pm.get_plugin("servekit.request_log") is not None:
        pm.unregister(name="servekit.request_log")  # a data plane reused by a new app
    pm.register(store, name="servekit.request_log")
    app.extensions["servekit.request_log"] = store
    return store
