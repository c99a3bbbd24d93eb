"""The OpenAI API: completions, chat completions, responses, embeddings and the model list.

Mounted under ``/v1``, ``/openai/v1`` and without prefix, so the official
``openai`` client works with ``base_url`` set to any of them.  The protocol is
thin: it validates the body (:mod:`.openai_requests`), hands the data plane one
generation request per prompt and choice, and writes what the data plane
assembled (``DataPlane.generate``: the choices and the usage;
``DataPlane.generate_stream``: each choice's pieces and end, see
:mod:`servekit.dataplane.generation`) as OpenAI's response objects, or their SSE
chunks when ``"stream": true``.  Errors answer in OpenAI's shape
``{"error": {"message", "type", "param", "code"}}`` (:func:`servekit.errors.openai_error`;
``code`` is the HTTP status, which matters once a stream has sent its 200).
"""

from __future__ import annotations

import base64
import dataclasses
import itertools
import logging
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from flask import Blueprint, request
from werkzeug.exceptions import HTTPException

from servekit.codecs import tf_json
from servekit.dataplane import generation as gen
from servekit.dataplane.repository import ModelVersion
from servekit.dataplane.tool_calls import Delta, ToolCallStream, ToolUse
from servekit.errors import (
    BadRequest,
    ModelFailure,
    NotImplementedByModel,
    ServekitError,
    openai_error,
    openai_error_object,
)
from servekit.observability.request_log import REQUEST_LOG_HEADER, predictions
from servekit.protocols import openai_requests as req
from servekit.protocols import openai_responses as responses_api
from servekit.protocols.http import dataplane, json_object, json_response
from servekit.protocols.streaming import error_message, event, first_item, sse_response
from servekit.protocols.tf_documents import model_status
from servekit.routes import OPENAI_PREFIXES
from servekit.streams import close

log = logging.getLogger("servekit.openai")

bp = Blueprint("openai", __name__)

PREFIXES = OPENAI_PREFIXES
DONE = b"data: [DONE]\n\n"


def route(rule: str, methods: list[str]) -> Callable:
    """Register a view under every prefix (``/v1``, ``/openai/v1`` and none)."""

    def register(view: Callable) -> Callable:
        for prefix in PREFIXES:
            bp.add_url_rule(
                prefix + rule, endpoint=f"{view.__name__}{prefix.replace('/', '_')}", view_func=view, methods=methods
            )
        return view

    return register


# -- errors -----------------------------------------------------------------------------


def error_body(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, ServekitError):
        return openai_error(exc)
    if isinstance(exc, HTTPException):
        return openai_error_object(exc.description or exc.name, exc.code or 500)
    return openai_error_object(error_message(exc), 500)


@bp.errorhandler(ServekitError)
def servekit_error(exc: ServekitError):
    return json_response(error_body(exc), exc.status)


@bp.errorhandler(HTTPException)
def http_error(exc: HTTPException):
    return json_response(error_body(exc), exc.code or 500)


@bp.errorhandler(Exception)
def unexpected(exc: Exception):
    log.exception("unhandled error on %s %s", request.method, request.path)
    return json_response(openai_error(ServekitError(f"internal server error ({type(exc).__name__})")), 500)


#: what each hook gives, by the API that needs it (the words of a capability error)
CAPABILITIES = {
    "complete": ("Completions", "generate text"),
    "chat": ("Chat Completions", "generate text"),
    "embed": ("Embeddings", "embed text"),
    "explain": ("Completions explanations", "explain its predictions"),
}


@contextmanager
def capability(mv: ModelVersion, api: str) -> Iterator[None]:
    """A model without the hook an API needs is the client's mistake: a 400 naming the model.

    vLLM answers this 400 (``The model does not support Completions API``); a 501
    would be a 5xx, which the ``openai`` client retries twice before failing.
    """
    try:
        yield
    except NotImplementedByModel:
        hook = "complete" if api == "chat" else api
        name, verb = CAPABILITIES[api]
        raise BadRequest(
            f"The model {mv.name!r} does not support the {name} API: it does not {verb} (it has no {hook!r} hook)",
            param="model",
        ) from None


# -- models -------------------------------------------------------------------------------


def model_object(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "servekit"}


@route("/models", ["GET"])
def list_models():
    return json_response({"object": "list", "data": [model_object(n) for n in dataplane().model_names()]})


# ``/v1/models/NAME`` is TF Serving's status route (protocols/v1.py), which carries
# the OpenAI fields too; these are the same answer under the other prefixes.
@bp.get("/openai/v1/models/<name>")
@bp.get("/models/<name>")
def get_model(name: str):
    return json_response(model_status(dataplane(), name))


def resolve_model(body: dict[str, Any]) -> ModelVersion:
    """``model`` names a served model; it may be left out when only one is served."""
    dp = dataplane()
    name = req.model_name(body, dp.model_names())
    mv = dp.resolve(name)
    request.environ["servekit.model"] = name  # the metrics' model label (it is not in the path)
    return mv


# -- completions and chat ------------------------------------------------------------------


@dataclass
class Job:
    """One completions or chat request: what its answer is rendered with."""

    mv: ModelVersion
    body: dict[str, Any]
    chat: bool
    prompts: list[str]
    sampling: req.Sampling
    tokenizer: Any | None
    echo: bool = False
    messages: list[dict[str, Any]] | None = None
    #: the grammar every choice is decoded under (structured outputs, a forced tool call)
    constraint: gen.Constraint | None = None
    #: the tools the model may call (chat), ``None`` when it may call none
    tools: ToolUse | None = None

    def __post_init__(self) -> None:
        kind = "chatcmpl" if self.chat else "cmpl"
        self.id = f"{kind}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        if self.chat:
            self.object = "chat.completion.chunk" if self.sampling.stream else "chat.completion"
        else:
            self.object = "text_completion"
        # each finished choice is handed to the request log as one prediction
        self.predictions = predictions()
        # streams call the model after the view returned, outside the app context
        self.dataplane = dataplane()

    def requests(self) -> list[gen.GenerationRequest]:
        return req.generation_requests(self.prompts, self.sampling, self.messages, self.constraint)

    def index(self, generation: gen.GenerationRequest) -> int:
        return generation.prompt_index * self.sampling.n + generation.choice_index

    def envelope(self, **fields: Any) -> dict[str, Any]:
        return {"id": self.id, "object": self.object, "created": self.created, "model": self.mv.name, **fields}


def usage_object(usage: gen.Usage) -> dict[str, Any]:
    """OpenAI's usage; with the time the model measured, in seconds, as Groq's OpenAI API adds it
    (``queue_time``, ``prompt_time``: prefill, ``completion_time``: decode, ``total_time``: both),
    which the ``openai`` client keeps as extra fields."""
    out: dict[str, Any] = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }
    timing = usage.timing
    if timing is not None:
        out["queue_time"] = round(timing.queue, 6)
        out["prompt_time"] = round(timing.prefill, 6)
        out["completion_time"] = round(timing.decode, 6)
        out["total_time"] = round(timing.prefill + timing.decode, 6)
    return out


@route("/completions", ["POST"])
def completions():
    body = json_object()
    stream = req.boolean(body, "stream")
    explain = req.boolean(body, "explain")
    if explain and stream:
        raise BadRequest("completions with explanations do not support streaming", param="explain")
    sent = req.prompts(body)
    sampling = req.completion_request(body, stream)
    constraint = req.constraint(body)
    mv = resolve_model(body)
    tokenizer = dataplane().tokenizer(mv)
    prompts = [p for p in sent if isinstance(p, str)]
    if not prompts:  # token ids: the model reads them as sent (the text is their decoding)
        prompts = token_inputs(mv, tokenizer, [p for p in sent if isinstance(p, list)], "prompt")
    token_rules_need_ids(mv, tokenizer, sampling)
    job = Job(mv, body, False, prompts, sampling, tokenizer, echo=req.boolean(body, "echo"), constraint=constraint)
    if stream:
        return stream_job(job)
    payload = complete_job(job)
    if explain:
        with capability(mv, "explain"):
            explanations = dataplane().explain(mv, np.array(prompts, dtype=object), parameters=body)
        payload["explanations"] = tf_json.encode_explain_response(explanations, True)["explanations"]
    return json_response(payload, headers=job.predictions.headers())


@route("/chat/completions", ["POST"])
def chat_completions():
    body = json_object()
    stream = req.boolean(body, "stream")
    job = chat_job(body, stream)
    if stream:
        return stream_job(job)
    return json_response(complete_job(job), headers=job.predictions.headers())


def chat_job(body: dict[str, Any], stream: bool) -> Job:
    """A chat request, checked, its model resolved and its prompt formatted (the Responses API's too)."""
    if req.boolean(body, "explain"):
        raise BadRequest("explanations are supported on completions, not chat", param="explain")
    messages = req.messages(body)
    req.check_tool_messages(messages)
    sampling = req.chat_request(body, stream)
    constraint = req.constraint(body)
    mv = resolve_model(body)
    tokenizer = dataplane().tokenizer(mv)
    token_rules_need_ids(mv, tokenizer, sampling)
    template = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    tools = req.tool_use(body, template, mv.config.options.get("tool_call_parser"))
    forced = tools.constraint() if tools is not None else None
    if forced is not None and constraint is not None:
        raise BadRequest(
            f"a forced tool call is decoded under its parameters' schema, so it cannot also follow '{constraint.param}'",
            param=constraint.param,
        )
    prompt = gen.format_chat(messages, tokenizer, req.template_kwargs(body), tools.tools if tools else None)
    return Job(
        mv, body, True, [prompt], sampling, tokenizer, messages=messages, constraint=forced or constraint, tools=tools
    )


def token_rules_need_ids(mv: ModelVersion, tokenizer: Any | None, sampling: req.Sampling) -> None:
    """``logit_bias`` and vLLM's token rules act on the model's tokens: a model without a tokenizer has none."""
    if tokenizer is not None:
        return
    for key in req.TOKEN_RULES:
        if key in sampling.options:
            raise BadRequest(
                f"model {mv.name!r} has no tokenizer, so it cannot apply '{key}' (a rule on its vocabulary's tokens)",
                param=key,
            )


def complete_job(job: Job) -> dict[str, Any]:
    try:
        with capability(job.mv, "chat" if job.chat else "complete"):
            generated = job.dataplane.generate(job.mv, job.requests(), job.body, tokenizer=job.tokenizer)
    except ServekitError:
        raise
    except Exception as exc:  # raised while reading a streaming model's generator
        raise gen.model_failure(job.mv.name, exc) from exc
    field = "echo" if job.sampling.echo_logprobs is not None else "prompt_logprobs"
    for generation, finished in generated.choices:
        gen.check_prompt_logprobs(generation, finished.prompt_logprobs, field)
    choices = [whole_choice(job, generation, choice) for generation, choice in generated.choices]
    for choice in choices:
        job.predictions.add(choice)
    extra: dict[str, Any] = {}
    if job.chat and job.sampling.prompt_logprobs is not None:  # vLLM answers chat's at the top
        extra["prompt_logprobs"] = prompt_logprobs_object(
            generated.choices[0][1].prompt_logprobs, job.sampling.prompt_logprobs
        )
    return job.envelope(choices=choices, usage=usage_object(generated.usage), **extra)


def whole_choice(job: Job, generation: gen.GenerationRequest, choice: gen.Choice) -> dict[str, Any]:
    """One choice of a whole answer: chat's ``message`` or completions' ``text`` (the prompt first with ``echo``)."""
    if job.chat:
        content: str | None = choice.text
        reason = choice.finish_reason
        message: dict[str, Any] = {"role": "assistant"}
        if job.tools is not None:
            content, calls = job.tools.parse(choice.text)
            reason = job.tools.finish_reason(reason, calls)
            if calls:
                message["tool_calls"] = [call.as_openai() for call in calls]
        message.update(content=content, refusal=None, reasoning_content=choice.reasoning)
        return {
            "index": job.index(generation),
            "message": message,
            "logprobs": logprobs_object(job, choice.logprobs),
            "finish_reason": reason,
        }
    entries = choice.logprobs
    if job.sampling.echo_logprobs is not None:  # the prompt's tokens first, then the generated ones
        entries = _top_cut(choice.prompt_logprobs or [], job.sampling.echo_logprobs) + (entries or [])
    answered = {
        "index": job.index(generation),
        "text": generation.prompt + choice.text if job.echo else choice.text,
        "logprobs": logprobs_object(job, entries),
        "finish_reason": choice.finish_reason,
    }
    if job.sampling.prompt_logprobs is not None:
        answered["prompt_logprobs"] = prompt_logprobs_object(choice.prompt_logprobs, job.sampling.prompt_logprobs)
    return answered


# -- log-probabilities -----------------------------------------------------------------------

#: what a log-probability of minus infinity is answered as (JSON has no infinity; vLLM's value)
LOGPROB_FLOOR = -9999.0


def logprobs_object(job: Job, entries: list[gen.TokenLogprob] | None, offset: int = 0) -> dict[str, Any] | None:
    """A choice's ``logprobs``: chat's ``{"content": [...]}`` or completions' parallel lists.

    ``offset`` is where the first token's text starts (a stream's earlier pieces).
    """
    if entries is None:
        return None
    if job.chat:
        return {"content": [_chat_logprob(e, True) for e in entries], "refusal": None}
    tops: list[dict[str, float] | None] = []
    for entry in entries:
        if entry.logprob is None:  # a prompt's first token: nothing predicts it (OpenAI's null)
            tops.append(None)
            continue
        top = {t.token: _floor(t.logprob) for t in entry.top}
        top.setdefault(entry.token, _floor(entry.logprob))  # the chosen token is always there (OpenAI's rule)
        tops.append(top)
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [None if e.logprob is None else _floor(e.logprob) for e in entries],
        "top_logprobs": tops,
        "text_offset": gen.text_offsets(entries, offset),
    }


def _top_cut(entries: list[gen.TokenLogprob], top: int) -> list[gen.TokenLogprob]:
    """The entries with ``top`` alternatives each (the model scored as many as the most any field asked)."""
    return [dataclasses.replace(e, top=e.top[:top]) for e in entries]


def prompt_logprobs_object(entries: list[gen.TokenLogprob] | None, top: int) -> list[dict[str, Any] | None]:
    """vLLM's ``prompt_logprobs``: ``null`` for the first token, then for each token a map from token id
    (a string, as JSON keys are) to ``{"logprob", "rank", "decoded_token"}``: the token's own and its
    position's ``top`` most likely."""
    out: list[dict[str, Any] | None] = []
    for entry in entries or []:
        if entry.logprob is None:
            out.append(None)
            continue
        ranked: dict[str, Any] = {}
        for rank, alternative in enumerate(entry.top[:top], start=1):
            ranked[str(alternative.token_id)] = _vllm_logprob(alternative, rank)
        ranked.setdefault(str(entry.token_id), _vllm_logprob(entry, entry.rank))
        out.append(ranked)
    return out


def _vllm_logprob(entry: gen.TokenLogprob, rank: int | None) -> dict[str, Any]:
    return {"logprob": _floor(entry.logprob), "rank": rank, "decoded_token": entry.token}


def _chat_logprob(entry: gen.TokenLogprob, with_top: bool) -> dict[str, Any]:
    item: dict[str, Any] = {
        "token": entry.token,
        "logprob": _floor(entry.logprob),
        "bytes": entry.bytes if entry.bytes is not None else list(entry.token.encode()),
    }
    if with_top:
        item["top_logprobs"] = [_chat_logprob(t, False) for t in entry.top]
    return item


def _floor(value: float | None) -> float:
    if value is None:  # only a prompt's first token has none, and it is answered as null before this
        return LOGPROB_FLOOR
    return float(value) if value > LOGPROB_FLOOR else LOGPROB_FLOOR  # -inf and NaN too


# -- streaming -----------------------------------------------------------------------------


def stream_job(job: Job) -> Any:
    """SSE chunks for every choice in turn; the first piece is produced before the headers."""
    head, events = start_stream(job)
    return sse_response(_job_events(job, head, events), {REQUEST_LOG_HEADER: job.predictions.request_log_id})


def start_stream(job: Job) -> tuple[list[gen.StreamEvent], Generator[gen.StreamEvent, None, None]]:
    """The stream's first events (its first choice started, its first piece) and the rest."""
    events = job.dataplane.generate_stream(job.mv, job.requests(), job.body, tokenizer=job.tokenizer)
    with capability(job.mv, "chat" if job.chat else "complete"):
        started = next(events)  # the first choice's call: a model that refuses answers an ordinary error
    has_first, piece = first_item(events, "complete")
    if isinstance(piece, gen.StreamPiece):  # prompt scores come with the first piece: else a 400, before the 200
        field = "echo" if job.sampling.echo_logprobs is not None else "prompt_logprobs"
        try:
            gen.check_prompt_logprobs(piece.choice.request, piece.chunk.prompt_logprobs, field)
        except BadRequest:
            close(events)
            raise
    return ([started, piece] if has_first else [started]), events


# -- the Responses API ----------------------------------------------------------------------


@route("/responses", ["POST"])
def responses():
    """OpenAI's Responses API, stateless, answered as the chat it translates to (:mod:`.openai_responses`)."""
    body = json_object()
    stream = req.boolean(body, "stream")
    with responses_api.renamed():
        job = chat_job(responses_api.chat_body(body), stream)
    answer = responses_api.Answer(body, job.mv.name)
    if stream:
        head, events = start_stream(job)
        rendered = responses_api.Events(
            answer, lambda e, offset: logprobs_object(job, e, offset), job.predictions, job.tools
        )
        streamed = responses_api.stream_events(rendered, head, events, error_body)
        return sse_response(streamed, {REQUEST_LOG_HEADER: job.predictions.request_log_id})
    with responses_api.renamed():
        completion = complete_job(job)
    return json_response(responses_api.whole(answer, completion), headers=job.predictions.headers())


def _job_events(
    job: Job, head: list[gen.StreamEvent], events: Generator[gen.StreamEvent, None, None]
) -> Iterator[bytes]:
    chunks = StreamChunks(job)
    try:
        for item in itertools.chain(head, events):
            rendered = chunks.render(item)
            if rendered is not None:
                yield rendered
    except GeneratorExit:
        raise  # the client is gone; finally stops the model
    except Exception as exc:  # the 200 is sent: report in-band, in OpenAI's error shape
        log.warning("completion stream failed: %s", exc)
        yield event(error_body(exc), name="error")
    finally:
        close(events)
    yield DONE
    yield job.predictions.trailer()


class StreamChunks:
    """The events the data plane streams, as OpenAI's SSE chunks: each choice's opening (chat's
    role, the echoed prompt), its pieces, its finish reason; the usage last when asked for."""

    def __init__(self, job: Job):
        self.job = job
        self.extra = {"usage": None} if job.sampling.include_usage else {}
        self.plain: dict[int, PieceEvent] = {}  # by choice index
        self.tool_streams: dict[int, ToolCallStream] = {}  # by choice index, when the model may call tools
        #: where each choice's generated text starts in its answered text (after an echoed prompt)
        self.shift: dict[int, int] = {}

    def render(self, item: gen.StreamEvent) -> bytes | None:
        if isinstance(item, gen.StreamPiece):
            return self.piece(item)
        if isinstance(item, gen.ChoiceStarted):
            return self.opening(item.choice.request)
        if isinstance(item, gen.ChoiceEnded):
            return self.closing(item.choice)
        if self.job.sampling.include_usage:  # the stream ended
            return event(self.job.envelope(choices=[], usage=usage_object(item.usage)))
        return None

    def opening(self, generation: gen.GenerationRequest) -> bytes | None:
        job, index = self.job, self.job.index(generation)
        self.plain[index] = PieceEvent(job, index, self.extra)
        if job.tools is not None:
            self.tool_streams[index] = ToolCallStream(job.tools)
        if job.chat:
            return event(
                job.envelope(choices=[_chat_choice(index, {"role": "assistant", "content": ""})], **self.extra)
            )
        if job.echo and job.sampling.echo_logprobs is None:  # with logprobs: echoed with its scores, first piece
            return event(job.envelope(choices=[_text_choice(index, generation.prompt)], **self.extra))
        return None

    def piece(self, piece: gen.StreamPiece) -> bytes | None:
        """Text alone as prebuilt bytes; with reasoning or log-probabilities the whole object."""
        job, chunk, index = self.job, piece.chunk, self.job.index(piece.choice.request)
        tools = self.tool_streams.get(index)
        if tools is not None:
            return self.tool_delta(index, tools.feed(chunk.text), chunk)
        scored = b"" if chunk.prompt_logprobs is None else self.scored_prompt(piece)
        if chunk.reasoning or (chunk.logprobs is not None and (chunk.text or chunk.logprobs)):
            rendered = _piece(job, index, chunk)
            rendered["logprobs"] = logprobs_object(job, chunk.logprobs, piece.offset + self.shift.get(index, 0))
            return scored + event(job.envelope(choices=[rendered], **self.extra))
        if chunk.text:
            return scored + self.plain[index](chunk.text)
        return scored or None

    def scored_prompt(self, piece: gen.StreamPiece) -> bytes:
        """A completion choice's scored prompt, before its first text: the echoed prompt with its
        ``logprobs`` (``echo``), and vLLM's ``prompt_logprobs`` when asked."""
        job, generation, index = self.job, piece.choice.request, self.job.index(piece.choice.request)
        entries = piece.chunk.prompt_logprobs or []
        opening = _text_choice(index, "")
        if job.sampling.echo_logprobs is not None:
            opening["text"] = generation.prompt
            opening["logprobs"] = logprobs_object(job, _top_cut(entries, job.sampling.echo_logprobs))
            self.shift[index] = len(generation.prompt)
        if job.sampling.prompt_logprobs is not None:
            opening["prompt_logprobs"] = prompt_logprobs_object(entries, job.sampling.prompt_logprobs)
        return event(job.envelope(choices=[opening], **self.extra))

    def closing(self, streamed: gen.StreamedChoice) -> bytes:
        """A choice's finish reason; the request log gets the choice's whole text."""
        job, index = self.job, self.job.index(streamed.request)
        choice = streamed.finished
        closing = _piece(job, index, gen.GenerationChunk())
        closing["finish_reason"] = choice.finish_reason
        head = b""
        tools = self.tool_streams.get(index)
        if tools is not None and job.tools is not None:
            head = self.tool_delta(index, tools.finish(), gen.GenerationChunk()) or b""
            closing["finish_reason"] = job.tools.finish_reason(choice.finish_reason, tools.calls)
        job.predictions.add({"index": index, "text": choice.text, "finish_reason": closing["finish_reason"]})
        return head + event(job.envelope(choices=[closing], **self.extra))

    def tool_delta(self, index: int, delta: Delta, chunk: gen.GenerationChunk) -> bytes | None:
        """A piece of a choice that may call tools: its content and calls' deltas (OpenAI's chunk)."""
        message: dict[str, Any] = {}
        if delta.content:
            message["content"] = delta.content
        if chunk.reasoning:
            message["reasoning_content"] = chunk.reasoning
        if delta.tool_calls:
            message["tool_calls"] = delta.tool_calls
        if not message and not chunk.logprobs:
            return None
        rendered = _chat_choice(index, message)
        if chunk.logprobs is not None:
            rendered["logprobs"] = logprobs_object(self.job, chunk.logprobs)
        return event(self.job.envelope(choices=[rendered], **self.extra))


class PieceEvent:
    """The SSE event of a streamed piece of text, from bytes built once per choice.

    The event of a placeholder piece is built the ordinary way and split at the
    placeholder, so each piece costs one string encoding, and its bytes are those
    :func:`event` would build.
    """

    PLACEHOLDER = "\x00servekit-piece\x00"

    def __init__(self, job: Job, index: int, extra: dict[str, Any]):
        sample = event(job.envelope(choices=[_piece(job, index, gen.GenerationChunk(self.PLACEHOLDER))], **extra))
        self.head, self.tail = sample.split(orjson.dumps(self.PLACEHOLDER))

    def __call__(self, text: str) -> bytes:
        return self.head + orjson.dumps(text) + self.tail


def _piece(job: Job, index: int, chunk: gen.GenerationChunk) -> dict[str, Any]:
    if not job.chat:
        return _text_choice(index, chunk.text)
    delta: dict[str, Any] = {}
    if chunk.text:
        delta["content"] = chunk.text
    if chunk.reasoning:
        delta["reasoning_content"] = chunk.reasoning
    return _chat_choice(index, delta)


def _text_choice(index: int, text: str) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": None, "finish_reason": None}


def _chat_choice(index: int, delta: dict[str, Any]) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}


# -- embeddings ----------------------------------------------------------------------------


@route("/embeddings", ["POST"])
def embeddings():
    body = json_object()
    spec = req.embedding_request(body)
    mv = resolve_model(body)
    tokenizer = dataplane().tokenizer(mv)
    if spec.token_ids is not None:
        spec.texts = token_inputs(mv, tokenizer, spec.token_ids)
    with capability(mv, "embed"):
        embedded = dataplane().embed(mv, spec.texts, body)
    vectors = _as_matrix(embedded, len(spec.texts))
    if spec.dimensions is not None:
        vectors = _truncate(vectors, spec.dimensions)
    encoded = [_encode(v, spec.base64) for v in vectors]
    if spec.token_ids is not None:
        tokens = sum(len(ids) for ids in spec.token_ids)
    else:
        tokens = sum(gen.count_tokens(t, tokenizer) for t in spec.texts)
    payload: dict[str, Any] = {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(encoded)],
        "model": mv.name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    if request.path == "/embeddings":
        payload["embedding"] = encoded  # the unprefixed answer's top-level list (Deeploy's shape)
    handed = predictions()
    for item in payload["data"]:
        handed.add(item)
    return json_response(payload, headers=handed.headers())


def token_inputs(mv: ModelVersion, tokenizer: Any | None, rows: list[list[int]], key: str = "input") -> list[str]:
    """Token-id inputs as :class:`~servekit.dataplane.generation.TokenIds`, checked against the vocabulary.

    As vLLM does, ids are taken in the model's own vocabulary; a model without a
    tokenizer cannot say what they mean, so it takes text only.
    """
    if tokenizer is None:
        raise BadRequest(
            f"model {mv.name!r} has no tokenizer, so it cannot read token ids; send the {key} as text",
            param=key,
        )
    size = gen.vocabulary_size(tokenizer)
    for i, ids in enumerate(rows):
        bad = next((t for t in ids if not 0 <= t < size), None)
        if bad is not None:
            raise BadRequest(
                f"'{key}' item {i}: token id {bad} is outside the model's vocabulary (0..{size - 1})",
                param=key,
            )
    return [gen.TokenIds(tokenizer.decode(ids), ids) for ids in rows]


def _as_matrix(value: Any, rows: int) -> np.ndarray:
    try:
        matrix = np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError):
        raise ModelFailure("embed returned something that is not a matrix of numbers") from None
    if matrix.ndim != 2 or matrix.shape[0] != rows:
        raise ModelFailure(f"embed returned shape {list(matrix.shape)}; expected [{rows}, dim]")
    return matrix


def _truncate(vectors: np.ndarray, dimensions: int) -> np.ndarray:
    """Keep the first ``dimensions`` values; unit-length rows are renormalised (as OpenAI's models)."""
    if dimensions > vectors.shape[1]:
        raise BadRequest(
            f"'dimensions' is {dimensions} but the model's embeddings have {vectors.shape[1]}", param="dimensions"
        )
    norms = np.linalg.norm(vectors, axis=1)
    cut = vectors[:, :dimensions]
    if np.allclose(norms, 1.0, atol=1e-3):
        cut = cut / np.maximum(np.linalg.norm(cut, axis=1, keepdims=True), 1e-12)
    return cut


def _encode(vector: np.ndarray, as_base64: bool) -> Any:
    """One embedding: base64 of its little-endian float32 bytes (as the openai client decodes them),
    else the float32 row itself, which the JSON codec writes at float32's shortest round-trip
    digits (as the V2 and TF Serving answers are written): the same values as a list of Python
    floats would give, in 40% fewer bytes and a seventh of the time (10 us for 384 values)."""
    if as_base64:
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return np.ascontiguousarray(vector, dtype=np.float32)
