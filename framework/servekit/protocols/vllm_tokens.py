"""vLLM's ``POST /tokenize`` and ``POST /detokenize``, with the model's own tokenizer.

``/tokenize`` takes a completion's ``{"model", "prompt"}`` or a chat's
``{"model", "messages"}`` (formatted by the model's chat template, as chat
completions format it) and answers ``{"count", "max_model_len", "tokens"}``
(with ``token_strs`` when ``return_token_strs`` is true); ``/detokenize`` takes
``{"model", "tokens"}`` and answers ``{"prompt"}``.  TEI's ``/tokenize`` (a body
with ``inputs``) shares the route and is told apart by its body
(:mod:`.retrieval`).  Errors take OpenAI's shape, as vLLM's; fields these
requests define that servekit does not honour are refused with a 400 naming them.
"""

from __future__ import annotations

from typing import Any

from servekit.dataplane import generation as gen
from servekit.dataplane.data_plane import DataPlane
from servekit.dataplane.repository import ModelVersion
from servekit.errors import BadRequest, ServekitError, openai_error
from servekit.protocols import openai_requests as req
from servekit.protocols.http import Answer, json_answer

#: the fields of vLLM's tokenize requests (completion's, then chat's) and of its detokenize request
PROMPT_FIELDS = ("model", "prompt", "add_special_tokens", "return_token_strs")
CHAT_FIELDS = (
    "model", "messages", "add_generation_prompt", "continue_final_message", "add_special_tokens",
    "chat_template_kwargs", "return_token_strs", "chat_template", "tools", "mm_processor_kwargs",
)  # fmt: skip
#: chat fields read only at their no-op value
CHAT_REFUSED: dict[str, tuple[Any, ...]] = {"continue_final_message": (None, False), "chat_template": (None,), "tools": (None, []),
                "mm_processor_kwargs": (None,)}  # fmt: skip
DETOKENIZE_FIELDS = ("model", "tokens")


def is_vllm_tokenize(body: dict[str, Any]) -> bool:
    """A vLLM tokenize body (``prompt`` or ``messages``), not TEI's (``inputs``)."""
    return "inputs" not in body and ("prompt" in body or "messages" in body)


def _answer_errors(handler: Any) -> Any:
    def run(dp: DataPlane, body: dict[str, Any]) -> Answer:
        try:
            answer: Answer = handler(dp, body)
            return answer
        except ServekitError as exc:
            return json_answer(openai_error(exc), exc.status)

    run.__doc__ = handler.__doc__
    return run


def _model(dp: DataPlane, body: dict[str, Any]) -> tuple[ModelVersion, Any]:
    """The named model (or the only one served) and its tokenizer."""
    mv = dp.resolve(req.model_name(body, dp.model_names()))
    tokenizer = dp.tokenizer(mv)
    if tokenizer is None:
        raise BadRequest(f"model {mv.name!r} has no tokenizer", param="model")
    return mv, tokenizer


def _known(body: dict[str, Any], known: tuple[str, ...]) -> None:
    for key in body:
        if key not in known:
            raise BadRequest(f"Unrecognized request argument supplied: {key}", param=key)


def _max_model_len(mv: ModelVersion, tokenizer: Any) -> int | None:
    """The model's context (the Hugging Face plugin's ``context``), else the tokenizer's limit."""
    for value in (getattr(mv.model, "context", None), getattr(tokenizer, "model_max_length", None)):
        if isinstance(value, int) and 0 < value < 1 << 40:  # transformers' "no limit" is a huge number
            return value
    return None


@_answer_errors
def tokenize(dp: DataPlane, body: dict[str, Any]) -> Answer:
    chat = "messages" in body
    _known(body, CHAT_FIELDS if chat else PROMPT_FIELDS)
    strings = req.boolean(body, "return_token_strs")
    mv, tokenizer = _model(dp, body)
    if chat:
        for key, neutral in CHAT_REFUSED.items():
            if key in body and body[key] not in neutral:
                raise BadRequest(f"'{key}' is not supported by this server (found {body[key]!r})", param=key)
        messages = req.messages(body)
        if not req.boolean(body, "add_generation_prompt", True):
            raise BadRequest(
                "'add_generation_prompt': false is not supported: chat prompts end with the assistant's turn",
                param="add_generation_prompt",
            )
        text = gen.format_chat(messages, tokenizer, req.template_kwargs(body))
        special = req.boolean(body, "add_special_tokens", False)  # the template wrote them
    else:
        text = body["prompt"]
        if not isinstance(text, str):
            raise BadRequest(f"'prompt' must be a string, found {type(text).__name__}", param="prompt")
        special = req.boolean(body, "add_special_tokens", True)
    ids = [int(t) for t in tokenizer(text, add_special_tokens=special)["input_ids"]]
    answer: dict[str, Any] = {"count": len(ids), "max_model_len": _max_model_len(mv, tokenizer), "tokens": ids}
    answer["token_strs"] = tokenizer.convert_ids_to_tokens(ids) if strings else None
    return json_answer(answer)


@_answer_errors
def detokenize(dp: DataPlane, body: dict[str, Any]) -> Answer:
    _known(body, DETOKENIZE_FIELDS)
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise BadRequest("'tokens' must be a list of token ids (integers)", param="tokens")
    mv, tokenizer = _model(dp, body)
    size = gen.vocabulary_size(tokenizer)
    bad = next((t for t in tokens if not 0 <= t < size), None)
    if bad is not None:
        raise BadRequest(f"token id {bad} is outside the model's vocabulary (0..{size - 1})", param="tokens")
    return json_answer({"prompt": tokenizer.decode(tokens)})
