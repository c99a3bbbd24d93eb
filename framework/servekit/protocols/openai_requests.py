"""Validating OpenAI request bodies (completions, chat, embeddings).

Each reader returns plain values or raises :class:`BadRequest` naming the field
(``param``) and saying what was expected and what was found.  Fields the
framework cannot honour are refused when set to anything but their default, and
fields it does not know are refused as OpenAI refuses them, so nothing the
client asked for is silently dropped (the lists: :mod:`.openai_fields`).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from servekit.dataplane.tool_calls import PARSERS, ToolUse, detect_parser
from servekit.errors import BadRequest
from servekit.protocols import openai_fields as fields
from servekit.types import Constraint, GenerationRequest, TokenIds

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


def model_name(body: dict[str, Any], served: list[str]) -> str:
    """The body's ``model``; left out (or empty), the only served model's name, else a 400 naming them."""
    name = body.get("model")
    if name is None or name == "":
        if len(served) != 1:
            raise BadRequest(f"'model' is required; served models: {', '.join(served) or 'none'}", param="model")
        return served[0]
    if not isinstance(name, str):
        raise BadRequest(f"'model' must be a string, found {type(name).__name__}", param="model")
    return name


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
    #: completions' ``echo`` with ``logprobs``: the prompt's tokens scored, with ``N`` most likely each
    echo_logprobs: int | None = None
    #: vLLM's ``prompt_logprobs``
    prompt_logprobs: int | None = None

    @property
    def scored_prompt(self) -> int | None:
        """What the model is asked to score the prompt with (the most alternatives either field wants)."""
        asked = [n for n in (self.echo_logprobs, self.prompt_logprobs) if n is not None]
        return max(asked) if asked else None


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
    options.update(token_options(body))
    limit = default_max_tokens if max_tokens is None else max_tokens
    if limit is not None and options.get("min_tokens", 0) > limit:
        raise BadRequest(
            f"'min_tokens' ({options['min_tokens']}) must be at most '{max_tokens_key}' ({limit})", param="min_tokens"
        )
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


def prompts(body: dict[str, Any]) -> list[str] | list[list[int]]:
    """``prompt`` as a list: a string or a non-empty list of strings, or token ids (a list of ints:
    one prompt; a list of such lists: several), which come back as lists of ints."""
    if "prompt" not in body:
        raise BadRequest("request has no 'prompt'; expected a string, a list of strings or token ids", param="prompt")
    prompt = body["prompt"]
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return list(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, (int, list)) for p in prompt):
        return _token_ids(prompt, "prompt")
    raise BadRequest(
        f"'prompt' must be a string or a non-empty list of strings (or of token ids), found {_kind(prompt)}",
        param="prompt",
    )


def completion_request(body: dict[str, Any], stream: bool) -> Sampling:
    n = number(body, "n", lo=1, hi=MAX_N, integer=True) or 1
    explain = boolean(body, "explain")  # the explain hook takes the other fields as its parameters
    fields.check_fields(body, fields.COMPLETION_HONOURED, fields.COMPLETION_REFUSED, n=n, pass_unknown=explain)
    logprobs = number(body, "logprobs", lo=0, hi=MAX_LOGPROBS, integer=True)
    echo = boolean(body, "echo")
    if body.get("max_tokens") == 0 and not isinstance(body["max_tokens"], bool):
        if not echo:  # OpenAI's legacy rule: nothing to generate makes sense only to echo (and score) the prompt
            raise BadRequest("'max_tokens' must be at least 1; 0 is allowed only with 'echo': true", param="max_tokens")
        body = {**body, "max_tokens": None}
        chosen = sampling(body, stream)
        chosen.max_tokens = 0
    else:
        chosen = sampling(body, stream, default_max_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS)
    chosen.logprobs = logprobs
    chosen.echo_logprobs = logprobs if echo else None
    chosen.prompt_logprobs = prompt_logprobs(body)
    return chosen


def prompt_logprobs(body: dict[str, Any], streams: bool = True) -> int | None:
    """vLLM's ``prompt_logprobs``: each prompt token's log-probability and its position's N most likely
    (streamed with a choice's first chunk where ``streams``, else a whole answer only)."""
    wanted = number(body, "prompt_logprobs", lo=0, hi=MAX_LOGPROBS, integer=True)
    if wanted is not None and not streams and boolean(body, "stream"):
        raise BadRequest(
            "'prompt_logprobs' is answered whole on chat, not streamed: send it with 'stream': false",
            param="prompt_logprobs",
        )
    return wanted


# -- token rules ----------------------------------------------------------------------

#: the token rules' fields, handed to the model in ``options``
TOKEN_RULES = ("logit_bias", "min_tokens", "stop_token_ids", "allowed_token_ids")


def token_options(body: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's ``logit_bias`` and vLLM's ``min_tokens``, ``stop_token_ids`` and ``allowed_token_ids``,
    checked and handed to the model in ``options`` (``logit_bias`` with its keys as integers).

    Ids are checked against the model's vocabulary by the model, which knows it.
    """
    options: dict[str, Any] = {}
    bias = body.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict):
            raise BadRequest(
                f"'logit_bias' must be an object of token ids to numbers, found {_kind(bias)}", param="logit_bias"
            )
        parsed: dict[int, float] = {}
        for key, value in bias.items():
            try:
                token = int(key)
            except ValueError:
                raise BadRequest(
                    f"'logit_bias' keys must be token ids (integers as strings), found {key!r}", param="logit_bias"
                ) from None
            parsed[token] = number({"logit_bias": value}, "logit_bias", lo=-100, hi=100)
        if parsed:
            options["logit_bias"] = parsed
    min_tokens = number(body, "min_tokens", lo=0, integer=True)
    if min_tokens:
        options["min_tokens"] = min_tokens
    for key in ("stop_token_ids", "allowed_token_ids"):
        ids = body.get(key)
        if ids is None or (key == "stop_token_ids" and ids == []):
            continue
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise BadRequest(f"'{key}' must be a non-empty list of token ids (integers), found {ids!r}", param=key)
        options[key] = list(ids)
    return options


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
    chosen.prompt_logprobs = prompt_logprobs(body, streams=False)
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
    prompts: list[str] | list[TokenIds],
    sampling: Sampling,
    messages: list[dict[str, Any]] | None = None,
    constraint: Constraint | None = None,
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
            constraint=constraint,
            prompt_logprobs=s.scored_prompt,
        )
        for p, prompt in enumerate(prompts)
        for c in range(s.n)
    ]


# -- structured outputs -----------------------------------------------------------------

#: vLLM's structured-output fields (the older ``guided_*`` extra fields and the newer
#: ``structured_outputs`` object's keys), by the constraint kind each asks for
GUIDED_FIELDS = {"guided_json": "json_schema", "guided_regex": "regex", "guided_choice": "choice",
                 "guided_grammar": "grammar"}  # fmt: skip
STRUCTURED_OUTPUTS_KEYS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar",
                           "json_object": "json_object"}  # fmt: skip


def constraint(body: dict[str, Any]) -> Constraint | None:
    """The grammar the text must match: ``response_format`` (OpenAI's), vLLM's ``guided_*`` fields or
    its ``structured_outputs`` object; at most one of them."""
    found: list[Constraint] = []
    chosen = _response_format(body.get("response_format"))
    if chosen is not None:
        found.append(chosen)
    for key, kind in GUIDED_FIELDS.items():
        if body.get(key) is not None:
            found.append(_constraint_value(kind, body[key], key))
    outputs = body.get("structured_outputs")
    if outputs is not None:
        if not isinstance(outputs, dict):
            raise BadRequest(
                f"'structured_outputs' must be an object, found {_kind(outputs)}", param="structured_outputs"
            )
        for key, value in outputs.items():
            where = f"structured_outputs.{key}"
            if key not in STRUCTURED_OUTPUTS_KEYS:
                if value in (None, False):
                    continue
                raise BadRequest(f"'{where}' is not supported by this server (found {value!r})", param=where)
            if value is None or (key == "json_object" and value is False):
                continue
            found.append(_constraint_value(STRUCTURED_OUTPUTS_KEYS[key], value, where))
    if len(found) > 1:
        names = ", ".join(f"'{c.param}'" for c in found)
        raise BadRequest(f"only one structured-output constraint may be sent; found {names}", param=found[1].param)
    return found[0] if found else None


def _response_format(value: Any) -> Constraint | None:
    key = "response_format"
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadRequest(f"'{key}' must be an object, found {_kind(value)}", param=key)
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint("json_object", None, key)
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict):
            raise BadRequest(f"'{key}.json_schema' must be an object, found {_kind(spec)}", param=key)
        if not isinstance(spec.get("name"), str) or not spec["name"]:
            raise BadRequest(f"'{key}.json_schema.name' must be a non-empty string", param=key)
        boolean(spec, "strict")  # the schema is always enforced, strict or not
        schema = spec.get("schema")
        if schema is None:  # OpenAI's schema is optional: any JSON object then
            return Constraint("json_object", None, key)
        return _constraint_value("json_schema", schema, key)
    raise BadRequest(f"'{key}.type' must be text, json_object or json_schema, found {kind!r}", param=key)


def _constraint_value(kind: str, value: Any, param: str) -> Constraint:
    if kind == "json_schema":
        if isinstance(value, str):  # vLLM takes a schema as JSON text too
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise BadRequest(f"'{param}' is not valid JSON: {exc}", param=param) from None
        if not isinstance(value, (dict, bool)):
            raise BadRequest(f"'{param}' must be a JSON schema (an object), found {_kind(value)}", param=param)
    elif kind == "json_object":
        if value is not True:
            raise BadRequest(f"'{param}' must be true, found {value!r}", param=param)
        value = None
    elif kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
            raise BadRequest(f"'{param}' must be a non-empty list of strings, found {_kind(value)}", param=param)
    elif not isinstance(value, str) or not value:
        raise BadRequest(f"'{param}' must be a non-empty string, found {_kind(value)}", param=param)
    return Constraint(kind, value, param)


# -- tools ----------------------------------------------------------------------------

TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function's name


def tool_use(body: dict[str, Any], chat_template: Any, parser_option: Any) -> ToolUse | None:
    """``tools``, ``tool_choice`` and ``parallel_tool_calls`` (OpenAI's); ``None``: no tool may be called.

    ``auto`` needs a parser for the model's family: the model's ``options.tool_call_parser``,
    else the one its chat template shows (:func:`detect_parser`).
    """
    tools = _tools(body.get("tools"))
    choice = body.get("tool_choice")
    parallel = boolean(body, "parallel_tool_calls", default=True)
    named = None
    if isinstance(choice, dict):
        function = choice.get("function")
        if (
            choice.get("type") != "function"
            or not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
        ):
            raise BadRequest(
                '\'tool_choice\' must be none, auto, required or {"type": "function", "function": {"name": ...}}',
                param="tool_choice",
            )
        named = function["name"]
        if named not in {t["function"]["name"] for t in tools}:
            raise BadRequest(
                f"'tool_choice' names the function {named!r}, which is not in 'tools'", param="tool_choice"
            )
        choice = "named"
    elif choice is None:
        choice = "auto" if tools else "none"
    elif choice not in ("none", "auto", "required"):
        raise BadRequest(
            f"'tool_choice' must be none, auto, required or a named function, found {choice!r}", param="tool_choice"
        )
    if choice != "none" and not tools:
        raise BadRequest(f"'tool_choice' is {choice!r} but the request has no 'tools'", param="tool_choice")
    if choice == "none":
        return None
    parser = None
    if choice == "auto":
        if not chat_template:
            raise BadRequest(
                "this model has no chat template to present 'tools' with; send tool_choice 'required' or a named function",
                param="tools",
            )
        if parser_option is not None and parser_option not in PARSERS:
            raise BadRequest(
                f"the model's options.tool_call_parser is {parser_option!r}; expected one of {', '.join(PARSERS)}",
                param="tools",
            )
        parser = parser_option or detect_parser(chat_template)
        if parser is None:
            raise BadRequest(
                "this model's chat template shows no tool-call format this server reads, so 'tool_choice': 'auto' "
                "cannot find its calls; send 'required' or a named function, or set the model's "
                f"options.tool_call_parser ({', '.join(PARSERS)})",
                param="tool_choice",
            )
    return ToolUse(tools, choice, named, parallel, parser)


def _tools(raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise BadRequest(f"'tools' must be a list of tools, found {_kind(raw)}", param="tools")
    names = set()
    for i, tool in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise BadRequest(f"{where} must be {{'type': 'function', 'function': {{...}}}}", param="tools")
        function = tool["function"]
        name = function.get("name")
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise BadRequest(
                f"{where}.function.name must be 1 to 64 letters, digits, _ or -, found {name!r}", param="tools"
            )
        if name in names:
            raise BadRequest(f"{where}.function.name {name!r} appears twice", param="tools")
        names.add(name)
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise BadRequest(f"{where}.function.parameters must be a JSON schema (an object)", param="tools")
        boolean(function, "strict")
    return raw


def check_tool_messages(messages: list[dict[str, Any]]) -> None:
    """Assistant ``tool_calls`` and ``tool`` messages in the history, as OpenAI shapes them."""
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        calls = message.get("tool_calls")
        if calls is not None:
            if message.get("role") != "assistant" or not isinstance(calls, list):
                raise BadRequest(f"{where}.tool_calls must be a list on an assistant message", param="messages")
            for k, call in enumerate(calls):
                function = call.get("function") if isinstance(call, dict) else None
                if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                    raise BadRequest(
                        f"{where}.tool_calls[{k}] must be {{'id', 'type': 'function', 'function': {{'name', 'arguments'}}}}",
                        param="messages",
                    )
                if not isinstance(function.get("arguments", ""), str):
                    raise BadRequest(f"{where}.tool_calls[{k}].function.arguments must be JSON text", param="messages")
        if message.get("role") == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise BadRequest(f"{where} (role tool) needs the 'tool_call_id' it answers", param="messages")


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


def _token_ids(raw: list[Any], key: str = "input") -> list[list[int]]:
    """``[101, 2023]`` (one input) or ``[[101, 2023], [101]]`` (several), as lists of ints."""
    rows = [raw] if all(isinstance(t, int) for t in raw) else raw
    for i, row in enumerate(rows):
        if not isinstance(row, list) or not row or not all(isinstance(t, int) and not isinstance(t, bool) for t in row):
            raise BadRequest(
                f"'{key}' item {i} must be a non-empty list of token ids (integers), found {_kind(row)}",
                param=key,
            )
    return [list(row) for row in rows]
