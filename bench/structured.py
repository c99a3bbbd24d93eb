"""Structured outputs' cost: streams under a JSON schema against free streams, and the grammar cache.

    python bench/structured.py [--streams 16] [--tokens 120] [--layers 4] [--width 128]

One ``servekit serve`` holds a small GPT-2 (random weights) with a realistic
tokenizer built here: a 32,000-token byte-level BPE trained on the Python standard
library's sources (the size of Llama 2's and Mistral's vocabularies; the allowed-token
mask is computed over all of it at each step).  Printed, in one run, side by side:

- ``--streams`` concurrent chat streams of about ``--tokens`` tokens each, free
  (``ignore_eos``, ``max_tokens``) and then under a JSON schema (a list of twelve
  small objects, about as many tokens), then half free, a quarter under the schema
  and a quarter forced to call a tool, all in one batch: tokens per second of each
  and the schema's over the free figure (the target: at least 0.85), medians of three
  alternated runs;
- the first-token time of a request with a schema never seen (the grammar is
  compiled), of a second one with the same schema (the cached grammar), and of a
  free one; the second over the free one is the cost a cached schema adds (the
  target: under 5 ms).  Medians of thirty rounds, each with a schema of its own, the
  second and the free request taking turns at going first.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROUNDS = 30
ASK = [{"role": "user", "content": "list the items"}]


def items_schema(tag: str = "") -> dict:
    item = {
        "type": "object",
        "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99}, "ok": {"type": "boolean"}},
        "required": ["id", "ok"],
        "additionalProperties": False,
    }
    if tag:  # a schema of its own, so its grammar is compiled afresh
        item["properties"]["tag"] = {"enum": [tag]}
    return {"type": "array", "items": item, "minItems": 12, "maxItems": 12}


TOOL = {
    "type": "function",
    "function": {"name": "record", "parameters": {"type": "object", "properties": {"rows": items_schema()}}},
}


def build_model(folder: Path, layers: int, width: int) -> Path:
    """A GPT-2 with random weights and a 32k byte-level BPE trained on the standard library."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    stdlib = os.path.dirname(json.__file__).rsplit("/", 1)[0]
    files = sorted(glob.glob(f"{stdlib}/**/*.py", recursive=True))[:1500]

    def texts():
        for name in files:
            try:
                yield Path(name).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=32000, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(texts(), trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    tokenizer.chat_template = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}<|assistant|>"
    tokenizer.save_pretrained(folder)
    config = GPT2Config(
        vocab_size=len(tokenizer), n_positions=1024, n_embd=width, n_layer=layers, n_head=4, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


def stream(url: str, body: dict) -> tuple[float, float, int]:
    """One chat stream: (seconds to its first piece, seconds in all, completion tokens)."""
    start = time.perf_counter()
    first = None
    tokens = 0
    body = {"model": "gpt", "messages": ASK, "stream": True, "stream_options": {"include_usage": True}, **body}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk["choices"] and chunk["choices"][0]["delta"].get("content", "") != "":
                first = time.perf_counter() - start
            if first is None and chunk["choices"] and chunk["choices"][0]["delta"].get("tool_calls"):
                first = time.perf_counter() - start
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return first or 0.0, time.perf_counter() - start, tokens


def concurrent(url: str, bodies: list[dict]) -> float:
    """Tokens per second of these streams, all started at once."""
    results: list[tuple[float, float, int]] = []
    threads = [threading.Thread(target=lambda b=b: results.append(stream(url, b))) for b in bodies]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return sum(r[2] for r in results) / wall


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=120)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "framework"))
    from servekit.testing import ServerProcess

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        build_model(base / "gpt", args.layers, args.width)
        (base / "gpt" / "servekit.yaml").write_text("options: {intra_op_threads: 1}\n")
        with ServerProcess(base, workers=1, env={"HF_HUB_OFFLINE": "1"}) as server:
            url = server.url
            free = {"max_tokens": args.tokens, "ignore_eos": True, "temperature": 1.0}
            schema = {
                "max_tokens": 1000,
                "temperature": 1.0,
                "response_format": {"type": "json_schema", "json_schema": {"name": "items", "schema": items_schema()}},
            }
            tool = {"max_tokens": 1000, "temperature": 1.0, "tools": [TOOL], "tool_choice": "required",
                    "parallel_tool_calls": False}  # fmt: skip
            concurrent(url, [free, schema])  # warm: the first steps, the grammar compiled
            n = args.streams
            rates: dict[str, list[float]] = {"free": [], "schema": [], "mixed": []}
            mixed = [free] * (n // 2) + [schema] * (n // 4) + [tool] * (n - n // 2 - n // 4)
            for _ in range(3):  # alternated, medians taken: the shared machine's noise hits each kind alike
                rates["free"].append(concurrent(url, [free] * n))
                rates["schema"].append(concurrent(url, [schema] * n))
                rates["mixed"].append(concurrent(url, mixed))
            free_rate, schema_rate, mixed_rate = (statistics.median(rates[k]) for k in ("free", "schema", "mixed"))
            print(f"{n} streams: free {free_rate:.0f} tokens/s, under a JSON schema {schema_rate:.0f} tokens/s "
                  f"({schema_rate / free_rate:.2f}x), mixed free/schema/tool {mixed_rate:.0f} tokens/s")  # fmt: skip
            firsts, seconds, frees = [], [], []
            for round_ in range(ROUNDS):
                fresh = {**schema, "max_tokens": 8}
                fresh["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {"name": "items", "schema": items_schema(f"round-{round_}-{time.time()}")},
                }
                firsts.append(stream(url, fresh)[0])
                if round_ % 2:
                    frees.append(stream(url, {**free, "max_tokens": 8})[0])
                seconds.append(stream(url, fresh)[0])
                if not round_ % 2:
                    frees.append(stream(url, {**free, "max_tokens": 8})[0])
            first, second, plain = (statistics.median(v) * 1000 for v in (firsts, seconds, frees))
            print(f"first token: new schema {first:.1f} ms, same schema again {second:.1f} ms, free {plain:.1f} ms "
                  f"(the cached schema adds {second - plain:.1f} ms)")  # fmt: skip


if __name__ == "__main__":
    main()
