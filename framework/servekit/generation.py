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
from dataclasses import dataclass, field
from typing import Any, Protocol

from .errors import BadRequest, ModelFailure
from .streams import close, is_stream

FINISH_STOP = "stop"
FINISH_LENGTH = "length"


@dataclass
class GenerationRequest:
    """One text to generate.

    ``None`` in a sampling field means the client did not set it: the model
    applies its own default (the Hugging Face plugin uses OpenAI's: temperature 1,
    top_p 1).
    """

    #: the text to continue: the completion prompt, or the chat formatted by the
    #: model's chat template (or the documented fallback when it has none)
    prompt: str
    #: chat messages as the client sent them (``None`` for completions)
    messages: list[dict[str, Any]] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    #: the model may stop early on these; the framework cuts the text at them anyway
    stop: list[str] = field(default_factory=list)
    #: per-choice seed (the request's seed plus the choice number), for reproducible sampling
    seed: int | None = None
    #: True when the client streams; a model may then return a generator
    stream: bool = False
    #: which prompt (for several prompts) and which of the ``n`` choices this is
    prompt_index: int = 0
    choice_index: int = 0
    #: further sampling options a model may support (``top_k``, ``repetition_penalty``,
    #: ``presence_penalty``, ``frequency_penalty``...), exactly as sent
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def is_chat(self) -> bool:
        return self.messages is not None


@dataclass
class GenerationResult:
    """A whole generated text.  Token counts the model leaves out are counted by the framework."""

    text: str
    #: ``"stop"`` (end of text or a stop sequence) or ``"length"`` (``max_tokens`` reached)
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    #: the model's reasoning, answered as chat's ``reasoning_content``
    reasoning: str | None = None


@dataclass
class GenerationChunk:
    """One piece of a streamed text; a generator may also yield plain ``str`` pieces."""

    text: str = ""
    finish_reason: str | None = None
    #: running totals, when the model knows them
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    reasoning: str | None = None


class Tokenizer(Protocol):
    """What the ``tokenizer`` hook returns; a Hugging Face tokenizer fits as is."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


class TokenIds(str):
    """An embeddings input sent as token ids: the decoded text, with the ids in ``token_ids``.

    The OpenAI API (and LangChain's ``OpenAIEmbeddings``) may send token ids
    instead of text.  The ``embed`` hook still receives strings, so a model
    that only reads text works; a plugin that can embed ids exactly (the
    Hugging Face encoder) reads ``token_ids`` instead of re-tokenizing.
    """

    token_ids: list[int]

    def __new__(cls, text: str, token_ids: list[int]) -> TokenIds:
        made = super().__new__(cls, text)
        made.token_ids = list(token_ids)
        return made


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
        last = GenerationChunk()
        for chunk in stream_pieces(request, output):
            pieces.append(chunk.text)
            reasoning.append(chunk.reasoning or "")
            last = chunk
        return make_choice(
            request,
            GenerationResult(
                "".join(pieces),
                last.finish_reason,
                last.prompt_tokens,
                last.completion_tokens,
                "".join(reasoning) or None,
            ),
            tokenizer,
            already_cut=True,
        )
    return make_choice(request, as_result(output), tokenizer)


def make_choice(
    request: GenerationRequest, result: GenerationResult, tokenizer: Any | None, already_cut: bool = False
) -> Choice:
    text, stopped = (result.text, False) if already_cut else cut_at_stop(result.text, request.stop)
    completion_tokens = (
        result.completion_tokens if result.completion_tokens is not None else count_tokens(text, tokenizer)
    )
    prompt_tokens = (
        result.prompt_tokens if result.prompt_tokens is not None else count_tokens(request.prompt, tokenizer)
    )
    reason = FINISH_STOP if stopped else finish_reason(result.finish_reason, completion_tokens, request.max_tokens)
    return Choice(text, reason, prompt_tokens, completion_tokens, result.reasoning)


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
                    result.text, result.finish_reason, result.prompt_tokens, result.completion_tokens, result.reasoning
                )
            ]
        )
    scanner = StopScanner(request.stop)
    reason: str | None = None
    prompt_tokens = completion_tokens = None
    try:
        for item in output:
            if isinstance(item, str):
                item = GenerationChunk(item)
            elif not isinstance(item, GenerationChunk):
                raise ModelFailure(f"complete yielded {type(item).__name__}; expected str or GenerationChunk")
            prompt_tokens = item.prompt_tokens if item.prompt_tokens is not None else prompt_tokens
            completion_tokens = item.completion_tokens if item.completion_tokens is not None else completion_tokens
            reason = item.finish_reason or reason
            text = scanner.feed(item.text)
            if scanner.stopped:
                yield GenerationChunk(text, FINISH_STOP, prompt_tokens, completion_tokens, item.reasoning)
                return
            if text or item.reasoning:
                yield GenerationChunk(text, None, prompt_tokens, completion_tokens, item.reasoning)
    finally:
        close(output)  # stop sequence, client gone or done: the model stops generating
    yield GenerationChunk(scanner.flush(), reason, prompt_tokens, completion_tokens)


__all__ = [
    "GenerationChunk",
    "GenerationRequest",
    "GenerationResult",
    "Tokenizer",
    "count_tokens",
    "format_chat",
]
