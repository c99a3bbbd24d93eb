"""Train version 1 of {{ cookiecutter.model_name }}: python train.py [VERSION_FOLDER] (default ./1).

Builds a tiny BERT and a word-level tokenizer from scratch and fits them to a few
sentences, so the container works without downloading anything.  For a real
model: ``AutoModelForSequenceClassification.from_pretrained(...)``, fine-tune,
then ``model.save_pretrained("1")`` and ``tokenizer.save_pretrained("1")``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

EXAMPLES = [
    ("what a great film", 1),
    ("i loved every minute", 1),
    ("a wonderful happy story", 1),
    ("what a terrible film", 0),
    ("i hated every minute", 0),
    ("a boring sad story", 0),
]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def make_tokenizer() -> PreTrainedTokenizerFast:
    words = sorted({w for text, _ in EXAMPLES for w in text.split()})
    vocab = {token: i for i, token in enumerate(SPECIAL + words)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]",
        cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
    )


def main(out: Path) -> Path:
    torch.manual_seed(0)
    tokenizer = make_tokenizer()
    config = BertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64, num_labels=2,
        id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1},
    )
    model = BertForSequenceClassification(config)
    batch = tokenizer([t for t, _ in EXAMPLES], padding=True, return_tensors="pt")
    labels = torch.tensor([label for _, label in EXAMPLES])
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    for _ in range(60):
        optimiser.zero_grad()
        model(**batch, labels=labels).loss.backward()
        optimiser.step()
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


if __name__ == "__main__":
    print("wrote", main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "1"))
