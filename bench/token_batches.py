"""Encoder forward passes bounded by padded tokens (TEI's ``max_batch_tokens``) against passes bounded by rows.

    python bench/token_batches.py [--rounds 3]

The packaged MiniLM embedder (sentence-transformers' all-MiniLM-L6-v2, 256 tokens at most) in
process, one call per batch of a mixed load: short queries (about 10 tokens) and documents at the
model's full length, as a RAG indexer and its users send them together.  Each variant embeds the
same texts; the variants alternate over ``--rounds`` so drifting machine load touches each alike.

- ``rows 32`` (servekit before): passes of 32 texts of similar length, however short;
- ``tokens 16384``: passes of up to 256 texts holding at most 16,384 padded tokens (TEI's default);
- ``unsorted rows 32``: passes of 32 texts in arrival order, padded to the longest in each (what a
  server that counts requests and does not sort sends a model).

Prints one JSON line per measurement, then texts/s per variant.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests" / "support"), str(HERE.parent / "plugins"), str(HERE.parent / "framework")]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--queries", type=int, default=448)
    parser.add_argument("--documents", type=int, default=64)
    args = parser.parse_args()

    import torch
    from generative_models import minilm_folder
    from servekit_huggingface import encoder as encoders
    from transformers import AutoModel, AutoTokenizer

    torch.set_num_threads(2)
    folder = minilm_folder()
    model = AutoModel.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    words = ["retrieval", "augmented", "generation", "embeds", "passages", "ranks", "them", "for", "a", "question"]
    rng = random.Random(0)
    queries = [" ".join(rng.choice(words) for _ in range(8)) for _ in range(args.queries)]
    documents = [" ".join(rng.choice(words) for _ in range(400)) for _ in range(args.documents)]
    texts = queries + documents
    rng.shuffle(texts)  # as they arrive, mixed

    variants = {
        "rows 32": {"batch_size": 32, "max_batch_tokens": 10**9},
        "tokens 16384": {"batch_size": 256, "max_batch_tokens": 16384},
        "unsorted rows 32": {"batch_size": 32, "max_batch_tokens": 10**9, "unsorted": True},
    }
    made = {
        name: encoders.Encoder(
            model, tokenizer, "cpu", folder, {"truncate": True, **{k: v for k, v in o.items() if k != "unsorted"}}
        )
        for name, o in variants.items()
    }
    encoders_unsorted = made["unsorted rows 32"]
    original = encoders.token_batches

    def in_arrival_order(lengths, max_rows, max_tokens):
        return [list(range(i, min(i + max_rows, len(lengths)))) for i in range(0, len(lengths), max_rows)]

    rates: dict[str, list[float]] = {name: [] for name in variants}
    made["rows 32"].embed(texts[:64])  # warm up
    for round_ in range(args.rounds):
        for name, encoder in made.items():
            encoders.token_batches = in_arrival_order if encoder is encoders_unsorted else original
            started = time.perf_counter()
            encoder.embed(texts)
            rate = len(texts) / (time.perf_counter() - started)
            rates[name].append(rate)
            print(json.dumps({"round": round_, "variant": name, "texts_per_s": round(rate, 1)}))
    encoders.token_batches = original
    base = statistics.median(rates["rows 32"])
    print(f"\n{len(queries)} queries and {len(documents)} full-length documents, mixed; medians of {args.rounds}")
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"{name:>18}: {median:8.1f} texts/s  {median / base:4.2f}x rows 32")


if __name__ == "__main__":
    main()
