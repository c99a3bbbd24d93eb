"""Triton's generate requests, whichever wire they came on: reading them and running them.

Triton's generate extension (``POST /v2/models/NAME/generate`` and
``.../generate_stream``) and the LLM backends' ``ModelStreamInfer`` (vLLM's and
TensorRT-LLM's) take the same fields: a ``text_input``, sampling settings, and a
few switches.  Over HTTP Triton turns the body's top-level fields into tensors
and its ``parameters`` object into request parameters; over gRPC they come as
input tensors and request parameters themselves.  Clients use all three places:
TensorRT-LLM's examples send ``max_tokens`` as a top-level field (a tensor),
vLLM's send them as request parameters or as one ``sampling_parameters`` JSON
string.  So every place is read, merged, and a setting given twice with two
values is refused.

Settings are vLLM's ``SamplingParams`` names that a :class:`GenerationRequest`
carries (``max_tokens`` defaults to 16, as vLLM's and OpenAI completions'), plus
TensorRT-LLM's spellings of the same (``stop_words``, ``random_seed``) and its
switches at their defaults (``bad_words`` empty, ``beam_width`` 1).  Anything
else is refused with a 400 naming it: a setting silently dropped would answer
something the client did not ask for.  The text then runs through the data
plane like an OpenAI completion (``DataPlane.generate`` and ``generate_stream``
call the model's ``complete`` hook, cut stop sequences and count tokens), so the
same prompt and settings answer the same text.
"""

from __future__ import annotations

import json
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from servekit.codecs.infer_request import UNHONOURED_REQUEST_PARAMETERS, UNSET
from servekit.dataplane import generation as gen
from servekit.dataplane.data_plane import DataPlane
from servekit.dataplane.repository import ModelVersion
from servekit.errors import BadRequest, NotImplementedByModel
from servekit.protocols import openai_requests as req

TEXT_INPUT = "text_input"
TEXT_OUTPUT = "text_output"
#: vLLM's switches: whether to stream (a tensor), to leave the prompt out of a whole answer,
#: and which of its additional outputs to send
SWITCHES: tuple[str, ...] = ("stream", "exclude_input_in_output")
SWITCHES += ("return_finish_reason", "return_num_input_tokens", "return_num_output_tokens")
#: the settings a GenerationRequest carries, by vLLM's names
SAMPLING = ("max_tokens", "temperature", "top_p", "seed", "stop", "n", *req.MODEL_OPTIONS)
#: TensorRT-LLM's names for the same settings
ALIASES = {"stop_words": "stop", "random_seed": "seed"}
#: TensorRT-LLM's settings that are accepted at the value that changes nothing
NEUTRAL: dict[str, tuple[Any, ...]] = {"bad_words": ("", [], None), "beam_width": (1, None)}
DEFAULT_MAX_TOKENS = 16
#: Triton's request-level scheduling parameters, which tritonclient sets from its own
#: arguments (``priority=``, ``timeout=``) when they are not the default: servekit's
#: scheduler is first come, first served, so they are refused unless unset
SCHEDULING = UNHONOURED_REQUEST_PARAMETERS
#: settings a string may spell (gRPC parameters had no floating-point type before
#: Triton 2.4x, so tritonclient sends ``"0.7"``; vLLM's backend converts them too)
INTEGERS = ("max_tokens", "seed", "top_k", "n")
FLOATS = ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")
BOOLEANS = ("ignore_eos", *SWITCHES)


@dataclass
class GenerateSpec:
    """One generate request, read and checked."""

    prompt: str
    sampling: req.Sampling
    #: the client's ``stream`` switch; ``None`` when it sent none (the route decides)
    stream: bool | None = None
    #: vLLM's default prepends the prompt to a whole answer; Triton's generate examples
    #: and TensorRT-LLM's ensembles do not, which is the default here
    exclude_input: bool = True
    #: vLLM's additional outputs asked for: ``finish_reason``, ``num_input_tokens``, ``num_output_tokens``
    extras: set[str] = field(default_factory=set)

    def request(self, stream: bool) -> gen.GenerationRequest:
        s = self.sampling
        return gen.GenerationRequest(
            prompt=self.prompt,
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            stop=s.stop,
            seed=s.seed,
            stream=stream,
            options=dict(s.options),
        )


def read(prompt: Any, fields: dict[str, Any], parameters: dict[str, Any]) -> GenerateSpec:
    """A spec from the prompt, the other fields (top-level keys or input tensors) and the parameters."""
    if not isinstance(prompt, str):
        kind = "missing" if prompt is None else f"a {type(prompt).__name__}"
        raise BadRequest(f"'{TEXT_INPUT}' must be a string (the prompt), found {kind}")
    merged = _merge(fields, parameters)
    unknown = sorted(k for k in merged if k not in SAMPLING and k not in SWITCHES)
    if unknown:
        raise BadRequest(
            f"unknown generate setting(s): {', '.join(unknown)}; "
            f"this server takes {', '.join(SAMPLING + tuple(ALIASES) + tuple(NEUTRAL) + SWITCHES)}"
        )
    if merged.get("n", 1) != 1:
        raise BadRequest(f"'n' must be 1 (one text per generate request), found {merged['n']!r}")
    sampling = req.sampling(merged, stream=False, default_max_tokens=DEFAULT_MAX_TOKENS)
    switches = {key: req.boolean(merged, key) for key in SWITCHES if key in merged}
    extras = {key.removeprefix("return_") for key in SWITCHES[2:] if switches.get(key)}
    return GenerateSpec(prompt, sampling, switches.get("stream"), switches.get("exclude_input_in_output", True), extras)


def _merge(fields: dict[str, Any], parameters: dict[str, Any]) -> dict[str, Any]:
    """Every place a setting can come from, in one dict; one setting with two values is refused."""
    places: list[dict[str, Any]] = [fields, parameters]
    for place in (fields, parameters):
        if "sampling_parameters" in place:
            places.append(_sampling_parameters(place["sampling_parameters"]))
    merged: dict[str, Any] = {}
    for place in places:
        for key, value in place.items():
            if key == "sampling_parameters":
                continue
            if key in SCHEDULING:
                if value not in UNSET:
                    raise BadRequest(f"'{key}' is not supported by this server (found {value!r})")
                continue
            if key in NEUTRAL:
                if value not in NEUTRAL[key]:
                    raise BadRequest(f"'{key}' is not supported by this server (found {value!r})")
                continue
            key = ALIASES.get(key, key)
            if key == "stop" and value == "":
                continue  # TensorRT-LLM's examples send empty stop words for none
            value = _unstring(key, value)
            if key in merged and merged[key] != value:
                raise BadRequest(f"'{key}' is given twice with different values ({merged[key]!r} and {value!r})")
            merged[key] = value
    return merged


def _unstring(key: str, value: Any) -> Any:
    """A number or switch spelled as a string, as its type; anything else as it came."""
    if not isinstance(value, str):
        return value
    try:
        if key in INTEGERS:
            return int(value)
        if key in FLOATS:
            return float(value)
    except ValueError:
        return value  # the checks name the setting and what it should be
    if key in BOOLEANS and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return value


def _sampling_parameters(raw: Any) -> dict[str, Any]:
    """vLLM's ``sampling_parameters``: the settings as one JSON object in a string."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="replace")
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise BadRequest("'sampling_parameters' must be a JSON object in a string, e.g. '{\"max_tokens\": 16}'")
    return value


# -- tensors (gRPC) ---------------------------------------------------------------------


def tensor_fields(inputs: dict[str, np.ndarray]) -> tuple[Any, dict[str, Any]]:
    """The prompt and the other fields from input tensors: each holds one element."""
    values: dict[str, Any] = {}
    for name, array in inputs.items():
        if array.size != 1:
            raise BadRequest(f"input {name!r} must hold one element, found shape {list(array.shape)}")
        value = array.reshape(-1)[0]
        if isinstance(value, bytes):
            value = value.decode("utf-8", errors="replace")
        values[name] = value.item() if isinstance(value, np.generic) else value
    return values.pop(TEXT_INPUT, None), values


# -- running ----------------------------------------------------------------------------


class NotGenerative(BadRequest):
    """The model has no ``complete`` hook: it cannot answer a generate request."""

    def __init__(self, name: str):
        self.name = name
        super().__init__(
            f"model {name!r} is not a generative model (it does not implement 'complete'); "
            "generate and generate_stream need a text-generation model; use infer for this one"
        )


def whole(dp: DataPlane, mv: ModelVersion, spec: GenerateSpec, parameters: dict[str, Any]) -> gen.Choice:
    """The whole generated text, as OpenAI completions would answer it; a model without
    ``complete`` is a 400 naming it."""
    try:
        generated = dp.generate(mv, [spec.request(stream=False)], parameters)
    except NotImplementedByModel:
        raise NotGenerative(mv.name) from None
    _, choice = generated.choices[0]  # one request: one choice
    return choice


def stream(
    dp: DataPlane, mv: ModelVersion, spec: GenerateSpec, parameters: dict[str, Any]
) -> Generator[gen.StreamEvent, None, None]:
    """The data plane's stream from its first piece on, the model's call made here (a model
    without ``complete`` is a 400 naming it, before any response).  Closing the stream stops
    the model: the scheduler drops the sequence at its next step."""
    events = dp.generate_stream(mv, [spec.request(stream=True)], parameters)
    try:
        next(events)  # the choice started: the model took the request
    except NotImplementedByModel:
        raise NotGenerative(mv.name) from None
    return events


def extras(spec: GenerateSpec, streamed: gen.StreamedChoice, chunk: gen.GenerationChunk, final: bool) -> dict[str, Any]:
    """The additional outputs asked for, on the response carrying ``chunk`` (vLLM: on every response).

    ``num_output_tokens`` is vLLM's: the tokens this response adds; ``finish_reason``
    is set on the ``final`` response only.
    """
    out: dict[str, Any] = {}
    if "finish_reason" in spec.extras:
        out["finish_reason"] = streamed.reported_finish_reason(chunk) if final else None
    if "num_input_tokens" in spec.extras:
        out["num_input_tokens"] = streamed.prompt_tokens(chunk)
    if "num_output_tokens" in spec.extras:
        out["num_output_tokens"] = streamed.added_tokens(chunk)
    return out


def whole_extras(spec: GenerateSpec, choice: gen.Choice) -> dict[str, Any]:
    """The additional outputs of a whole answer."""
    values = {
        "finish_reason": choice.finish_reason,
        "num_input_tokens": choice.prompt_tokens,
        "num_output_tokens": choice.completion_tokens,
    }
    return {key: value for key, value in values.items() if key in spec.extras}


def answer_text(spec: GenerateSpec, choice: gen.Choice) -> str:
    return choice.text if spec.exclude_input else spec.prompt + choice.text
