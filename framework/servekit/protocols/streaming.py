"""Server-Sent Events: the encoder, log ids, and TF Serving JSON's predict answer, streamed or not.

Every stream ends with the comment
``: servekit-metadata {"requestLogId": ..., "predictionLogIds": [...]}``; a
non-streaming answer carries the same ids in the ``X-Request-Log-Id`` and
``X-Prediction-Log-Ids`` headers.  Ids, header names and the comment are the
request log's (:class:`~servekit.observability.request_log.Predictions`), which
each prediction is handed to as it is produced.  Headers go out before the first byte (and a
streaming model's first item is produced before them, so a failure there is an
ordinary JSON error with its status); an error after the first byte arrives as
an ``error`` event, never as a silent cut.  A client that disconnects makes the
next write fail; the server then closes the response iterator, which closes the
model's generator, which stops it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from flask import Response

from servekit.codecs import json as jsonc
from servekit.codecs import tf_json
from servekit.dataplane.data_plane import join_stream
from servekit.errors import ModelFailure, ServekitError
from servekit.observability.request_log import REQUEST_LOG_HEADER, Predictions, predictions
from servekit.protocols.http import Answer
from servekit.streams import close, is_stream

log = logging.getLogger("servekit.sse")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


# -- encoding -------------------------------------------------------------------------


def event(payload: Any, name: str | None = None) -> bytes:
    data = payload if isinstance(payload, bytes) else jsonc.dumps(payload)
    head = b"event: " + name.encode() + b"\n" if name else b""
    return head + b"data: " + data + b"\n\n"


def comment(text: str) -> bytes:
    return b": " + text.encode() + b"\n\n"


def error_message(exc: BaseException) -> str:
    if isinstance(exc, ServekitError):
        return exc.message
    return f"the model failed while streaming: {type(exc).__name__}: {exc}"


def error_event(exc: BaseException, shape: Callable[[BaseException], Any] | None = None) -> bytes:
    """An ``error`` event; ``shape`` builds the protocol's error body (default ``{"error": message}``)."""
    body = shape(exc) if shape is not None else {"error": error_message(exc)}
    return event(body, name="error")


def sse_response(events: Iterable[bytes], headers: dict[str, str] | None = None) -> Response:
    """Headers go out before the first event; the body streams as it is produced."""
    return Response(events, status=200, mimetype="text/event-stream", headers={**SSE_HEADERS, **(headers or {})})


# -- generators -----------------------------------------------------------------------


def first_item(items: Iterator[Any], what: str) -> tuple[bool, Any]:
    """Pull the first item before any byte is sent: ``(False, None)`` for an empty stream.

    A failure here is still an ordinary JSON error with its own status.
    """
    try:
        return True, next(items)
    except StopIteration:
        return False, None
    except ServekitError:
        close(items)
        raise
    except Exception as exc:
        close(items)
        raise ModelFailure(f"{what} failed: {type(exc).__name__}: {exc}") from exc


# -- streaming predict ----------------------------------------------------------------


def sse_predict(outputs: Any, row_format: bool) -> Response:
    """One event per item a generator ``predict`` yields (one event for a plain result).

    Each event is handed to the request log as a prediction as it is sent.
    """
    handed = predictions()
    items = outputs if is_stream(outputs) else iter([outputs])
    has_first, first = first_item(items, "predict")
    try:
        head = [tf_json.encode_predict_response(first, row_format)] if has_first else []
    except BaseException:
        close(items)
        raise
    return sse_response(_predict_events(items, head, row_format, handed), {REQUEST_LOG_HEADER: handed.request_log_id})


def _predict_events(items: Iterator[Any], head: list[Any], row_format: bool, handed: Predictions) -> Iterator[bytes]:
    try:
        for document in head:
            handed.add(document)
            yield event(document)
        for item in items:
            document = tf_json.encode_predict_response(item, row_format)
            handed.add(document)
            yield event(document)
    except GeneratorExit:
        raise  # client gone: nothing more can be sent; finally stops the model
    except Exception as exc:  # after the first byte the status is sent: report in-band
        log.warning("stream failed: %s", exc)
        yield error_event(exc)
    finally:
        close(items)  # client gone (GeneratorExit) or done: stop the model's generator
    yield handed.trailer()


def predict_answer(outputs: Any, row_format: bool, stream: bool) -> Answer | Response:
    """A TF Serving JSON predict answer (V1 and the generic paths): SSE when asked to stream.

    A streaming model asked for one answer has its items joined (:func:`join_stream`);
    the whole answer is one prediction for the request log.
    """
    if stream:
        return sse_predict(outputs, row_format)
    if is_stream(outputs):
        outputs = join_stream(outputs, lenient=True)
    document = tf_json.encode_predict_response(outputs, row_format)
    handed = predictions()
    handed.add(document)
    return Answer(jsonc.dumps(document), headers=handed.headers())
