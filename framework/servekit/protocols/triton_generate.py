"""Triton's generate extension: ``POST /v2/models/NAME[/versions/V]/generate`` and ``.../generate_stream``.

The body is ``{"text_input": ..., "parameters": {...}}`` plus any further
top-level fields (Triton passes those to the model as tensors); both are read
by :mod:`.generate_requests`.  ``generate`` answers one object,
``{"model_name", "model_version", "text_output"}`` (and the additional outputs
asked for); ``generate_stream`` answers Server-Sent Events, one ``data:`` object
of that shape per piece the model produces, ``text_output`` holding the new
text only, so the pieces join to the whole answer.  A body with ``"stream":
false`` (vLLM's switch) gets a single event.

Errors are Triton's ``{"error": message}``: before the first byte as an ordinary
JSON 4xx/5xx (the first piece is produced before the headers go out), after it
as an ``error`` event (:mod:`.streaming`).  A client that disconnects closes the
stream, which closes the model's generator: the sequence leaves the batch at the
scheduler's next step.  A model without a ``complete`` hook answers 400.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Generator, Iterator
from typing import Any

from flask import Blueprint, Response

from servekit.dataplane import generation as gen
from servekit.dataplane.data_plane import DataPlane
from servekit.dataplane.repository import ModelVersion
from servekit.errors import BadRequest
from servekit.observability.request_log import REQUEST_LOG_HEADER, Predictions, predictions
from servekit.protocols import generate_requests as gr
from servekit.protocols.http import dataplane, json_object, json_response
from servekit.protocols.streaming import error_event, event, first_item, sse_response
from servekit.streams import close

log = logging.getLogger("servekit.generate")

bp = Blueprint("triton_generate", __name__)


def _spec(body: dict[str, Any]) -> tuple[gr.GenerateSpec, dict[str, Any]]:
    fields = {k: v for k, v in body.items() if k not in (gr.TEXT_INPUT, "parameters")}
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise BadRequest(f"'parameters' must be an object, found {type(parameters).__name__}")
    return gr.read(body.get(gr.TEXT_INPUT), fields, parameters), parameters


def _envelope(mv: ModelVersion, text: str, extras: dict[str, Any]) -> dict[str, Any]:
    return {"model_name": mv.name, "model_version": str(mv.version), gr.TEXT_OUTPUT: text, **extras}


@bp.post("/v2/models/<name>/generate")
@bp.post("/v2/models/<name>/versions/<version>/generate")
def generate(name: str, version: str | None = None):
    body = json_object()
    dp = dataplane()
    mv = dp.resolve(name, version)
    spec, _ = _spec(body)
    document = _whole_document(dp, mv, spec, body)
    handed = predictions()
    handed.add(document)
    return json_response(document, headers=handed.headers())


def _whole_document(dp: DataPlane, mv: ModelVersion, spec: gr.GenerateSpec, body: dict[str, Any]) -> dict[str, Any]:
    choice = gr.whole(dp, mv, spec, body)
    return _envelope(mv, gr.answer_text(spec, choice), gr.whole_extras(spec, choice))


@bp.post("/v2/models/<name>/generate_stream")
@bp.post("/v2/models/<name>/versions/<version>/generate_stream")
def generate_stream(name: str, version: str | None = None) -> Response:
    body = json_object()
    dp = dataplane()
    mv = dp.resolve(name, version)
    spec, _ = _spec(body)
    handed = predictions()
    headers = {REQUEST_LOG_HEADER: handed.request_log_id}
    if spec.stream is False:  # vLLM's switch: one response with the whole text
        document = _whole_document(dp, mv, spec, body)
        return sse_response(_single(document, handed), headers)
    events = gr.stream(dp, mv, spec, body)
    has_first, head = first_item(events, "complete")
    return sse_response(_events(mv, spec, [head] if has_first else [], events, handed), headers)


def _single(document: dict[str, Any], handed: Predictions) -> Iterator[bytes]:
    handed.add(document)
    yield event(document)
    yield handed.trailer()


def _events(
    mv: ModelVersion,
    spec: gr.GenerateSpec,
    head: list[gen.StreamEvent],
    rest: Generator[gen.StreamEvent, None, None],
    handed: Predictions,
) -> Iterator[bytes]:
    """One event per piece with text; with additional outputs asked for, a last event that
    carries the finish reason.  The request log gets the whole text as one prediction."""
    try:
        for item in itertools.chain(head, rest):
            if isinstance(item, gen.StreamPiece) and item.chunk.text:
                extras = gr.extras(spec, item.choice, item.chunk, final=False)
                yield event(_envelope(mv, item.chunk.text, extras))
            elif isinstance(item, gen.ChoiceEnded):
                if spec.extras:
                    yield event(_envelope(mv, "", gr.extras(spec, item.choice, item.choice.closing, final=True)))
                handed.add(_envelope(mv, item.choice.text, {}))
    except GeneratorExit:
        raise  # the client is gone; finally stops the model
    except Exception as exc:  # the 200 is sent: report in-band, in Triton's error shape
        log.warning("generate stream failed: %s", exc)
        yield error_event(exc)
    finally:
        close(rest)
    yield handed.trailer()
