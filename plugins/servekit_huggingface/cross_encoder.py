"""Cross-encoders and text classifiers: a ``*ForSequenceClassification`` folder.

With one label the model scores (query, text) pairs: rerank and score, the logit
through a sigmoid (sentence-transformers' ``CrossEncoder`` and TEI do the same;
a CrossEncoder folder's ``activation_fn`` of ``Identity`` keeps the logit).  With
several labels it classifies a text (or a pair), the logits through a softmax,
labels from ``id2label``.  ``raw_scores: true`` returns the logits untouched.

The ``predict`` hook takes ``text`` (and, for pairs, ``text_pair``) as BYTES
tensors of one row per input and answers ``scores`` (``[n]`` for a cross-encoder,
``[n, labels]`` for a classifier), so V1, V2 and gRPC serve these models as they
are; the retrieval routes (:mod:`servekit.protocols.retrieval`) build on the same
hook.  Per-request parameters: ``raw_scores``, ``truncate`` (an input longer than
the model takes is refused unless true, or unless ``options.truncate`` is) and
``truncation_direction`` (``right`` or ``left``).

Imported only when such a model loads (torch and transformers are heavy).
"""

from __future__ import annotations

import copy
import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch
from servekit.errors import BadRequest
from servekit.types import ModelMetadata, Signature, TensorSpec

from .encoder import _model_max_length as model_max_length
from .options import DEFAULT_MAX_BATCH_TOKENS, pass_cost, positive_option, token_batches
from .text_inputs import texts_of

DIRECTIONS = ("right", "left")


class SequenceClassifier:
    """A ``*ForSequenceClassification`` model: ``score`` (one label) or ``classify`` (several)."""

    def __init__(self, model: Any, tokenizer: Any, device: str, path: Path, task: str, options: dict[str, Any]):
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.task = task
        self.num_labels = int(model.config.num_labels)
        self.labels = [str(model.config.id2label.get(i, f"LABEL_{i}")) for i in range(self.num_labels)]
        self.max_length = _configured_max_length(path) or model_max_length(model.config, tokenizer)
        self.truncate = bool(options.get("truncate", False))
        self.batch_size = positive_option(options, "batch_size") or 32
        self.max_batch_tokens = positive_option(options, "max_batch_tokens") or DEFAULT_MAX_BATCH_TOKENS
        self.pass_tokens = pass_cost(device)
        self.activation = _activation(path, task)
        self._left_tokenizer: Any = None
        self._lock = threading.Lock()

    def metadata(self) -> ModelMetadata:
        shape = [-1] if self.task == "score" else [-1, self.num_labels]
        scores = TensorSpec("scores", "FP32", shape, labels=None if self.task == "score" else list(self.labels))
        signature = Signature(
            inputs=[TensorSpec("text", "BYTES", [-1]), TensorSpec("text_pair", "BYTES", [-1])],
            outputs=[scores],
        )
        return ModelMetadata(signatures={"serving_default": signature}, platform="huggingface")

    def predict(self, inputs: Any, parameters: dict[str, Any]) -> dict[str, np.ndarray]:
        texts, pairs = texts_of(inputs)
        logits = self.logits(texts, pairs, parameters)
        raw = parameters.get("raw_scores", False)
        if not isinstance(raw, bool):
            raise BadRequest(f"'raw_scores' must be true or false, found {raw!r}", param="raw_scores")
        scores = logits if raw else self.activation(logits)
        return {"scores": scores[:, 0] if self.task == "score" else scores}

    def logits(self, texts: list[str], pairs: list[str] | None, parameters: dict[str, Any]) -> np.ndarray:
        """``[n, labels]`` logits, in forward passes of rows of similar length (:func:`.options.token_batches`)."""
        rows = self._ids(texts, pairs, parameters)
        logits = np.zeros((len(rows), self.num_labels), dtype=np.float32)
        lengths = [len(row["input_ids"]) for row in rows]
        for chunk in token_batches(lengths, self.batch_size, self.max_batch_tokens, self.pass_tokens):
            batch = self.tokenizer.pad([rows[i] for i in chunk], padding=True, return_tensors="pt").to(self.device)
            with torch.inference_mode():
                logits[chunk] = self.model(**batch).logits.float().cpu().numpy()
        return logits

    def _ids(self, texts: list[str], pairs: list[str] | None, parameters: dict[str, Any]) -> list[dict[str, Any]]:
        truncate = parameters.get("truncate")
        truncate = self.truncate if truncate is None else truncate
        if not isinstance(truncate, bool):
            raise BadRequest(f"'truncate' must be true or false, found {truncate!r}", param="truncate")
        tokenizer = self._tokenizer_for(parameters.get("truncation_direction"))
        limit = {"truncation": True, "max_length": self.max_length} if truncate else {}
        encoded = tokenizer(texts, pairs, **limit) if pairs is not None else tokenizer(texts, **limit)
        rows = [{key: encoded[key][i] for key in encoded} for i in range(len(texts))]
        for index, row in enumerate(rows):
            if len(row["input_ids"]) > self.max_length:
                raise BadRequest(
                    f"`inputs` must have less than {self.max_length} tokens. Given: {len(row['input_ids'])} "
                    f"(input {index}; send truncate: true to cut it)",
                    param="truncate",
                )
        return rows

    def _tokenizer_for(self, direction: Any) -> Any:
        direction = "right" if direction is None else str(direction).lower()
        if direction not in DIRECTIONS:
            raise BadRequest(
                f"'truncation_direction' must be Right or Left, found {direction!r}", param="truncation_direction"
            )
        if direction == "right":
            return self.tokenizer
        with self._lock:
            if self._left_tokenizer is None:
                self._left_tokenizer = copy.deepcopy(self.tokenizer)
                self._left_tokenizer.truncation_side = "left"
            return self._left_tokenizer


def _configured_max_length(path: Path) -> int | None:
    config = path / "sentence_bert_config.json"
    if config.is_file():
        value = json.loads(config.read_text()).get("max_seq_length")
        return int(value) if isinstance(value, int) and value > 0 else None
    return None


def _activation(path: Path, task: str) -> Any:
    """Sigmoid for a cross-encoder, softmax for a classifier; a CrossEncoder folder's ``activation_fn`` wins."""
    config = path / "config_sentence_transformers.json"
    named = json.loads(config.read_text()).get("activation_fn") if config.is_file() else None
    if isinstance(named, str) and named.endswith("Identity"):
        return lambda logits: logits
    if isinstance(named, str) and named.endswith("Sigmoid") or task == "score":
        return lambda logits: (1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
    return _softmax


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (shifted / shifted.sum(axis=-1, keepdims=True)).astype(np.float32)
