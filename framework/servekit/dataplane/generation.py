"""Generative models: what the ``complete`` hook receives and returns, and the
framework's side of generation (chat formatting, stop sequences, usage).

A model's ``complete`` hook sees one :class:`GenerationRequest` per choice: the
framework expands a request with several prompts and ``n`` > 1 into one call per
(prompt, choice), so a model only ever writes one text at a time.  The hook
returns a :class:`GenerationResult` (or a plain ``str``), or a generator of text
pieces (``str`` or :class:`GenerationChunk`) to stream.  The framework applies
stop sequences to the generated text (streams included: it holds back text that
could be the start of a stop sequence, and closes the generator once one
appears), counts tokens where the model did not, and decides the finish reason.

Every protocol gets its answer assembled here, through the data plane
(``DataPlane.generate`` and ``DataPlane.generate_stream``), so OpenAI's
completions and chat and Triton's generate, over HTTP and gRPC, cut, count and
finish a text the same way: a whole answer is a :class:`Generated` (each
choice, the usage), a stream a sequence of :data:`StreamEvent`.  A protocol
only renders them in its wire's shape.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeAlias

from servekit.errors import BadRequest, ModelFailure
from servekit.observability import generation_metrics
from servekit.streams import close, is_stream

# The generation types are shared (the ``complete`` hook's signature names them): they live in
# servekit.types and are re-exported here, where the framework's side of generation uses them.
from servekit.types import (
    FINISH_LENGTH,
    FINISH_STOP,
    Constraint,
    GenerationChunk,
    GenerationRequest,
    GenerationResult,
    GenerationTiming,
    TokenIds,
    Tokenizer,
    TokenLogprob,
)

__all__ = [
    "Constraint",
    "FINISH_LENGTH",
    "FINISH_STOP",
    "GenerationChunk",
    "GenerationRequest",
    "GenerationResult",
    "GenerationTiming",
    "TokenIds",
    "TokenLogprob",
    "Tokenizer",
]


def vocabulary_size(tokenizer: Any) -> int:
    """How many ids the tokenizer knows (added tokens included)."""
    try:
        return len(tokenizer)
    except TypeError:
        return int(tokenizer.vocab_size)


# -- chat formatting and token counts -------------------------------------------------


def message_text(message: dict[str, Any]) -> str:
    """A chat message's content as text (OpenAI allows a list of ``{"type": "text"}`` parts)."""
    content = message.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(part["text"] for part in content)


def format_chat(
    messages: list[dict[str, Any]],
    tokenizer: Any | None,
    template_kwargs: dict[str, Any],
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """The prompt for a chat: the tokenizer's chat template, else the plain fallback.

    ``tools`` (OpenAI's ``tools`` list) are handed to the template as ``tools=``, and an
    assistant message's ``tool_calls`` arguments as objects (the templates' convention;
    OpenAI sends them as JSON text).  The fallback (for a model without a tokenizer or
    template) writes one ``role: content`` line per message and ends with ``assistant:``.
    """
    plain = [_template_message(m) for m in messages]
    if tools:
        template_kwargs = {**template_kwargs, "tools": tools}
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        try:
            text = tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=True, **template_kwargs)
        except Exception as exc:  # a template may reject a role or an order of messages
            raise BadRequest(f"the model's chat template rejected the messages: {exc}", param="messages") from None
        return text if isinstance(text, str) else str(text)
    lines = [f"{m['role']}: {m['content']}" for m in plain]
    return "\n".join(lines + ["assistant:"])


def _template_message(message: dict[str, Any]) -> dict[str, Any]:
    plain = {**message, "content": message_text(message)}
    calls = message.get("tool_calls")
    if calls:
        plain["tool_calls"] = [
            {**call, "function": {**call["function"], "arguments": _arguments(call["function"].get("arguments"))}}
            for call in calls
        ]
    return plain


def _arguments(arguments: Any) -> Any:
    """A tool call's arguments as an object when they are JSON text (as the chat templates expect)."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def count_tokens(text: str, tokenizer: Any | None) -> int:
    """Tokens in ``text``: the model's tokenizer, else whitespace-separated words (an estimate)."""
    if not text:
        return 0
    if tokenizer is not None:
        try:
            return len(tokenizer.encode(text, add_special_tokens=False))
        except TypeError:
            return len(tokenizer.encode(text))
    return len(text.split())


# -- stop sequences -------------------------------------------------------------------


class StopScanner:
    """Cuts streamed text at the first stop sequence, across piece boundaries.

    Text that could still turn out to be the start of a stop sequence is held
    back until the next piece decides it, so a stop sequence is never sent.
    """

    def __init__(self, stop: list[str]):
        self.stop = [s for s in stop if s]
        self.pending = ""
        self.stopped = False

    def feed(self, piece: str) -> str:
        """The text that can be sent now; sets :attr:`stopped` when a stop sequence appeared."""
        if self.stopped:
            return ""
        self.pending += piece
        if not self.stop:
            out, self.pending = self.pending, ""
            return out
        cut = min((i for i in (self.pending.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            out, self.pending, self.stopped = self.pending[:cut], "", True
            return out
        hold = self._held_back()
        out = self.pending[: len(self.pending) - hold]
        self.pending = self.pending[len(self.pending) - hold :]
        return out

    def flush(self) -> str:
        out, self.pending = ("" if self.stopped else self.pending), ""
        return out

    def _held_back(self) -> int:
        """Length of the longest end of the pending text that starts some stop sequence."""
        longest = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(self.pending)), longest, -1):
                if self.pending.endswith(s[:k]):
                    longest = k
                    break
        return longest


def cut_at_stop(text: str, stop: list[str]) -> tuple[str, bool]:
    scanner = StopScanner(stop)
    out = scanner.feed(text)
    return (out, True) if scanner.stopped else (out + scanner.flush(), False)


# -- running the hook -----------------------------------------------------------------


@dataclass
class Choice:
    """One finished choice, as the protocol reports it."""

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    reasoning: str | None = None
    #: one per token of ``text`` when the request asked for log-probabilities, else ``None``
    logprobs: list[TokenLogprob] | None = None
    #: where the time went, when the model measured it
    timing: GenerationTiming | None = None
    #: one per prompt token when the request asked for them (``request.prompt_logprobs``), else ``None``
    prompt_logprobs: list[TokenLogprob] | None = None


# -- log-probabilities ----------------------------------------------------------------


NO_LOGPROBS = (
    "this model does not return log-probabilities (its complete hook gave none); send the request without 'logprobs'"
)


def check_prompt_logprobs(request: GenerationRequest, scored: list[TokenLogprob] | None, field: str) -> None:
    """A model asked to score the prompt that answered without its scores: a 400 naming ``field``."""
    if request.prompt_logprobs is not None and scored is None:
        raise BadRequest(
            f"this model does not score the prompt's tokens (its complete hook gave no prompt_logprobs); "
            f"send the request without '{field}'",
            param=field,
        )


def token_length(entry: TokenLogprob) -> int:
    """The characters a token adds to the text (a token holding part of a character adds none)."""
    if entry.bytes is None:
        return len(entry.token)
    return len(bytes(entry.bytes).decode("utf-8", "ignore"))


def text_offsets(entries: list[TokenLogprob], start: int = 0) -> list[int]:
    """Where each token's text starts in the text (completions' ``text_offset``)."""
    offsets = []
    for entry in entries:
        offsets.append(start)
        start += token_length(entry)
    return offsets


class LogprobTrack:
    """Hands on each token's log-probability with the text it starts in.

    Text may be held back (a possible stop sequence) or cut (a stop sequence):
    a token is released once text up to its start has been sent, and a token
    starting after a stop sequence's cut is dropped, so the log-probabilities
    match the text the client gets, streamed or whole.
    """

    def __init__(self) -> None:
        self.pending: list[tuple[int, TokenLogprob]] = []
        self.end = 0  # where the next token's text starts

    def add(self, entries: list[TokenLogprob]) -> None:
        for entry in entries:
            self.pending.append((self.end, entry))
            self.end += token_length(entry)

    def release(self, sent: int) -> list[TokenLogprob]:
        """The tokens that start before the ``sent`` characters of text."""
        ready = [entry for start, entry in self.pending if start < sent]
        self.pending = self.pending[len(ready) :]
        return ready

    def rest(self) -> list[TokenLogprob]:
        ready, self.pending = [entry for _, entry in self.pending], []
        return ready


def check_logprobs(request: GenerationRequest, text: str, logprobs: list[TokenLogprob] | None) -> None:
    """A model asked for log-probabilities that answered text without them: a 400, not a silent null."""
    if request.logprobs is not None and text and logprobs is None:
        raise BadRequest(NO_LOGPROBS, param="logprobs")


def check_constraint(request: GenerationRequest, text: str, constrained: bool) -> None:
    """A model that answered text without decoding under the request's constraint: a 400 naming the
    field, never free text where a schema, a pattern or a tool call was asked for."""
    constraint = request.constraint
    if constraint is not None and text and not constrained:
        raise BadRequest(
            f"this model cannot decode under a grammar, so it cannot honour '{constraint.param}' "
            "(its complete hook answered without the constraint); send the request without it",
            param=constraint.param,
        )


def finish_reason(given: str | None, completion_tokens: int, max_tokens: int | None) -> str:
    if given in (FINISH_STOP, FINISH_LENGTH):
        return given
    if given is not None:
        return str(given)
    if max_tokens is not None and completion_tokens >= max_tokens:
        return FINISH_LENGTH
    return FINISH_STOP


def as_result(value: Any) -> GenerationResult:
    if isinstance(value, GenerationResult):
        return value
    if isinstance(value, str):
        return GenerationResult(text=value)
    raise ModelFailure(f"complete returned {type(value).__name__}; expected a GenerationResult, a str or a generator")


def collect(request: GenerationRequest, output: Any, tokenizer: Any | None) -> Choice:
    """A whole choice from what ``complete`` returned (a result, a string or a stream)."""
    if is_stream(output):
        pieces: list[str] = []
        reasoning: list[str] = []
        logprobs: list[TokenLogprob] | None = None if request.logprobs is None else []
        prompt_scored: list[TokenLogprob] | None = None
        last = GenerationChunk()
        for chunk in stream_pieces(request, output):
            prompt_scored = chunk.prompt_logprobs if chunk.prompt_logprobs is not None else prompt_scored
            pieces.append(chunk.text)
            reasoning.append(chunk.reasoning or "")
            if logprobs is not None:
                logprobs.extend(chunk.logprobs or [])
            last = chunk
        return make_choice(
            request,
            GenerationResult(
                "".join(pieces),
                last.finish_reason,
                last.prompt_tokens,
                last.completion_tokens,
                "".join(reasoning) or None,
                logprobs,
                last.timing,
                prompt_logprobs=prompt_scored,
            ),
            tokenizer,
            already_cut=True,
        )
    return make_choice(request, as_result(output), tokenizer)


def make_choice(
    request: GenerationRequest, result: GenerationResult, tokenizer: Any | None, already_cut: bool = False
) -> Choice:
    if not already_cut:  # a stream's pieces were checked as they came
        check_constraint(request, result.text, result.constrained)
    text, stopped = (result.text, False) if already_cut else cut_at_stop(result.text, request.stop)
    logprobs = None
    if request.logprobs is not None:
        if not already_cut:  # a stream's pieces were checked as they came
            check_logprobs(request, result.text, result.logprobs)
        logprobs = list(result.logprobs or [])
        if stopped:  # the tokens after the stop sequence's cut are not in the text
            track = LogprobTrack()
            track.add(logprobs)
            logprobs = track.release(len(text))
    completion_tokens = (
        result.completion_tokens if result.completion_tokens is not None else count_tokens(text, tokenizer)
    )
    prompt_tokens = (
        result.prompt_tokens if result.prompt_tokens is not None else count_tokens(request.prompt, tokenizer)
    )
    reason = FINISH_STOP if stopped else finish_reason(result.finish_reason, completion_tokens, request.max_tokens)
    return Choice(
        text,
        reason,
        prompt_tokens,
        completion_tokens,
        result.reasoning,
        logprobs,
        result.timing,
        result.prompt_logprobs,
    )


def stream_pieces(request: GenerationRequest, output: Any) -> Generator[GenerationChunk, None, None]:
    """Normalise a streaming ``complete`` to chunks, stop sequences applied.

    The last chunk carries the finish reason (``"stop"`` when a stop sequence
    cut the text) and the model's running token counts.  Closing this iterator
    (client gone) or hitting a stop sequence closes the model's generator.
    """
    if not is_stream(output):
        result = as_result(output)
        output = iter(
            [
                GenerationChunk(
                    result.text,
                    result.finish_reason,
                    result.prompt_tokens,
                    result.completion_tokens,
                    result.reasoning,
                    result.logprobs,
                    result.timing,
                    result.constrained,
                    result.prompt_logprobs,
                )
            ]
        )
    scanner = StopScanner(request.stop)
    track = None if request.logprobs is None else LogprobTrack()
    sent = 0
    reason: str | None = None
    prompt_tokens = completion_tokens = None
    timing: GenerationTiming | None = None
    prompt_scored: list[TokenLogprob] | None = None  # handed on with the next chunk
    try:
        for item in output:
            item = _as_chunk(item)
            prompt_scored = item.prompt_logprobs if item.prompt_logprobs is not None else prompt_scored
            check_logprobs(request, item.text, item.logprobs)
            check_constraint(request, item.text, item.constrained)
            timing = item.timing or timing
            prompt_tokens = item.prompt_tokens if item.prompt_tokens is not None else prompt_tokens
            completion_tokens = item.completion_tokens if item.completion_tokens is not None else completion_tokens
            reason = item.finish_reason or reason
            text = scanner.feed(item.text)
            sent += len(text)
            logprobs = None
            if track is not None:
                track.add(item.logprobs or [])
                logprobs = track.release(sent)
            if scanner.stopped:
                yield GenerationChunk(
                    text,
                    FINISH_STOP,
                    prompt_tokens,
                    completion_tokens,
                    item.reasoning,
                    logprobs,
                    timing,
                    prompt_logprobs=prompt_scored,
                )
                return
            if text or item.reasoning or logprobs or prompt_scored is not None:
                yield GenerationChunk(
                    text,
                    None,
                    prompt_tokens,
                    completion_tokens,
                    item.reasoning,
                    logprobs,
                    prompt_logprobs=prompt_scored,
                )
                prompt_scored = None
    finally:
        close(output)  # stop sequence, client gone or done: the model stops generating
    rest = None if track is None else track.rest()
    yield GenerationChunk(
        scanner.flush(),
        reason,
        prompt_tokens,
        completion_tokens,
        logprobs=rest,
        timing=timing,
        prompt_logprobs=prompt_scored,
    )


def _as_chunk(item: Any) -> GenerationChunk:
    if isinstance(item, str):
        return GenerationChunk(item)
    if not isinstance(item, GenerationChunk):
        raise ModelFailure(f"complete yielded {type(item).__name__}; expected str or GenerationChunk")
    return item


def model_failure(name: str, exc: Exception) -> ModelFailure:
    """A model's failure while its answer was read (a streaming ``complete``'s generator raised),
    in the words the data plane gives a hook's failure."""
    return ModelFailure(f"model {name!r} failed in complete: {type(exc).__name__}: {exc}")


# -- a whole answer -------------------------------------------------------------------


@dataclass
class Usage:
    """A whole answer's token counts: each prompt's tokens once (its choices share the prompt),
    every choice's completion tokens."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    #: every choice's timing summed, when the model measured each one's (else ``None``)
    timing: GenerationTiming | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def usage_of(finished: Iterable[tuple[GenerationRequest, Choice]]) -> Usage:
    prompt_tokens: dict[int, int] = {}
    completion_tokens = 0
    timings: list[GenerationTiming | None] = []
    for request, choice in finished:
        prompt_tokens[request.prompt_index] = choice.prompt_tokens
        completion_tokens += choice.completion_tokens
        timings.append(choice.timing)
    return Usage(sum(prompt_tokens.values()), completion_tokens, summed_timing(timings))


def summed_timing(timings: list[GenerationTiming | None]) -> GenerationTiming | None:
    """The choices' timings added up; ``None`` unless the model measured every one."""
    if not timings or any(t is None for t in timings):
        return None
    measured = [t for t in timings if t is not None]
    return GenerationTiming(
        sum(t.queue for t in measured), sum(t.prefill for t in measured), sum(t.decode for t in measured)
    )


@dataclass
class Generated:
    """The whole answer to a generation request: each choice with the request it answers, in order."""

    choices: list[tuple[GenerationRequest, Choice]]
    usage: Usage


#: The model's call for one request: ``complete`` through the data plane, as the hook answered.
Start: TypeAlias = Callable[[GenerationRequest], Any]


def generate_whole(
    requests: Iterable[GenerationRequest],
    start: Start,
    tokenizer: Any | None,
    model: str = "",
    arrived: float | None = None,
) -> Generated:
    """Every request's choice, one after another (each call starts once the one before it is done).

    Each choice counts on ``/metrics`` under ``model`` (:func:`observe_choice`); the answer's
    timing goes to the response's headers (:func:`.generation_metrics.answer_timed`).
    """
    arrived = time.monotonic() if arrived is None else arrived
    choices = []
    for request in requests:
        choice = collect(request, start(request), tokenizer)
        ended = time.monotonic()
        # a whole answer's first token: before its last by the decode time the model measured
        first = ended - (choice.timing.decode if choice.timing is not None else 0.0)
        observe_choice(model, choice, arrived, first, ended)
        choices.append((request, choice))
    generated = Generated(choices, usage_of(choices))
    usage = generated.usage
    generation_metrics.answer_timed(
        time.monotonic() - arrived, usage.prompt_tokens, usage.completion_tokens, usage.timing
    )
    return generated


def observe_choice(model: str, choice: Choice, arrived: float, first: float | None, ended: float) -> None:
    """One finished choice on ``/metrics``: its first and last token's time from the generation's
    arrival, its tokens and its finish reason."""
    generation_metrics.choice_done(
        model,
        first_token=None if first is None else max(0.0, first - arrived),
        total=max(0.0, ended - arrived),
        prompt_tokens=choice.prompt_tokens,
        completion_tokens=choice.completion_tokens,
        finish_reason=choice.finish_reason,
    )


# -- a stream -------------------------------------------------------------------------


class StreamedChoice:
    """One choice of a stream, as its pieces go out: the text so far, the model's last running
    counts, and what a wire reports with each piece or at the end."""

    def __init__(self, request: GenerationRequest, tokenizer: Any | None):
        self.request = request
        self.tokenizer = tokenizer
        self.texts: list[str] = []
        self.last = GenerationChunk()
        self.offset = 0  # where the next token's text starts (completions' text_offset)
        self.sent_tokens = 0  # the tokens the per-piece counts reported so far
        self.prompt_logprobs: list[TokenLogprob] | None = None

    def add(self, chunk: GenerationChunk) -> StreamPiece:
        piece = StreamPiece(self, chunk, self.offset)
        if chunk.prompt_logprobs is not None:
            self.prompt_logprobs = chunk.prompt_logprobs
        self.texts.append(chunk.text)
        self.last = chunk
        if chunk.logprobs:
            self.offset += sum(token_length(entry) for entry in chunk.logprobs)
        return piece

    @property
    def text(self) -> str:
        return "".join(self.texts)

    @property
    def closing(self) -> GenerationChunk:
        """The end as a piece without text: the model's last finish reason and running counts."""
        last = self.last
        return GenerationChunk("", last.finish_reason, last.prompt_tokens, last.completion_tokens)

    @cached_property
    def finished(self) -> Choice:
        """The choice as a whole answer has it (finish reason, token counts); counted when first asked."""
        last = self.last
        result = GenerationResult(
            self.text,
            last.finish_reason,
            last.prompt_tokens,
            last.completion_tokens,
            timing=last.timing,
            prompt_logprobs=self.prompt_logprobs,
        )
        return make_choice(self.request, result, self.tokenizer, already_cut=True)

    # Per-piece counts (vLLM's additional outputs report them on every response): asked
    # piece by piece, in order, since each piece's output tokens are those it adds.

    def prompt_tokens(self, chunk: GenerationChunk) -> int:
        """The prompt's tokens: the model's count, else the tokenizer's (a word estimate without one)."""
        if chunk.prompt_tokens is not None:
            return chunk.prompt_tokens
        return count_tokens(self.request.prompt, self.tokenizer)

    def added_tokens(self, chunk: GenerationChunk) -> int:
        """The tokens ``chunk`` adds to those reported before it."""
        if chunk.completion_tokens is not None:  # the model's running total
            added = max(chunk.completion_tokens - self.sent_tokens, 0)
        else:  # the model does not count: the tokenizer does (or a word estimate without one)
            added = count_tokens(chunk.text, self.tokenizer)
        self.sent_tokens += added
        return added

    def reported_finish_reason(self, chunk: GenerationChunk) -> str:
        """The finish reason of the piece ending the stream, from the tokens the pieces reported."""
        done = chunk.completion_tokens if chunk.completion_tokens is not None else self.sent_tokens
        return finish_reason(chunk.finish_reason, done, self.request.max_tokens)


@dataclass
class ChoiceStarted:
    """A choice's model call was made (``complete`` answered); its pieces follow."""

    choice: StreamedChoice


@dataclass(slots=True)  # one per piece streamed: built in the stream's hot loop
class StreamPiece:
    """One piece of a choice, stop sequences applied (the model's own chunk, or its string)."""

    choice: StreamedChoice
    chunk: GenerationChunk
    #: where the piece's first token's text starts in the choice's text
    offset: int


@dataclass
class ChoiceEnded:
    """A choice's last piece went out: its finish reason and counts are known."""

    choice: StreamedChoice


@dataclass
class StreamEnded:
    """Every choice ended."""

    choices: list[StreamedChoice]

    @property
    def usage(self) -> Usage:
        return usage_of((choice.request, choice.finished) for choice in self.choices)


StreamEvent: TypeAlias = ChoiceStarted | StreamPiece | ChoiceEnded | StreamEnded


def stream_choices(
    requests: Iterable[GenerationRequest],
    start: Start,
    tokenizer: Any | None,
    model: str = "",
    arrived: float | None = None,
) -> Generator[StreamEvent, None, None]:
    """Every request's choice streamed in turn: its start, its pieces, its end; then the end of all.

    A choice's call is made when the one before it ended and the consumer asks
    for more.  Closing this generator (client gone) closes the model's.  Each
    choice counts on ``/metrics`` under ``model``, its first token timed when its
    first piece with text, reasoning or tokens is handed on, from ``arrived`` (``time.monotonic``;
    default: the first event asked for); a choice the client left counts as aborted.
    """
    arrived = time.monotonic() if arrived is None else arrived
    ended: list[StreamedChoice] = []
    pieces: Generator[GenerationChunk, None, None] | None = None
    choice: StreamedChoice | None = None
    first: float | None = None
    try:
        for request in requests:
            pieces = stream_pieces(request, start(request))
            streamed = choice = StreamedChoice(request, tokenizer)
            first = None
            yield ChoiceStarted(streamed)
            for chunk in pieces:
                if first is None and (chunk.text or chunk.reasoning or chunk.completion_tokens):
                    first = time.monotonic()
                yield streamed.add(chunk)
            choice = None  # ended: counted once, here
            observe_choice(model, streamed.finished, arrived, first, time.monotonic())
            yield ChoiceEnded(streamed)
            ended.append(streamed)
        yield StreamEnded(ended)
    finally:
        close(pieces)
        if choice is not None:  # started and never ended: the client left, or the model failed
            _observe_abort(model, choice, arrived, first)


def _observe_abort(model: str, choice: StreamedChoice, arrived: float, first: float | None) -> None:
    """A choice whose stream the client left (or that failed) after it started: vLLM's ``abort``."""
    last = choice.last
    now = time.monotonic()
    generation_metrics.choice_done(
        model,
        first_token=None if first is None else max(0.0, first - arrived),
        total=max(0.0, now - arrived),
        prompt_tokens=last.prompt_tokens or 0,
        completion_tokens=last.completion_tokens or choice.sent_tokens,
        finish_reason=generation_metrics.ABORT,
    )
