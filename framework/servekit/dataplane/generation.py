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
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from servekit.errors import BadRequest, ModelFailure
from servekit.streams import close, is_stream

# The generation types are shared (the ``complete`` hook's signature names them): they live in
# servekit.types and are re-exported here, where the framework's side of generation uses them.
from servekit.types import (
    FINISH_LENGTH,
    FINISH_STOP,
    GenerationChunk,
    GenerationRequest,
    GenerationResult,
    TokenIds,
    Tokenizer,
    TokenLogprob,
)

__all__ = [
    "FINISH_LENGTH",
    "FINISH_STOP",
    "GenerationChunk",
    "GenerationRequest",
    "GenerationResult",
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


def format_chat(messages: list[dict[str, Any]], tokenizer: Any | None, template_kwargs: dict[str, Any]) -> str:
    """The prompt for a chat: the tokenizer's chat template, else the plain fallback.

    The fallback (for a model without a tokenizer or template) writes one
    ``role: content`` line per message and ends with ``assistant:``.
    """
    plain = [{**m, "content": message_text(m)} for m in messages]
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        try:
            text = tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=True, **template_kwargs)
        except Exception as exc:  # a template may reject a role or an order of messages
            raise BadRequest(f"the model's chat template rejected the messages: {exc}", param="messages") from None
        return text if isinstance(text, str) else str(text)
    lines = [f"{m['role']}: {m['content']}" for m in plain]
    return "\n".join(lines + ["assistant:"])


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


# -- log-probabilities ----------------------------------------------------------------


NO_LOGPROBS = (
    "this model does not return log-probabilities (its complete hook gave none); send the request without 'logprobs'"
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
        last = GenerationChunk()
        for chunk in stream_pieces(request, output):
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
            ),
            tokenizer,
            already_cut=True,
        )
    return make_choice(request, as_result(output), tokenizer)


def make_choice(
    request: GenerationRequest, result: GenerationResult, tokenizer: Any | None, already_cut: bool = False
) -> Choice:
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
    return Choice(text, reason, prompt_tokens, completion_tokens, result.reasoning, logprobs)


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
                )
            ]
        )
    scanner = StopScanner(request.stop)
    track = None if request.logprobs is None else LogprobTrack()
    sent = 0
    reason: str | None = None
    prompt_tokens = completion_tokens = None
    try:
        for item in output:
            item = _as_chunk(item)
            check_logprobs(request, item.text, item.logprobs)
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
                yield GenerationChunk(text, FINISH_STOP, prompt_tokens, completion_tokens, item.reasoning, logprobs)
                return
            if text or item.reasoning or logprobs:
                yield GenerationChunk(text, None, prompt_tokens, completion_tokens, item.reasoning, logprobs)
    finally:
        close(output)  # stop sequence, client gone or done: the model stops generating
    rest = None if track is None else track.rest()
    yield GenerationChunk(scanner.flush(), reason, prompt_tokens, completion_tokens, logprobs=rest)


def _as_chunk(item: Any) -> GenerationChunk:
    if isinstance(item, str):
        return GenerationChunk(item)
    if not isinstance(item, GenerationChunk):
        raise ModelFailure(f"complete yielded {type(item).__name__}; expected str or GenerationChunk")
    return item


__all__ = [
    "GenerationChunk",
    "GenerationRequest",
    "GenerationResult",
    "TokenLogprob",
    "Tokenizer",
    "count_tokens",
    "format_chat",
]
