"""What log-probabilities cost in the continuous-batching scheduler.

    python bench/logprobs.py [--levels 16,64] [--tokens 64] [--rounds 2]

1. The model side without HTTP (threads calling ``complete`` on the bench GPT-2
   of ``bench/generative.py``, 12 blocks x 128, greedy, ``ignore_eos``): total
   tokens/s with no request asking for log-probabilities, every request asking
   ``logprobs: 5`` or ``20``, and half of them asking 5; the variants interleave
   over ``--rounds`` so drifting machine load touches each alike.
2. One step's scoring alone (``ScoredRows``: the log-softmax and top-k of the
   rows that asked) on random logits of real vocabulary sizes, against the
   rows that ask, since the bench model's vocabulary (the suite's 400-token
   tokenizer) makes the first part's softmax nearly free.

Prints one JSON line per measurement, then a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "support"))
sys.path.insert(0, str(HERE))

VARIANTS = {"off": (None, None), "all-5": (5, 5), "all-20": (20, 20), "half-5": (5, None)}


def model_side(levels: list[int], tokens: int, rounds: int) -> list[dict]:
    from generative import build_gpt2
    from servekit.dataplane.generation import GenerationRequest
    from servekit.types import ModelConfig
    from servekit_huggingface import loader

    folder = build_gpt2(Path(tempfile.mkdtemp()) / "gpt", 12, 128)
    model = loader.load_folder(folder, ModelConfig(options={}))
    kw = {"prompt": "hello there", "max_tokens": tokens, "temperature": 0, "options": {"ignore_eos": True}}
    model.complete(GenerationRequest(**kw))  # warm up
    totals: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for n in levels:
            for name, (even, odd) in VARIANTS.items():
                asks = [GenerationRequest(**kw, logprobs=even if i % 2 == 0 else odd) for i in range(n)]
                start, cpu = time.perf_counter(), time.process_time()
                with ThreadPoolExecutor(n) as pool:
                    done = sum(r.completion_tokens for r in pool.map(model.complete, asks))
                wall, used = time.perf_counter() - start, time.process_time() - cpu
                totals.setdefault((name, n), []).append(done / wall)
                row = {"variant": name, "streams": n, "tokens_per_s": round(done / wall, 1)}
                row["cpu_us_per_token"] = round(used / done * 1e6)
                print(json.dumps(row), flush=True)
    model.close()
    return [
        {"variant": name, "streams": n, "tokens_per_s": round(sum(v) / len(v), 1)} for (name, n), v in totals.items()
    ]


def scoring(vocabs: list[int], rows: int) -> list[dict]:
    import torch
    from servekit_huggingface.scheduler import ScoredRows, Sequence

    out = []
    for vocab in vocabs:
        logits = torch.randn(rows, vocab)
        for asking in (0, rows // 8, rows):
            seqs = [Sequence([1], 1, lambda lg, t: 0, logprobs=5 if i < asking else None) for i in range(rows)]
            chosen = dict.fromkeys(range(rows), 0)
            ScoredRows(seqs, logits).scores(chosen)  # warm up
            batches = []
            for _ in range(5):  # the median of five batches: a burst of other load touches one
                start = time.perf_counter()
                for _ in range(20):
                    ScoredRows(seqs, logits).scores(chosen)
                batches.append((time.perf_counter() - start) / 20 * 1e3)
            ms = statistics.median(batches)
            out.append({"vocab": vocab, "rows": rows, "asking": asking, "ms_per_step": round(ms, 3)})
            print(json.dumps(out[-1]), flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", default="16,64")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--scoring-only", action="store_true", help="only the scoring of one step")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)  # as a worker's share on this machine's two CPUs
    print(f"load average before: {os.getloadavg()}", flush=True)
    levels = [int(n) for n in args.levels.split(",")]
    side = [] if args.scoring_only else model_side(levels, args.tokens, args.rounds)
    steps = scoring([32_000, 151_936], 64)
    print(f"load average after: {os.getloadavg()}")
    if side:
        print_side(side)
    print("\n| vocab | rows | rows asking | scoring ms/step |\n|---:|---:|---:|---:|")
    for r in steps:
        print(f"| {r['vocab']:,} | {r['rows']} | {r['asking']} | {r['ms_per_step']} |")
    return 0


def print_side(side: list[dict]) -> None:
    print("\n| streams | " + " | ".join(VARIANTS) + " |\n|---:|" + "---:|" * len(VARIANTS))
    for n in sorted({r["streams"] for r in side}):
        cells = [next(r["tokens_per_s"] for r in side if r["variant"] == v and r["streams"] == n) for v in VARIANTS]
        print(f"| {n} | " + " | ".join(f"{c:,.0f} tok/s" for c in cells) + " |")


if __name__ == "__main__":
    raise SystemExit(main())
