"""{{ cookiecutter.project_name }}: a Hugging Face text classifier served by servekit.

servekit calls these hooks (see servekit's docs/hooks.md); each names only the
arguments it needs:

- ``load``      once per version folder (``1/``, ``2/``...): tokenizer and model, from local files only
- ``metadata``  the inputs and outputs shown by ``/v1/models/NAME/metadata`` and V2 metadata
- ``predict``   texts in, a label and its score out (V1, V2 and gRPC)
- ``embed``     mean-pooled hidden states for OpenAI's ``/v1/embeddings``

Any ``save_pretrained`` folder of a sequence-classification model works as ``1/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

import servekit
from servekit import BadRequest, ModelMetadata, Signature, TensorSpec


@dataclass
class TextClassifier:
    tokenizer: Any
    model: Any
    device: torch.device

    def encode(self, texts: list[str]) -> dict[str, torch.Tensor]:
        batch = self.tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
        return {k: v.to(self.device) for k, v in batch.items()}


@servekit.hookimpl
def load(path: Path, config: servekit.ModelConfig) -> TextClassifier:
    device = torch.device("cuda" if config.device == "auto" and torch.cuda.is_available() else
                          "cpu" if config.device == "auto" else config.device)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(path, local_files_only=True)
    return TextClassifier(tokenizer, model.to(device).eval(), device)


@servekit.hookimpl
def metadata(model: TextClassifier) -> ModelMetadata:
    signature = Signature(
        inputs=[TensorSpec("text", "BYTES", [-1])],
        outputs=[TensorSpec("label", "BYTES", [-1]), TensorSpec("score", "FP32", [-1])],
    )
    return ModelMetadata(signatures={"serving_default": signature}, platform="huggingface")


def texts(inputs: Any) -> list[str]:
    if isinstance(inputs, dict):
        if "text" not in inputs:
            raise BadRequest(f"expected an input named 'text', found {sorted(inputs)}")
        inputs = inputs["text"]
    values = np.asarray(inputs, dtype=object).reshape(-1)
    if not all(isinstance(v, (str, bytes)) for v in values):
        raise BadRequest("expected strings (V1: a list of texts; V2: a BYTES tensor)")
    return [v.decode("utf-8") if isinstance(v, bytes) else v for v in values]


@servekit.hookimpl
def predict(inputs: Any, model: TextClassifier) -> dict[str, np.ndarray]:
    with torch.inference_mode():
        logits = model.model(**model.encode(texts(inputs))).logits
        scores, ids = torch.softmax(logits, dim=-1).max(dim=-1)
    labels = [model.model.config.id2label[int(i)] for i in ids]
    return {"label": np.array(labels, dtype=object), "score": scores.float().cpu().numpy()}


@servekit.hookimpl
def embed(texts: list[str], model: TextClassifier) -> np.ndarray:
    batch = model.encode(texts)
    with torch.inference_mode():
        hidden = model.model.base_model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    return ((hidden * mask).sum(dim=1) / mask.sum(dim=1)).float().cpu().numpy()
