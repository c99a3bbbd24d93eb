"""Grammar engines for constrained decoding, measured side by side: xgrammar and llguidance.

For each tokenizer folder given (a tiny one from the tests, a realistic 32k-token
byte-level BPE built locally) and each engine: the time to build the engine's view
of the tokenizer (once per model), to compile a JSON schema (once per schema:
cached), and per generated token the time to fill the allowed-token bitmask and
advance the matcher, walking a valid answer token by token (median of the walk).

    python bench/grammar_engines.py TOKENIZER_FOLDER [TOKENIZER_FOLDER...]

The numbers and the choice are in docs/structured-outputs.md.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
from transformers import AutoTokenizer

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.[a-z]{2,3}$"},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "email", "role", "tags", "address"],
    "additionalProperties": False,
}
ANSWER = {
    "name": "Ada Lovelace",
    "age": 36,
    "email": "ada@example.org",
    "role": "admin",
    "tags": ["math", "engines", "poetry"],
    "address": {"city": "London", "zip": "12345"},
}


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f} ms"


def bench_xgrammar(tokenizer, ids: list[int]) -> dict[str, str]:
    import xgrammar as xgr

    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    t1 = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False, separators=(",", ":"))
    t2 = time.perf_counter()
    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, len(tokenizer))
    logits = torch.zeros(len(tokenizer))
    steps = []
    for token in ids:
        s = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask)
        xgr.apply_token_bitmask_inplace(logits, bitmask[0])
        assert matcher.accept_token(token), token
        steps.append(time.perf_counter() - s)
    return {"tokenizer": _ms(t1 - t0), "compile": _ms(t2 - t1), "per token": _ms(statistics.median(steps)),
            "worst token": _ms(max(steps))}  # fmt: skip


def bench_llguidance(tokenizer, ids: list[int]) -> dict[str, str]:
    import llguidance
    import llguidance.hf
    import llguidance.torch

    t0 = time.perf_counter()
    lltok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=len(tokenizer))
    t1 = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, defaults={"whitespace_flexible": False})
    matcher = llguidance.LLMatcher(lltok, grammar)
    assert not matcher.is_error(), matcher.get_error()
    t2 = time.perf_counter()
    bitmask = llguidance.torch.allocate_token_bitmask(1, len(tokenizer))
    logits = torch.zeros(1, len(tokenizer))
    steps = []
    for token in ids:
        s = time.perf_counter()
        llguidance.torch.fill_next_token_bitmask(matcher, bitmask, 0)
        llguidance.torch.apply_token_bitmask_inplace(logits, bitmask)
        assert matcher.consume_token(token), (token, matcher.get_error())
        steps.append(time.perf_counter() - s)
    return {"tokenizer": _ms(t1 - t0), "compile": _ms(t2 - t1), "per token": _ms(statistics.median(steps)),
            "worst token": _ms(max(steps))}  # fmt: skip


def main(folders: list[str]) -> None:
    torch.set_num_threads(1)
    for folder in folders:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        ids = tokenizer.encode(json.dumps(ANSWER, separators=(",", ":")), add_special_tokens=False)
        print(f"{folder}: {len(tokenizer)} tokens in the vocabulary, the answer is {len(ids)} tokens")
        for name, run in (("xgrammar", bench_xgrammar), ("llguidance", bench_llguidance)):
            print(f"  {name:10s}", run(tokenizer, ids))


if __name__ == "__main__":
    main(sys.argv[1:])
