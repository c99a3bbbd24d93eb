"""Plain data types shared by the core, the protocols and plugins: tensors and metadata,
a model's settings, where a version runs, the request log, and what the ``complete``
hook receives and returns.

This module imports nothing from servekit, so any module (``hookspecs`` included)
can name these types without joining an import cycle.
"""

from __future__ import annotations

import json
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pluggy

#: Decoded request tensors: named (``dict``) or one unnamed array.
Tensors = dict[str, np.ndarray] | np.ndarray

DEFAULT_SIGNATURE = "serving_default"
PREDICT_METHOD = "tensorflow/serving/predict"
CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"


@dataclass
class TensorSpec:
    """One input or output of a signature.

    ``datatype`` uses the V2 names (``FP32``, ``INT64``, ``BYTES``, ``BOOL``...);
    ``shape`` uses ``-1`` for a dimension of any size and ``None`` for unknown rank;
    ``tensor_name`` is the underlying graph tensor (TensorFlow's ``x:0``), if any;
    ``labels`` name the classes along an output's last axis (Triton's classification
    extension answers with them, :mod:`servekit.dataplane.classification`).

    What an input takes is checked before the model is called
    (:func:`servekit.dataplane.data_plane.check_values`): a numeric input refuses
    strings and booleans, and a floating-point one NaN and ±Infinity unless it
    says it takes them: ``allow_nan`` for a model that reads NaN as a missing
    value (tree boosters, HistGradientBoosting), ``allow_infinity`` for one that
    computes with infinities (TF Serving and Triton pass both on unchecked).
    """

    name: str
    datatype: str
    shape: list[int] | None
    tensor_name: str | None = None
    labels: list[str] | None = None
    allow_nan: bool = False
    allow_infinity: bool = False


@dataclass
class Signature:
    """A named function of the model (TensorFlow's SignatureDef)."""

    inputs: list[TensorSpec] = field(default_factory=list)
    outputs: list[TensorSpec] = field(default_factory=list)
    method_name: str = PREDICT_METHOD
    #: TensorFlow's default input values; ``None`` where the SignatureDef has none
    defaults: dict[str, Any] | None = field(default_factory=dict)


@dataclass
class ModelMetadata:
    """What the ``metadata`` hook returns: the model's signatures and platform."""

    signatures: dict[str, Signature] = field(default_factory=dict)
    platform: str = ""
    #: The signature used when a request names none.
    default_signature: str = DEFAULT_SIGNATURE

    def signature(self, name: str | None = None) -> Signature | None:
        return self.signatures.get(name or self.default_signature)


@dataclass
class BatchingConfig:
    max_batch_size: int = 0
    max_batch_time_ms: float = 0.0


@dataclass
class SequenceConfig:
    """``sequence:`` of servekit.yaml: the model keeps a state per sequence (servekit.dataplane.sequences)."""

    max_idle_ms: float = 1000.0
    #: a request outside any sequence (no ``sequence_id``) is refused, as Triton's sequence batcher does
    require_sequence_id: bool = False
    #: tensors the server feeds ``predict`` beside the request's (Triton's ``control_input``), each
    #: ``{name, kind: start|end|ready|corrid, datatype, shape, values: [false, true]}``
    controls: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class QueuePolicy:
    """How long a request may wait in a version's queue and how many may wait (Triton's ``ModelQueuePolicy``)."""

    #: ``reject``: a request whose timeout passed is answered 504 without being computed;
    #: ``delay``: it goes behind every request still in time
    timeout_action: str = "reject"
    #: 0: no timeout unless the request sets one
    default_timeout_ms: float = 0.0
    #: whether a request's own ``timeout`` parameter (or header) replaces the default
    allow_timeout_override: bool = True
    #: 0: no bound; beyond it a request is answered 503 at once
    max_queue_size: int = 0


@dataclass
class QueueConfig:
    """``queue:`` of servekit.yaml (Triton's ``dynamic_batching`` priority and queue fields)."""

    #: 0: one level, first come first served; N: levels 1 (first) to N
    priority_levels: int = 0
    #: the level of a request that names none (0: the middle of the levels)
    default_priority_level: int = 0
    default_policy: QueuePolicy = field(default_factory=QueuePolicy)
    #: per level, what overrides the default policy
    level_policies: dict[int, QueuePolicy] = field(default_factory=dict)

    def policy(self, level: int) -> QueuePolicy:
        return self.level_policies.get(level, self.default_policy)


@dataclass
class TrafficConfig:
    """``traffic:`` of servekit.yaml: a model name's requests split between targets by weight."""

    #: ``(target, weight)``: an int target is a version of this model, a str one another model
    weights: list[tuple[int | str, float]] = field(default_factory=list)
    #: a request header whose value keeps a client on one target, or ``api_key`` (its key); "" none
    sticky: str = ""


@dataclass
class ShadowConfig:
    """``shadow:`` of servekit.yaml: a copy of a fraction of requests goes to a candidate, logged only."""

    #: an int is a version of this model, a str another model
    target: int | str = 0
    fraction: float = 1.0


@dataclass
class ModelConfig:
    """A model's settings, read from the optional ``servekit.yaml`` in its folder."""

    plugin: str | None = None
    version_policy: Any = "latest"
    labels: dict[str, int] = field(default_factory=dict)
    device: str = "auto"
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    options: dict[str, Any] = field(default_factory=dict)
    #: ``worker`` | ``process`` (servekit.hosts); ``None`` takes the server's ``--placement``
    placement: str | None = None
    #: host processes of a version with placement ``process``
    replicas: int = 1
    #: calls that run at once in one process, first come first served (servekit.dataplane.call_gate);
    #: ``0``: no bound; ``None``: the default for the model's kind
    concurrency: int | None = None
    #: sample requests run before a version takes traffic (servekit.protocols.warmup)
    warmup: list[dict[str, Any]] = field(default_factory=list)
    #: never unloaded to make room under ``--model-memory-budget``
    pin: bool = False
    #: a state per sequence of requests (Triton's sequence batching); ``None``: stateless
    sequence: SequenceConfig | None = None
    #: the response cache (servekit.dataplane.response_cache): ``{}`` or ``{"max_bytes": N}``; ``None``: off
    cache: dict[str, Any] | None = None
    #: a pipeline of other models (``servekit.folders.pipeline.Pipeline``; Triton's ensembles); ``None``: a model
    pipeline: Any = None
    #: priorities and queue policy of the version's queue (servekit.dataplane.call_gate); ``None``: first come
    queue: QueueConfig | None = None
    #: a weighted split of this name's requests (servekit.dataplane.traffic); ``None``: the newest version
    traffic: TrafficConfig | None = None
    #: copies of requests for a candidate, logged beside the served answer; ``None``: none
    shadow: ShadowConfig | None = None
    #: the model folder (``BASE/NAME``); not part of the YAML
    base_path: Path | None = None


# -- where a version runs ------------------------------------------------------------------------


#: What ``predict`` and ``explain`` answer: the model's outputs as its hooks return them (an array,
#: named arrays, a list, a ``GenerationResult``...), or an iterator of them when it streams.
ModelOutputs = Any


class LoadedVersion(Protocol):
    """A loaded model version as its executor and its placement see it.

    ``servekit.dataplane.repository.ModelVersion`` is the one there is; this
    names what the seam reads and sets of it without importing the repository.
    """

    name: str
    version: int
    path: Path
    config: ModelConfig
    #: the settings it was loaded with (a model host loads exactly these)
    raw_config: dict[str, Any]
    fingerprint: float
    #: what the plugin's ``load`` returned (in a worker whose version runs in model hosts: their client)
    model: Any
    #: the version's hook relay (``pluggy.HookRelay``): ``hooks.predict(model=..., ...)``
    hooks: Any
    metadata: ModelMetadata
    executor: Executor

    def in_use(self) -> AbstractContextManager[Any]:
        """Held around a hook call: the version is not unloaded under it (``NotReady`` when not serving)."""
        ...


class Executor(Protocol):
    """Runs a loaded version's calls: in this process (``servekit.dataplane.executor.LocalExecutor``) or in
    its model hosts (``servekit.hosts.client.HostClient``).

    The data plane hands it a request's tensors as the version takes them
    (``single_tensor`` applied) and its parameters (``{}`` when none), and gets
    the answer after postprocess; the executor never calls back into the data plane.
    """

    def predict(
        self,
        mv: LoadedVersion,
        inputs: Tensors,
        *,
        parameters: dict[str, Any],
        signature_name: str | None,
        output_names: list[str] | None,
    ) -> ModelOutputs: ...

    def explain(
        self, mv: LoadedVersion, inputs: Tensors, *, parameters: dict[str, Any], signature_name: str | None
    ) -> ModelOutputs: ...

    def hook(self, mv: LoadedVersion, name: str, **kwargs: Any) -> Any:
        """Any other hook by name (``classify``, ``complete``, ``embed``...); the caller holds the version."""
        ...

    def close(self) -> None:
        """The version is unloaded: let go of what runs it (a model host's client tells its hosts)."""
        ...


class Placement(Protocol):
    """Decides where a version runs and starts its model hosts (the module ``servekit.hosts``)."""

    def placement_of(self, config: ModelConfig) -> tuple[str, int]:
        """``("worker", 1)``, or ``("process", N)``: in N model hosts."""
        ...

    def attach(self, mv: LoadedVersion, pm: pluggy.PluginManager, batching: BatchingConfig, replicas: int) -> None:
        """Serve ``mv`` from model hosts: start them, set its executor, hooks and metadata."""
        ...


# -- the request log's records (the ``log_request`` hook's argument) ----------------------------


@dataclass
class PredictionLog:
    """One prediction of a logged answer: a row, an OpenAI choice, a streamed event."""

    prediction_log_id: str
    index: int
    output: str  # JSON text of this prediction ("" when too large to keep)


@dataclass
class RequestLog:
    """One answered inference request, as the ``log_request`` hook receives it."""

    request_log_id: str
    request_id: str
    created: float
    method: str
    path: str
    protocol: str
    model: str
    status: int
    duration_ms: float
    request_body: str
    response_body: str
    predictions: list[PredictionLog] = field(default_factory=list)
    #: the version that answered ("" when the request failed before one was chosen)
    version: str = ""
    #: the request's OpenTelemetry trace id in hex ("" when traces are off)
    trace_id: str = ""

    def to_json(self, predictions: bool = True) -> dict[str, Any]:
        doc = {
            "requestLogId": self.request_log_id,
            "requestId": self.request_id,
            "traceId": self.trace_id,
            "createdAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.created)),
            "created": self.created,
            "method": self.method,
            "path": self.path,
            "protocol": self.protocol,
            "model": self.model,
            "version": self.version,
            "status": self.status,
            "durationMs": round(self.duration_ms, 3),
            "request": maybe_json(self.request_body),
            "response": maybe_json(self.response_body),
            "predictionLogIds": [p.prediction_log_id for p in self.predictions],
        }
        if predictions:
            doc["predictions"] = [
                {"predictionLogId": p.prediction_log_id, "index": p.index, "output": maybe_json(p.output)}
                for p in self.predictions
            ]
        return doc


def maybe_json(text: str) -> Any:
    """A stored body as JSON when it parses, else the text itself (``None`` when empty)."""
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


# -- generation: what the ``complete`` hook receives and returns -------------------------------

FINISH_STOP = "stop"
FINISH_LENGTH = "length"


@dataclass
class Constraint:
    """What a generated text must match (structured outputs): the model decodes under a grammar.

    ``kind`` and ``value``: ``"json_schema"`` and the schema (a dict), ``"json_object"``
    and ``None`` (any JSON object), ``"regex"`` and the pattern, ``"choice"`` and the
    list of strings, ``"grammar"`` and an EBNF (GBNF) grammar's text.  ``param`` is the
    request field it came from, which a refusal names.  A model that honours it says so
    on its answer (``constrained=True`` on the :class:`GenerationResult` or on every
    :class:`GenerationChunk` with text); the framework refuses an answer that does not
    with a 400 naming ``param``, so a model that cannot never answers free text.
    """

    kind: str
    value: Any
    param: str


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
    #: ``None``: the client asked for no log-probabilities.  ``N`` (0 or more): the model
    #: returns each generated token's :class:`TokenLogprob` with the ``N`` most likely
    #: tokens of its step in ``top``.  A model that cannot must refuse (the framework
    #: answers a 400 when a result comes back without them)
    logprobs: int | None = None
    #: the grammar the text must match (structured outputs, forced tool calls); ``None``: free text
    constraint: Constraint | None = None
    #: ``None``: the prompt's tokens are not scored.  ``N`` (0 or more): the model returns
    #: each prompt token's :class:`TokenLogprob` (the first one's ``logprob`` is ``None``:
    #: nothing predicts it) with the ``N`` most likely tokens of its position in ``top``, in
    #: the result's ``prompt_logprobs`` (completions' ``echo`` with ``logprobs``, vLLM's
    #: ``prompt_logprobs``).  A model that cannot is answered a 400 naming the field
    prompt_logprobs: int | None = None

    @property
    def is_chat(self) -> bool:
        return self.messages is not None


@dataclass
class TokenLogprob:
    """One token's log-probability, and (in ``top``) the most likely tokens of its step.

    ``logprob`` is of the distribution the token was drawn from before any sampling
    setting changed it (the log-softmax of the model's raw logits, as vLLM's default
    ``raw_logprobs``).  ``bytes`` is the token's UTF-8 bytes (a token may hold part of
    a character, so they need not decode alone); ``None`` lets the framework take
    ``token.encode()``.  ``top`` entries have an empty ``top`` of their own.
    """

    token: str
    #: ``None`` only for a prompt's first token, which nothing predicts
    logprob: float | None
    bytes: list[int] | None = None
    top: list[TokenLogprob] = field(default_factory=list)
    #: the token's id and its rank among its step's tokens (1: the most likely), when the
    #: model knows them (vLLM's ``prompt_logprobs`` answer them)
    token_id: int | None = None
    rank: int | None = None


@dataclass
class GenerationTiming:
    """Where a generation's time went, as the model's engine measured it (seconds).

    A model that batches generations reports it with its result (or its stream's
    last chunk); the framework answers it in TGI's timing headers.
    """

    #: waiting for a place in the running batch
    queue: float = 0.0
    #: from joining the batch to the first token
    prefill: float = 0.0
    #: from the first token to the last
    decode: float = 0.0


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
    #: one entry per generated token, when the request asked (``request.logprobs``)
    logprobs: list[TokenLogprob] | None = None
    #: where the time went, when the model measured it
    timing: GenerationTiming | None = None
    #: the text was decoded under ``request.constraint`` (required when the request has one)
    constrained: bool = False
    #: one entry per prompt token, when the request asked (``request.prompt_logprobs``)
    prompt_logprobs: list[TokenLogprob] | None = None


@dataclass
class GenerationChunk:
    """One piece of a streamed text; a generator may also yield plain ``str`` pieces."""

    text: str = ""
    finish_reason: str | None = None
    #: running totals, when the model knows them
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    reasoning: str | None = None
    #: the log-probabilities of the tokens this piece adds (their text may come in a later piece)
    logprobs: list[TokenLogprob] | None = None
    #: where the time went, when the model measured it (on a stream's last chunk)
    timing: GenerationTiming | None = None
    #: the text was decoded under ``request.constraint`` (required when the request has one)
    constrained: bool = False
    #: the prompt's scored tokens (``request.prompt_logprobs``): on a stream's first chunk
    prompt_logprobs: list[TokenLogprob] | None = None


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

    def __getnewargs__(self) -> tuple[str, list[int]]:  # type: ignore[override]
        """Pickled with its ids (a model host receives the request pickled)."""
        return str(self), self.token_ids
