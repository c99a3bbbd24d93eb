"""Every hook servekit calls, typed and documented.

A plugin (an installed package registered under the ``servekit`` entry-point group,
a file given with ``--plugin``, or a model folder's ``model.py``) implements any
subset of these with ``@servekit.hookimpl``.  Implementations name only the
arguments they need; pluggy passes them by keyword.

``load`` is asked of the model folder's ``model.py`` first, then of every
plugin; the first to return a model *loaded* it.  Every other hook that
receives ``model`` is called through that model's own hook relay: the plugin
that loaded it, the folder's ``model.py`` (registered last, so called first)
and every wrapper; other plugins' plain implementations are not called, so a
framework plugin only ever sees models its ``load`` returned.  When
``model.py`` loaded the model, the plugin ``servekit.yaml`` names (``plugin:``)
joins the relay too.  Hooks marked *first result* stop at the first
implementation that returns something other than ``None``, so a ``model.py``
overrides the loading plugin for its own model only.  Hooks without ``model``
(``register_routes``, ``server_started``, ``log_request``) go to every plugin.

Every inference hook (``predict``, ``explain``, ``classify``, ``regress``,
``complete``, ``embed``, ``preprocess``, ``postprocess``) may also take ``name``
(the served model name) and ``version`` (its version number).

Cross-cutting plugins (metrics, request logs, auth) wrap any hook with
``@servekit.hookimpl(wrapper=True)`` and see every model's calls.

The docstrings here are the reference; ``docs/hooks.md`` shows each hook with
a runnable example.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from collections.abc import Iterator

    from flask import Flask

    from servekit.types import (
        GenerationChunk,
        GenerationRequest,
        GenerationResult,
        ModelConfig,
        ModelMetadata,
        RequestLog,
        Tensors,
    )

hookspec = pluggy.HookspecMarker("servekit")
hookimpl = pluggy.HookimplMarker("servekit")


# ---------------------------------------------------------------------------
# Loading and describing a model
# ---------------------------------------------------------------------------


@hookspec(firstresult=True)
def load(path: Path, config: ModelConfig, name: str, version: int) -> Any | None:
    """Load one version of a model and return the object later hooks receive as ``model``.

    Called once per model version when it enters the repository (at start-up and
    whenever a new version folder appears), in a background thread of each worker.

    :param path: the version folder (``BASE/NAME/VERSION``, or the model folder
        itself when it has no numeric sub-folders).
    :param config: the model's settings from ``servekit.yaml`` (``options`` holds
        free plugin options; ``device`` the requested device).
    :param name: the served model name.
    :param version: the version number.
    :returns: the loaded model, or ``None`` when this plugin does not handle the
        folder's artifact (first result wins).  The plugin that returns it owns
        the model: the model's other hooks are called on that plugin (and the
        folder's ``model.py`` and wrappers) alone.  Raise to report a failed
        load: the version's state becomes END with the message as its error.
    """


@hookspec(firstresult=True)
def unload(model: Any) -> bool | None:
    """Release a model version that leaves the repository (GPU memory, files).

    :param model: the object ``load`` returned.
    :returns: ``True`` once handled (first result wins); ``None`` to let the
        next implementation in the model's relay try.  The framework drops its
        reference either way.
    """


@hookspec(firstresult=True)
def metadata(model: Any, name: str, version: int) -> ModelMetadata | None:
    """Describe a loaded model's signatures: inputs and outputs with datatypes and shapes.

    Called once after a successful load; the result is cached and answers
    V1 ``/metadata``, V2 model metadata and gRPC ``GetModelMetadata``.

    :param model: the object ``load`` returned.
    :returns: a :class:`servekit.types.ModelMetadata`, or ``None`` (first result
        wins).  Without any, the model is described with no tensors.
    """


# ---------------------------------------------------------------------------
# Inference
# ---------------------------------------------------------------------------


@hookspec(firstresult=True)
def predict(
    inputs: Tensors,
    parameters: dict[str, Any],
    model: Any,
    signature_name: str | None,
    output_names: list[str] | None,
    name: str,
    version: int,
    sequence: Any,
) -> Any | None:
    """Run the model on decoded inputs.

    Every protocol (V1 ``:predict`` and ``/predict``, V2 ``infer``, gRPC
    ``Predict``/``ModelInfer``) ends here, so a model written once answers on all.

    :param inputs: named tensors as ``dict[str, numpy.ndarray]``, or one unnamed
        tensor as a ``numpy.ndarray`` (V1 ``instances``/``inputs`` without names).
    :param parameters: the request's free parameters (V2 ``parameters``; empty
        when the protocol has none).
    :param model: the object ``load`` returned.
    :param signature_name: the signature asked for (V1/gRPC ``signature_name``),
        ``None`` for the default.
    :param output_names: the outputs the client asked for, ``None`` for all; the
        framework filters afterwards, so honouring this is only an optimisation.
    :param name: the served model name; ``version``: its version number.
    :param sequence: for a model with ``sequence:`` in its servekit.yaml, the
        request's :class:`servekit.dataplane.sequences.Sequence` (``id``, ``start``, ``end``
        and the ``state`` dict kept between its requests); ``None`` otherwise.
    :returns: a ``numpy.ndarray`` (one unnamed output), a ``dict`` of named
        outputs, any JSON-serialisable value, or a generator, which streams one
        item per event over SSE.  ``None`` lets the next plugin try.
    """


@hookspec(firstresult=True)
def explain(
    inputs: Tensors,
    parameters: dict[str, Any],
    model: Any,
    signature_name: str | None,
    name: str,
    version: int,
) -> Any | None:
    """Explain a prediction: attributions per input feature, or whatever the model offers.

    Answers V1 ``:explain``, ``/explain`` and V2 ``.../explain``.

    :param inputs: as for :func:`predict`.
    :returns: a ``numpy.ndarray``, a ``dict`` of named arrays or any
        JSON-serialisable value; ``None`` lets the next plugin try.  With no
        implementation the endpoint answers 501.
    """


@hookspec(firstresult=True)
def classify(
    examples: list[dict[str, list[Any]]],
    parameters: dict[str, Any],
    model: Any,
    signature_name: str | None,
    name: str,
    version: int,
) -> list[list[tuple[str, float]]] | None:
    """Classify ``tf.Example``-like records (V1 ``:classify``, gRPC ``Classify``).

    :param examples: one ``{feature: [values]}`` per example, request ``context``
        already merged in; values are ``int``, ``float`` or ``bytes``.
    :returns: per example, a list of ``(label, score)`` pairs (label may be
        ``""``); ``None`` lets the next plugin try.
    """


@hookspec(firstresult=True)
def regress(
    examples: list[dict[str, list[Any]]],
    parameters: dict[str, Any],
    model: Any,
    signature_name: str | None,
    name: str,
    version: int,
) -> list[float] | None:
    """Regress ``tf.Example``-like records (V1 ``:regress``, gRPC ``Regress``).

    :param examples: as for :func:`classify`.
    :returns: one float per example; ``None`` lets the next plugin try.
    """


# ---------------------------------------------------------------------------
# Generative models
# ---------------------------------------------------------------------------


@hookspec(firstresult=True)
def complete(
    request: GenerationRequest, parameters: dict[str, Any], model: Any, name: str, version: int
) -> GenerationResult | str | Iterator[str | GenerationChunk] | None:
    """Generate one text for a completions or chat request (OpenAI API) or a Triton generate request.

    The framework validates the request, formats chat messages (through the
    :func:`tokenizer`'s chat template) and calls this once per prompt and
    choice (``n``); afterwards the data plane cuts the text at stop sequences,
    counts the tokens the model did not report and decides the finish reason,
    and the protocol writes its response.

    :param request: a :class:`servekit.types.GenerationRequest` (``prompt``,
        ``messages`` for chat, ``max_tokens``, ``temperature``, ``top_p``,
        ``stop``, ``seed``, ``stream``, ``logprobs``, further ``options``).
    :param parameters: the request's JSON body as the client sent it (over gRPC,
        the generate request's parameters).
    :returns: a :class:`servekit.types.GenerationResult` or a ``str``, or a
        generator of ``str`` / :class:`servekit.types.GenerationChunk` pieces,
        which streams; the framework closes the generator when the client
        disconnects or a stop sequence appears.  ``None`` lets the next plugin try.
    """


@hookspec(firstresult=True)
def tokenizer(model: Any) -> Any | None:
    """The model's tokenizer, for chat templates and token counts (usage).

    :param model: the object ``load`` returned.
    :returns: an object with ``encode(text, add_special_tokens=False) -> list[int]``
        and, for chat, ``apply_chat_template(messages, tokenize=False,
        add_generation_prompt=True)`` and a ``chat_template`` attribute (a Hugging
        Face tokenizer fits as is); ``None`` when the model has none (first result
        wins).  Without one, chat is formatted as ``role: content`` lines ending
        in ``assistant:``, and usage counts whitespace-separated words.
    """


@hookspec(firstresult=True)
def embed(texts: list[str], parameters: dict[str, Any], model: Any, name: str, version: int) -> Any | None:
    """Embed texts (OpenAI ``/v1/embeddings``).

    The framework truncates to the request's ``dimensions`` (renormalising
    unit-length rows) and encodes ``encoding_format: base64`` afterwards.

    :param texts: the inputs, one string each.
    :param parameters: the request's JSON body as the client sent it.  With the
        model's ``batching`` on, concurrent requests whose bodies agree except
        for ``input`` share one call: ``texts`` holds all their inputs and
        ``parameters`` the shared fields, without ``input``.
    :returns: a ``numpy.ndarray`` of shape ``(len(texts), dim)``; ``None`` lets the
        next plugin try.
    """


# ---------------------------------------------------------------------------
# Request pipeline (cross-cutting plugins)
# ---------------------------------------------------------------------------


@hookspec(firstresult=True)
def preprocess(inputs: Tensors, parameters: dict[str, Any], model: Any, name: str, version: int) -> Tensors | None:
    """Map decoded inputs before :func:`predict` and :func:`explain` (custom input mapping).

    :returns: the inputs to use instead, or ``None`` to keep them (first result wins).
    """


@hookspec(firstresult=True)
def postprocess(outputs: Any, parameters: dict[str, Any], model: Any, name: str, version: int) -> Any | None:
    """Map a prediction's outputs before they are encoded for the client.

    Not called for streaming (generator) predictions.

    :returns: the outputs to use instead, or ``None`` to keep them (first result wins).
    """


@hookspec
def register_routes(app: Flask) -> None:
    """Add routes or blueprints to the Flask app, once per worker, after the built-in ones.

    :param app: the application; ``app.extensions["servekit"]`` is the data plane.
    """


@hookspec
def server_started(models: list[str]) -> None:
    """Called once per worker when the server starts, with the configured model names."""


# ---------------------------------------------------------------------------
# Request log (cross-cutting plugins)
# ---------------------------------------------------------------------------


@hookspec
def log_request(record: RequestLog) -> None:
    """Store or forward one answered inference request and its predictions.

    Called in the worker that answered, once per inference request (a POST on
    V1, V2, OpenAI or the generic paths), after the response is built; for a
    stream, after its last event.  Every implementation is called.  The built-in
    store (SQLite by default, any SQLAlchemy URL with ``--request-log-url``) is
    one of them; a plugin can add others (a message queue, a data lake).  Keep it
    quick (queue the work): it runs on the request's thread.  An exception is
    logged and ignored; the client's answer is already decided.

    :param record: a :class:`servekit.types.RequestLog`:
        ``request_log_id`` (the ``X-Request-Log-Id`` the client got),
        ``request_id`` (``X-Request-Id``), ``method``, ``path``, ``protocol``,
        ``model``, ``status``, ``duration_ms``, the request and response bodies
        (clipped to 64 KiB each), and ``predictions``: one
        ``PredictionLog(prediction_log_id, index, output)`` per row, choice or
        streamed event, under the ``X-Prediction-Log-Ids`` the client got.
    """


__all__ = ["hookimpl", "hookspec"]
