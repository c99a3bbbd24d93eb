"""Server-Sent Events: the encoder and streaming predict.

Every stream ends with the comment
``: servekit-metadata {"requestLogId": ..., "predictionLogIds": [...]}``.
An error after the first byte arrives as an ``error`` event, never as a silent
cut; a client that disconnects closes the model's generator, which stops it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

from flask import Response

from ..codecs import json as jsonc
from ..codecs import tf_json
from ..errors import ServekitError

log = logging.getLogger("servekit.sse")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def event(payload: Any, name: str | None = None) -> bytes:
    data = payload if isinstance(payload, bytes) else jsonc.dumps(payload)
    head = b"event: " + name.encode() + b"\n" if name else b""
    return head + b"data: " + data + b"\n\n"


def comment(text: str) -> bytes:
    return b": " + text.encode() + b"\n\n"


def metadata_comment(request_log_id: str, prediction_log_ids: list[str]) -> bytes:
    trailer = jsonc.dumps({"requestLogId": request_log_id, "predictionLogIds": prediction_log_ids})
    return b": servekit-metadata " + trailer + b"\n\n"


def error_event(exc: BaseException) -> bytes:
    message = exc.message if isinstance(exc, ServekitError) else "internal error while streaming"
    return event({"error": message}, name="error")


def sse_response(events: Iterable[bytes]) -> Response:
    """Headers go out before the first event; the body streams as it is produced."""
    return Response(events, status=200, mimetype="text/event-stream", headers=SSE_HEADERS)


def sse_predict(outputs: Any, row_format: bool) -> Response:
    """One event per item a generator ``predict`` yields (one event for a plain result)."""
    return sse_response(_predict_events(outputs, row_format))


def _predict_events(outputs: Any, row_format: bool) -> Iterator[bytes]:
    request_log_id = str(uuid.uuid4())
    prediction_log_ids: list[str] = []
    items = outputs if hasattr(outputs, "__next__") else iter([outputs])
    try:
        for item in items:
            prediction_log_ids.append(str(uuid.uuid4()))
            yield event(tf_json.encode_predict_response(item, row_format))
    except Exception as exc:  # after the first byte the status is sent: report in-band
        log.warning("stream failed: %s", exc)
        yield error_event(exc)
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()  # client gone (GeneratorExit) or done: stop the model's generator
    yield metadata_comment(request_log_id, prediction_log_ids)
