"""Encoders for embeddings: a transformers model, pooled and normalised.

A sentence-transformers folder (``modules.json``) is read for its pooling
(``1_Pooling/config.json``: cls, mean, max, mean_sqrt_len or lasttoken; several
modes are concatenated as sentence-transformers does) and its ``max_seq_length``;
any other encoder uses mean pooling over the attention mask.  Vectors are
L2-normalised unless ``options.normalize`` is false.  An input longer than the
model takes is refused (400) unless ``options.truncate`` is true, so no text is
silently cut.  Texts are embedded in forward passes grouped by length, so a pass
pads little, each bounded by ``options.batch_size`` rows (32) and
``options.max_batch_tokens`` padded tokens (TEI's budget, 16384): short texts go
many to a pass, long ones few.  With ``batching:`` on in ``servekit.yaml``,
concurrent requests are merged first (the adaptive batcher).

An input sent as token ids (:class:`servekit.dataplane.generation.TokenIds`, from the
OpenAI API's id-array form) is embedded from those ids exactly as sent, with
no re-tokenizing and no special tokens added (as vLLM does).

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

from .options import DEFAULT_MAX_BATCH_TOKENS, pass_cost, positive_option, token_batches
from .text_inputs import texts_of

#: sentence-transformers' pooling keys, in the order it concatenates them
POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_lasttoken": "lasttoken",
}
UNSUPPORTED_POOLING = ("pooling_mode_weightedmean_tokens",)


class Encoder:
    def __init__(self, model: Any, tokenizer: Any, device: str, path: Path, options: dict[str, Any]):
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.pooling, max_seq_length = _sentence_transformers_config(path)
        self.max_length = max_seq_length or _model_max_length(model.config, tokenizer)
        self.normalize = bool(options.get("normalize", True))
        self.truncate = bool(options.get("truncate", False))
        self.batch_size = positive_option(options, "batch_size") or 32
        self.max_batch_tokens = positive_option(options, "max_batch_tokens") or DEFAULT_MAX_BATCH_TOKENS
        self.pass_tokens = pass_cost(device)
        self.dimension = int(getattr(model.config, "hidden_size", 0)) * len(self.pooling)
        self.prompts = _sentence_transformers_prompts(path)
        self._left_tokenizer: Any = None
        self._lock = threading.Lock()

    def metadata(self) -> ModelMetadata:
        """Text in (``text``, BYTES), one vector per text out (``embedding``, FP32)."""
        signature = Signature(
            inputs=[TensorSpec("text", "BYTES", [-1])],
            outputs=[TensorSpec("embedding", "FP32", [-1, self.dimension])],
        )
        return ModelMetadata(signatures={"serving_default": signature}, platform="huggingface")

    def predict(self, inputs: Any, parameters: dict[str, Any]) -> dict[str, np.ndarray]:
        """V1/V2 ``predict``: the ``text`` tensor's embeddings as ``embedding``."""
        texts, pairs = texts_of(inputs)
        if pairs is not None:
            raise BadRequest("an embedding model takes 'text' alone, not 'text_pair'")
        return {"embedding": self.embed(texts, parameters)}

    def embed(self, texts: list[str], parameters: dict[str, Any] | None = None) -> np.ndarray:
        """Vectors for ``texts``, in forward passes of texts of similar length (:func:`.options.token_batches`).

        ``parameters`` may carry TEI's ``normalize``, ``truncate``, ``truncation_direction``
        and ``prompt_name`` (a key of the sentence-transformers ``prompts``); unset, the
        model's options decide.
        """
        parameters = parameters or {}
        texts = self._prompted(texts, parameters.get("prompt_name"))
        rows = self._ids(texts, parameters)
        vectors = np.zeros((0, self.dimension), dtype=np.float32) if not rows else None
        for chunk in token_batches([len(r) for r in rows], self.batch_size, self.max_batch_tokens, self.pass_tokens):
            part = self._batch([rows[i] for i in chunk], _flag(parameters, "normalize", self.normalize))
            if vectors is None:
                vectors = np.empty((len(rows), part.shape[1]), dtype=part.dtype)
            vectors[chunk] = part
        assert vectors is not None
        return vectors

    def _prompted(self, texts: list[str], prompt_name: Any) -> list[str]:
        if prompt_name is None:
            return texts
        if prompt_name not in self.prompts:
            known = ", ".join(sorted(self.prompts)) or "none"
            raise BadRequest(
                f"prompt_name {prompt_name!r} is not among the model's sentence-transformers prompts ({known})",
                param="prompt_name",
            )
        prefix = self.prompts[prompt_name]
        return [prefix + text for text in texts]

    def _ids(self, texts: list[str], parameters: dict[str, Any] | None = None) -> list[list[int]]:
        """Each input's token ids: as sent (token-id inputs), else the tokenizer's, every text of a
        (merged) batch in one tokenizer call; checked against the limit."""
        parameters = parameters or {}
        truncate = _flag(parameters, "truncate", self.truncate)
        left = str(parameters.get("truncation_direction") or "right").lower() == "left"
        rows: list[Any] = [getattr(text, "token_ids", None) for text in texts]
        strings = [i for i, ids in enumerate(rows) if ids is None]
        if strings:
            limit = {"truncation": True, "max_length": self.max_length} if truncate else {}
            tokenizer = self._left() if left and truncate else self.tokenizer
            for i, ids in zip(strings, tokenizer([texts[i] for i in strings], **limit)["input_ids"]):
                rows[i] = ids
        for index, ids in enumerate(rows):
            if len(ids) > self.max_length:
                if not truncate:
                    raise BadRequest(
                        f"input {index} has {len(ids)} tokens; the model takes at most {self.max_length}",
                        param="input",
                    )
                rows[index] = ids[-self.max_length :] if left else ids[: self.max_length]
        return [list(ids) for ids in rows]

    def _left(self) -> Any:
        """A copy of the tokenizer that truncates on the left (made once, on first use)."""
        with self._lock:
            if self._left_tokenizer is None:
                left = copy.deepcopy(self.tokenizer)
                left.truncation_side = "left"
                self._left_tokenizer = left
            return self._left_tokenizer

    def _batch(self, rows: list[list[int]], normalize: bool = True) -> np.ndarray:
        encoded = self.tokenizer.pad({"input_ids": rows}, padding=True, return_tensors="pt").to(self.device)
        with torch.inference_mode():
            hidden = self.model(**encoded).last_hidden_state
            mask = encoded["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            vectors = torch.cat([_pool(mode, hidden, mask) for mode in self.pooling], dim=-1).float()
            if normalize:
                vectors = torch.nn.functional.normalize(vectors, p=2, dim=-1)
        return vectors.cpu().numpy()


def _flag(parameters: dict[str, Any], key: str, default: bool) -> bool:
    value = parameters.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"'{key}' must be true or false, found {value!r}", param=key)
    return value


def _sentence_transformers_prompts(path: Path) -> dict[str, str]:
    """The folder's sentence-transformers ``prompts`` (``config_sentence_transformers.json``)."""
    config = path / "config_sentence_transformers.json"
    if not config.is_file():
        return {}
    prompts = json.loads(config.read_text()).get("prompts") or {}
    return {str(k): str(v) for k, v in prompts.items()} if isinstance(prompts, dict) else {}


def _pool(mode: str, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if mode == "cls":
        return hidden[:, 0]
    if mode == "max":
        return hidden.masked_fill(mask == 0, float("-inf")).max(dim=1).values
    counts = mask.sum(dim=1).clamp(min=1e-9)
    if mode == "mean":
        return (hidden * mask).sum(dim=1) / counts
    if mode == "mean_sqrt_len":
        return (hidden * mask).sum(dim=1) / counts.sqrt()
    # lasttoken: the last position the mask keeps (right padding)
    last = mask.squeeze(-1).sum(dim=1).long() - 1
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


def _sentence_transformers_config(path: Path) -> tuple[list[str], int | None]:
    """Pooling modes and ``max_seq_length`` from a sentence-transformers folder (mean otherwise)."""
    max_seq_length = None
    bert_config = path / "sentence_bert_config.json"
    if bert_config.is_file():
        max_seq_length = json.loads(bert_config.read_text()).get("max_seq_length")
    modules_file = path / "modules.json"
    if not modules_file.is_file():
        return ["mean"], max_seq_length
    for module in json.loads(modules_file.read_text()):
        if str(module.get("type", "")).endswith("Pooling"):
            config = json.loads((path / module.get("path", "") / "config.json").read_text())
            for key in UNSUPPORTED_POOLING:
                if config.get(key):
                    raise ValueError(f"sentence-transformers pooling {key} is not supported")
            modes = [mode for key, mode in POOLING_KEYS.items() if config.get(key)]
            return modes or ["mean"], max_seq_length
    return ["mean"], max_seq_length


def _model_max_length(config: Any, tokenizer: Any) -> int:
    limits = [getattr(config, "max_position_embeddings", None), getattr(tokenizer, "model_max_length", None)]
    usable = [int(v) for v in limits if isinstance(v, int) and 0 < v < 1_000_000]
    return min(usable) if usable else 512
