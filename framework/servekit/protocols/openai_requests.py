"""Validating OpenAI request bodies (completions, chat, embeddings).

Each reader returns plain values or raises :class:`BadRequest` naming the field
(``param``) and saying what was expected and what was found.  Fields the
framework cannot honour are refused when set to anything but their default, and
fields it does not know are refused as OpenAI refuses them, so nothing the
client asked for is silently dropped (the lists: :mod:`.openai_fields`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from servekit.errors import BadRequest
from servekit.protocols import openai_fields as fields
from servekit.types import GenerationRequest

#: OpenAI's default ``max_tokens`` for the legacy completions endpoint.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
MAX_N = 128
#: the most alternatives a token's ``top_logprobs`` may list: OpenAI's bound for chat,
#: vLLM's default ``max_logprobs`` (OpenAI's completions stop at 5; vLLM's too allow 20)
MAX_LOGPROBS = 20
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool", "function")
#: sampling options handed to the model as sent (vLLM's extensions included)
MODEL_OPTIONS = ("presence_penalty", "frequency_penalty", "top_k", "min_p", "repetition_penalty", "ignore_eos")


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def number(
    body: dict[str, Any], key: str, *, lo: float | None = None, hi: float | None = None, integer: bool = False
) -> Any:
    """``body[key]`` as a number in ``[lo, hi]``, or ``None`` when absent or null."""
    value = body.get(key)
    if value is None:
        return None
    wanted = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise BadRequest(f"'{key}' must be {wanted}, found {_kind(value)} {value!r}", param=key)
    if not math.isfinite(value):  # JSON's NaN and Infinity, which Python's json reads
        raise BadRequest(f"'{key}' must be a finite number, found {value}", param=key)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = (
            f"between {lo} and {hi}"
            if lo is not None and hi is not None
            else (f"at least {lo}" if lo is not None else f"at most {hi}")
        )
        raise BadRequest(f"'{key}' must be {bounds}, found {value}", param=key)
    return value


def boolean(body: dict[str, Any], key: str, default: bool = False) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"'{key}' must be true or false, found {_kind(value)} {value!r}", param=key)
    return value


def stop_sequences(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return list(stop)
    raise BadRequest(f"'stop' must be a string or a list of strings, found {_kind(stop)}", param="stop")


def stream_options(body: dict[str, Any], stream: bool) -> bool:
    """``stream_options.include_usage``; the options are only valid with ``stream: true`` (as vLLM)."""
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise BadRequest("'stream_options' is only allowed when 'stream' is true", param="stream_options")
    if not isinstance(options, dict):
        raise BadRequest(f"'stream_options' must be an object, found {_kind(options)}", param="stream_options")
    return boolean(options, "include_usage")


@dataclass
class Sampling:
    """The sampling fields completions and chat share."""

    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    n: int
    stop: list[str]
    seed: int | None
    stream: bool
    include_usage: bool
    options: dict[str, Any] = field(default_factory=dict)
    #: ``None``: no log-probabilities asked; ``N``: each token's, with its step's ``N`` most likely
    logprobs: int | None = None


def sampling(
    body: dict[str, Any], stream: bool, max_tokens_key: str = "max_tokens", default_max_tokens: int | None = None
) -> Sampling:
    max_tokens = number(body, max_tokens_key, lo=1, integer=True)
    options = {key: body[key] for key in MODEL_OPTIONS if body.get(key) is not None}
    for key in ("presence_penalty", "frequency_penalty"):
        number(body, key, lo=-2, hi=2)
    if number(body, "top_k", integer=True) not in (None, -1) and body["top_k"] < 0:  # vLLM's: -1 or 0 turn it off
        raise BadRequest(f"'top_k' must be -1, 0 or at least 1, found {body['top_k']}", param="top_k")
    number(body, "min_p", lo=0, hi=1)
    number(body, "repetition_penalty", lo=0)
    boolean(body, "ignore_eos")  # vLLM's: generate max_tokens even past the end-of-text token
    if body.get("repetition_penalty") == 0:
        raise BadRequest("'repetition_penalty' must be greater than 0", param="repetition_penalty")
    return Sampling(
        max_tokens=default_max_tokens if max_tokens is None else max_tokens,
        temperature=number(body, "temperature", lo=0, hi=2),
        top_p=_top_p(body),
        n=number(body, "n", lo=1, hi=MAX_N, integer=True) or 1,
        stop=stop_sequences(body),
        seed=number(body, "seed", integer=True),
        stream=stream,
        include_usage=stream_options(body, stream),
        options=options,
    )


def _top_p(body: dict[str, Any]) -> float | None:
    top_p = number(body, "top_p", lo=0, hi=1)
    if top_p == 0:
        raise BadRequest("'top_p' must be greater than 0", param="top_p")
    return top_p


# -- completions ----------------------------------------------------------------------


def prompts(body: dict[str, Any]) -> list[str]:
    """``prompt`` as a list: a string, or a non-empty list of strings (token ids are refused)."""
    if "prompt" not in body:
        raise BadRequest("request has no 'prompt'; expected a string or a list of strings", param="prompt")
    prompt = body["prompt"]
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return list(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, (int, list)) for p in prompt):
        raise BadRequest("token-id prompts are not supported; send the prompt as text", param="prompt")
    raise BadRequest(f"'prompt' must be a string or a non-empty list of strings, found {_kind(prompt)}", param="prompt")


def completion_request(body: dict[str, Any], stream: bool) -> Sampling:
    n = number(body, "n", lo=1, hi=MAX_N, integer=True) or 1
    explain = boolean(body, "explain")  # the explain hook takes the other fields as its parameters
    fields.check_fields(body, fields.COMPLETION_HONOURED, fields.COMPLETION_REFUSED, n=n, pass_unknown=explain)
    logprobs = number(body, "logprobs", lo=0, hi=MAX_LOGPROBS, integer=True)
    if logprobs is not None and boolean(body, "echo"):
        raise BadRequest(
            "'echo' with 'logprobs' is not supported: this server does not score the prompt's tokens",
            param="echo",
        )
    chosen = sampling(body, stream, default_max_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS)
    chosen.logprobs = logprobs
    return chosen


# -- chat -----------------------------------------------------------------------------


def messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Chat messages: roles from OpenAI's set, content a string or text parts."""
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise BadRequest(f"'messages' must be a non-empty list of messages, found {_kind(raw)}", param="messages")
    for i, message in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise BadRequest(f"{where} must be an object with 'role' and 'content'", param="messages")
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise BadRequest(f"{where}.role must be one of {', '.join(CHAT_ROLES)}, found {role!r}", param="messages")
        content = message.get("content")
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise BadRequest(f"{where}.content must be a string or a list of parts", param="messages")
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else _kind(part)
                raise BadRequest(
                    f"{where}.content: only text parts ({{'type': 'text', 'text': ...}}) are supported, found {kind!r}",
                    param="messages",
                )
    return raw


def chat_request(body: dict[str, Any], stream: bool) -> Sampling:
    n = number(body, "n", lo=1, hi=MAX_N, integer=True) or 1
    fields.check_fields(body, fields.CHAT_HONOURED, fields.CHAT_REFUSED, n=n)
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    both = body.get("max_tokens") is not None and key == "max_completion_tokens"
    if both and body["max_tokens"] != body["max_completion_tokens"]:
        raise BadRequest("'max_tokens' and 'max_completion_tokens' disagree; send one", param="max_completion_tokens")
    chosen = sampling(body, stream, max_tokens_key=key)
    chosen.logprobs = chat_logprobs(body)
    return chosen


def chat_logprobs(body: dict[str, Any]) -> int | None:
    """Chat's ``logprobs: true`` with ``top_logprobs: N`` (0 when left out), as OpenAI defines them."""
    wanted = boolean(body, "logprobs")
    top = number(body, "top_logprobs", lo=0, hi=MAX_LOGPROBS, integer=True)
    if top and not wanted:
        raise BadRequest("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    return (top or 0) if wanted else None


def template_kwargs(body: dict[str, Any]) -> dict[str, Any]:
    """vLLM's ``chat_template_kwargs``: extra variables for the chat template."""
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise BadRequest("'chat_template_kwargs' must be an object", param="chat_template_kwargs")
    return kwargs


def generation_requests(
    prompts: list[str], sampling: Sampling, messages: list[dict[str, Any]] | None = None
) -> list[GenerationRequest]:
    """One request per (prompt, choice), in answer order: the ``complete`` hook writes one text at a time.

    Choice ``c`` samples with the request's seed plus ``c``, so ``n`` choices differ
    and each is reproducible.
    """
    s = sampling
    return [
        GenerationRequest(
            prompt=prompt,
            messages=messages,
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            stop=s.stop,
            seed=None if s.seed is None else s.seed + c,
            stream=s.stream,
            prompt_index=p,
            choice_index=c,
            options=dict(s.options),
            logprobs=s.logprobs,
        )
        for p, prompt in enumerate(prompts)
        for c in range(s.n)
    ]


# -- embeddings -----------------------------------------------------------------------


@dataclass
class EmbeddingRequest:
    texts: list[str]
    dimensions: int | None
    base64: bool
    #: the inputs as token ids when they came that way (``texts`` is then empty until decoded)
    token_ids: list[list[int]] | None = None


def embedding_request(body: dict[str, Any]) -> EmbeddingRequest:
    fields.check_fields(body, fields.EMBEDDING_HONOURED, fields.EMBEDDING_REFUSED)
    raw = body.get("input")
    token_ids: list[list[int]] | None = None
    if isinstance(raw, str):
        texts = [raw]
    elif isinstance(raw, list) and raw and all(isinstance(t, str) for t in raw):
        texts = list(raw)
    elif isinstance(raw, list) and raw and all(isinstance(t, (int, list)) for t in raw):
        texts = []
        token_ids = _token_ids(raw)
    else:
        raise BadRequest(f"'input' must be a string or a non-empty list of strings, found {_kind(raw)}", param="input")
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise BadRequest(f"'encoding_format' must be float or base64, found {encoding!r}", param="encoding_format")
    return EmbeddingRequest(texts, number(body, "dimensions", lo=1, integer=True), encoding == "base64", token_ids)


def _token_ids(raw: list[Any]) -> list[list[int]]:
    """``[101, 2023]`` (one input) or ``[[101, 2023], [101]]`` (several), as lists of ints."""
    rows = [raw] if all(isinstance(t, int) for t in raw) else raw
    for i, row in enumerate(rows):
        if not isinstance(row, list) or not row or not all(isinstance(t, int) and not isinstance(t, bool) for t in row):
            raise BadRequest(
                f"'input' item {i} must be a non-empty list of token ids (integers), found {_kind(row)}",
                param="input",
            )
    return [list(row) for row in rows]
