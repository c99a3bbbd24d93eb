"""Which OpenAI request fields this server honours and which it refuses, per endpoint.

The names are the OpenAI API's (the ``openai`` package's ``*CreateParams`` types;
the test suite checks every one of them is listed here) and vLLM's extensions
(its ``protocol.py`` request models).  A field is either honoured (read and
acted on), or refused with a 400 naming it unless it holds a value that changes
nothing (its default: ``null``, ``n`` for ``best_of``, ``"none"`` for
``function_call``...).  A field neither list knows is refused as OpenAI refuses
it (``Unrecognized request argument supplied: X``); vLLM would drop it with a
warning, which would answer something the client did not ask for.  The one
exception: a completions request with ``"explain": true`` hands its other
fields to the model's ``explain`` hook as its parameters.
"""

from __future__ import annotations

from typing import Any

from servekit.errors import BadRequest

#: a value that stands for the request's own ``n`` (``best_of: n`` changes nothing)
SAME_AS_N = object()

#: fields every endpoint reads
_COMMON = frozenset({"model", "user"})
#: the sampling fields completions and chat share (OpenAI's and vLLM's)
_SAMPLING = frozenset(
    {
        "max_tokens", "temperature", "top_p", "n", "stop", "seed", "stream", "stream_options",
        "presence_penalty", "frequency_penalty", "logprobs",
        "top_k", "min_p", "repetition_penalty", "ignore_eos",
        # token rules and prompt scoring (OpenAI's logit_bias, vLLM's others)
        "logit_bias", "min_tokens", "stop_token_ids", "allowed_token_ids", "prompt_logprobs",
    }
)  # fmt: skip

#: structured outputs: OpenAI's ``response_format``, vLLM's ``guided_*`` and ``structured_outputs``
_STRUCTURED = frozenset(
    {"response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs"}
)

COMPLETION_HONOURED = _COMMON | _SAMPLING | _STRUCTURED | {"prompt", "echo", "explain"}
#: (``explain`` is read to refuse it: explanations are answered on completions)
CHAT_HONOURED = (
    _COMMON
    | _SAMPLING
    | _STRUCTURED
    | {"messages", "max_completion_tokens", "top_logprobs", "chat_template_kwargs", "explain"}
    | {"tools", "tool_choice", "parallel_tool_calls"}
)
EMBEDDING_HONOURED = _COMMON | {"input", "dimensions", "encoding_format"}

#: vLLM's generation extensions this server does not implement, with their no-op values
_VLLM_GENERATION_REFUSED: dict[str, tuple[Any, ...]] = {
    "use_beam_search": (None, False),
    "length_penalty": (None, 1, 1.0),
    "include_stop_str_in_output": (None, False),
    "skip_special_tokens": (None, True),
    "spaces_between_special_tokens": (None, True),
    "truncate_prompt_tokens": (None,),
    "bad_words": (None, []),
    "structural_tag": (None,),
    "guided_decoding_backend": (None,),
    "guided_whitespace_pattern": (None,),
    "logits_processors": (None,),
    "return_tokens_as_token_ids": (None, False),
    "return_token_ids": (None, False),
    "priority": (None, 0),
    "request_id": (None,),
    "cache_salt": (None,),
    "kv_transfer_params": (None,),
    "vllm_xargs": (None,),
    "mm_processor_kwargs": (None,),
}

COMPLETION_REFUSED: dict[str, tuple[Any, ...]] = {
    # OpenAI's
    "suffix": (None, ""),
    "best_of": (None, SAME_AS_N),
    # vLLM's
    **_VLLM_GENERATION_REFUSED,
    "add_special_tokens": (None, True),
    "prompt_embeds": (None,),
}

CHAT_REFUSED: dict[str, tuple[Any, ...]] = {
    # OpenAI's
    "functions": (None, []),
    "function_call": (None, "none"),
    "modalities": (None, ["text"]),
    "audio": (None,),
    "prediction": (None,),
    "reasoning_effort": (None,),
    "verbosity": (None, "medium"),
    "web_search_options": (None,),
    "store": (None, False),
    "metadata": (None, {}),
    "service_tier": (None, "auto", "default"),
    "moderation": (None,),
    "prompt_cache_key": (None,),
    "prompt_cache_options": (None,),
    "prompt_cache_retention": (None,),
    "safety_identifier": (None,),
    # vLLM's
    **_VLLM_GENERATION_REFUSED,
    "best_of": (None, SAME_AS_N),
    "echo": (None, False),
    "add_generation_prompt": (None, True),
    "continue_final_message": (None, False),
    "add_special_tokens": (None, False),
    "documents": (None,),
    "chat_template": (None,),
    "include_reasoning": (None, True),
}

EMBEDDING_REFUSED: dict[str, tuple[Any, ...]] = {
    # vLLM's
    "truncate_prompt_tokens": (None,),
    "add_special_tokens": (None, True),
    "normalize": (None,),
    "embed_dtype": (None, "float32"),
    "additional_data": (None,),
    "priority": (None, 0),
    "request_id": (None,),
    "mm_processor_kwargs": (None,),
}


def check_fields(
    body: dict[str, Any],
    honoured: frozenset[str],
    refused: dict[str, tuple[Any, ...]],
    *,
    n: int = 1,
    pass_unknown: bool = False,
) -> None:
    """A 400 naming the first field this server cannot honour: refused and not at a no-op value, or unknown."""
    for key, value in body.items():
        if key in honoured:
            continue
        if key in refused:
            neutral = tuple(n if v is SAME_AS_N else v for v in refused[key])
            if not any(_same(value, v) for v in neutral):
                raise BadRequest(f"'{key}' is not supported by this server (found {value!r})", param=key)
        elif not pass_unknown:
            raise BadRequest(f"Unrecognized request argument supplied: {key}", param=key)


def _same(value: Any, neutral: Any) -> bool:
    """Equal and of the same kind (``true`` is not ``1``, ``0.0`` is ``0``)."""
    if isinstance(value, bool) != isinstance(neutral, bool):
        return False
    return bool(value == neutral)
