"""Hugging Face plugin: local transformers folders (``config.json``, safetensors, tokenizer).

Causal language models answer completions and chat (``complete``, streaming
through transformers' streamer) and explain a prompt with per-token
attributions (``explain``); encoders answer embeddings (``embed``).  Both expose
their tokenizer (``tokenizer``), which gives chat its template and usage its
token counts.  ``*ForSequenceClassification`` folders score (query, text) pairs
(one label: rerank and score) or classify texts (several labels) through
``predict`` (:mod:`.cross_encoder`); encoders answer ``predict`` with embeddings too.  torch and transformers are imported only when such a folder
loads, so the plugin costs nothing to a server without one.

``servekit.yaml`` settings: ``device`` (auto, cpu, cuda, cuda:N) and
``options``: ``task`` (generate | embed | score | classify), ``dtype`` (auto | float32 | float16 |
bfloat16); for causal LMs ``continuous_batching`` (default true), ``max_num_seqs``,
``max_batched_tokens``, ``max_queued``, ``prefix_caching``, ``prefix_cache_mb`` (:mod:`.causal`,
:mod:`.prefix_cache`) and, without continuous batching,
``max_concurrent_generations``; for encoders ``normalize``,
``truncate``, ``batch_size``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import servekit
from servekit.types import ModelMetadata

from .loader import LoadError, load_folder

#: The library this plugin needs; without it `servekit serve` lists the plugin as not installed.
SERVEKIT_REQUIRES = ("transformers",)

__all__ = ["LoadError"]


# The hooks below get only models this plugin's ``load`` returned (a CausalLM or an
# Encoder); each kind has the methods of what it can do, and a hook the kind
# cannot answer returns None, which the client sees as a 501 naming the hook.


@servekit.hookimpl
def load(path: Path, config: servekit.ModelConfig, name: str, version: int) -> Any | None:
    return load_folder(path, config, name, version)


@servekit.hookimpl
def unload(model: Any) -> bool:
    import torch

    if hasattr(model, "close"):
        model.close()  # a causal LM's scheduler: what still waits ends with a clear error
    model.model = None
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return True


@servekit.hookimpl
def metadata(model: Any) -> ModelMetadata:
    """Encoders and classifiers name their tensors (text in, embeddings or scores out)."""
    return model.metadata() if hasattr(model, "metadata") else ModelMetadata(platform="huggingface")


@servekit.hookimpl
def predict(inputs: Any, parameters: dict[str, Any], model: Any) -> Any | None:
    """Scores (cross-encoders, classifiers) or embeddings (encoders) for ``text`` inputs."""
    return model.predict(inputs, parameters) if hasattr(model, "predict") else None  # a causal LM: 501


@servekit.hookimpl
def tokenizer(model: Any) -> Any:
    return model.tokenizer


@servekit.hookimpl
def complete(request: Any, model: Any) -> Any | None:
    return model.complete(request) if hasattr(model, "complete") else None  # an encoder generates nothing


@servekit.hookimpl
def embed(texts: list[str], parameters: dict[str, Any], model: Any) -> Any | None:
    return model.embed(texts, parameters) if hasattr(model, "embed") else None


@servekit.hookimpl
def explain(inputs: Any, model: Any) -> Any | None:
    """Per-token attributions (gradient x input) for each prompt's most likely next token."""
    if not hasattr(model, "attributions"):
        return None
    import numpy as np

    prompts = np.asarray(inputs, dtype=object).reshape(-1)
    return [model.attributions(p.decode() if isinstance(p, bytes) else str(p)) for p in prompts]
