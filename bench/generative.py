"""Concurrent chat streams on one small causal LM: per-request ``generate`` against continuous batching.

    python bench/generative.py [--levels 1,4,16,64] [--tokens 128] [--workers 2] [--threads 32]

One ``servekit serve`` holds the same tiny GPT-2 (random weights, built here)
three times: ``generate`` (``options.continuous_batching: false``: one
``model.generate`` per request, as before), ``continuous`` (a batch per HTTP
worker, the default) and ``continuous-host`` (``placement: process``: every
worker feeds one batch in a model host).  For each model and each level N, N
chat streams run at once through the ``openai`` client (spread over four
client processes, so the client's own parsing is not the bottleneck), each asking for
``--tokens`` new tokens (``ignore_eos``), and the script prints total tokens
per second, time to first token p50/p99 and the gap between streamed chunks
(inter-token latency) p50/p99, side by side; then all-MiniLM-L6-v2 answers
``--embeddings`` concurrent single-text embeddings requests without and with
adaptive batching (``batching: {max_batch_size: 64}``).  First, the same GPT-2 in this process
without HTTP (threads calling ``complete``) shows what the model side alone
does.  The numbers are also
written as JSON
beside this file (``results/generative.json``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the suite's tiny model builder

MODELS = {
    "generate": "options: {continuous_batching: false}\n",
    "continuous": "",
    "continuous-host": "placement: process\n",
}
MESSAGES = [{"role": "user", "content": "hello there, how are you?"}]
#: client processes the streams are spread over
CLIENT_PROCESSES = 4


def build(base: Path) -> None:
    from generative_models import build_tiny_gpt2

    first = build_tiny_gpt2(base / "generate")
    for name, settings in MODELS.items():
        folder = base / name
        if folder != first:
            folder.mkdir()
            for item in first.iterdir():
                if item.name != "servekit.yaml":
                    (folder / item.name).symlink_to(item)
        (folder / "servekit.yaml").write_text(settings or "{}\n")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def one_stream(client, model: str, tokens: int) -> dict:
    start = time.perf_counter()
    arrivals: list[float] = []
    completion = 0
    stream = client.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=tokens,
        temperature=1.0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.perf_counter())
        if chunk.usage is not None:
            completion = chunk.usage.completion_tokens
    return {
        "ttft": arrivals[0] - start if arrivals else float("nan"),
        "gaps": [b - a for a, b in zip(arrivals, arrivals[1:])],
        "tokens": completion,
    }


_client = None


def _streams(url: str, model: str, count: int, tokens: int) -> list[dict]:
    """``count`` streams at once from this client process (its own GIL), one thread each."""
    global _client
    import openai

    if _client is None:
        _client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)
    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(lambda _: one_stream(_client, model, tokens), range(count)))


def level(clients: ProcessPoolExecutor, url: str, model: str, streams: int, tokens: int) -> dict:
    """``streams`` chats at once, spread over the client processes (the openai client parses in Python)."""
    share = [streams // CLIENT_PROCESSES + (i < streams % CLIENT_PROCESSES) for i in range(CLIENT_PROCESSES)]
    start = time.perf_counter()
    futures = [clients.submit(_streams, url, model, n, tokens) for n in share if n]
    results = [r for f in futures for r in f.result()]
    wall = time.perf_counter() - start
    ttfts = [r["ttft"] for r in results]
    gaps = [g for r in results for g in r["gaps"]]
    total = sum(r["tokens"] for r in results)
    return {
        "model": model,
        "streams": streams,
        "tokens": total,
        "seconds": wall,
        "tokens_per_s": total / wall,
        "ttft_p50_ms": 1e3 * statistics.median(ttfts),
        "ttft_p99_ms": 1e3 * percentile(ttfts, 99),
        "itl_p50_ms": 1e3 * percentile(gaps, 50),
        "itl_p99_ms": 1e3 * percentile(gaps, 99),
    }


EMBED_MODELS = {"minilm": "{}\n", "minilm-batched": "batching: {max_batch_size: 64, max_batch_time_ms: 5}\n"}


def build_embedders(base: Path) -> None:
    from generative_models import minilm_folder

    for name, settings in EMBED_MODELS.items():
        folder = base / name
        folder.mkdir()
        for item in minilm_folder().iterdir():
            if item.name != "servekit.yaml":
                (folder / item.name).symlink_to(item)
        (folder / "servekit.yaml").write_text(settings)


def _embeddings(url: str, model: str, count: int, rounds: int) -> int:
    """``count`` threads each sending ``rounds`` single-text requests."""
    global _client
    import openai

    if _client is None:
        _client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)

    def worker(i: int) -> int:
        for r in range(rounds):
            _client.embeddings.create(model=model, input=f"request {i} round {r}: the quick brown fox")
        return rounds

    with ThreadPoolExecutor(count) as pool:
        return sum(pool.map(worker, range(count)))


def embed_level(clients: ProcessPoolExecutor, url: str, model: str, concurrent: int, rounds: int) -> dict:
    share = [concurrent // CLIENT_PROCESSES] * CLIENT_PROCESSES
    start = time.perf_counter()
    done = sum(f.result() for f in [clients.submit(_embeddings, url, model, n, rounds) for n in share])
    wall = time.perf_counter() - start
    return {"model": model, "concurrent": concurrent, "requests": done, "requests_per_s": done / wall}


def in_process(base: Path, levels: list[int], tokens: int) -> list[dict]:
    """The same model without HTTP: N threads calling ``complete`` (what the model side alone can do)."""
    from servekit.generation import GenerationRequest
    from servekit.types import ModelConfig
    from servekit_huggingface import loader

    rows = []
    for name, options in (("generate", {"continuous_batching": False}), ("continuous", {})):
        model = loader.load_folder(base / "generate", ModelConfig(options=options))
        ask = GenerationRequest(prompt="hello there", max_tokens=tokens, temperature=1.0, options={"ignore_eos": True})
        model.complete(ask)  # warm up
        for n in levels:
            start = time.perf_counter()
            with ThreadPoolExecutor(n) as pool:
                done = sum(r.completion_tokens for r in pool.map(model.complete, [ask] * n))
            rows.append({"model": name, "streams": n, "tokens_per_s": done / (time.perf_counter() - start)})
            print(json.dumps(rows[-1]), flush=True)
        if model.scheduler is not None:
            model.scheduler.stop()
    return rows


def table(rows: list[dict], levels: list[int]) -> str:
    lines = [
        "| streams | model | tokens/s | vs generate | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for n in levels:
        base = next(r for r in rows if r["streams"] == n and r["model"] == "generate")["tokens_per_s"]
        for r in (r for r in rows if r["streams"] == n):
            lines.append(
                f"| {n} | {r['model']} | {r['tokens_per_s']:,.0f} | {r['tokens_per_s'] / base:.2f}x | "
                f"{r['ttft_p50_ms']:,.0f} ms | {r['ttft_p99_ms']:,.0f} ms | "
                f"{r['itl_p50_ms']:.1f} ms | {r['itl_p99_ms']:.1f} ms |"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", default="1,4,16,64")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--workers", default="auto")
    parser.add_argument("--threads", type=int, default=32, help="per worker: enough for every stream to be in flight")
    parser.add_argument("--embeddings", type=int, default=64, help="concurrent single-text embeddings requests")
    parser.add_argument("--in-process-only", action="store_true", help="only the model side, without a server")
    args = parser.parse_args()
    levels = [int(n) for n in args.levels.split(",")]

    from servekit.testing import ServerProcess

    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        build(base)
        local = in_process(base, levels, args.tokens)
        print(
            "in process, tokens/s: "
            + "; ".join(
                f"{n} streams: generate {g['tokens_per_s']:,.0f}, continuous {c['tokens_per_s']:,.0f} "
                f"({c['tokens_per_s'] / g['tokens_per_s']:.2f}x)"
                for n in levels
                for g, c in [[r for r in local if r["streams"] == n]]
            )
        )
        if args.in_process_only:
            return 0
        build_embedders(base)
        env = {"HF_HUB_OFFLINE": "1"}
        embed_rows: list[dict] = []
        server = ServerProcess(base, workers=args.workers, threads=args.threads, env=env)
        server.start(timeout=900)  # five models load in every worker
        with server, ProcessPoolExecutor(CLIENT_PROCESSES) as clients:
            url = server.url + "/v1"
            for model in MODELS:  # warm up: every worker's copy, the host, every client process
                level(clients, url, model, 2 * CLIENT_PROCESSES, 8)
            for n in levels:
                for model in MODELS:
                    rows.append(level(clients, url, model, n, args.tokens))
                    print(json.dumps(rows[-1]), flush=True)
            for model in EMBED_MODELS:
                embed_level(clients, url, model, CLIENT_PROCESSES * 2, 2)  # warm up
                embed_rows.append(embed_level(clients, url, model, args.embeddings, 8))
                print(json.dumps(embed_rows[-1]), flush=True)
    out = HERE / "results" / "generative.json"
    out.parent.mkdir(exist_ok=True)
    document = {"tokens": args.tokens, "rows": rows, "in_process": local, "embeddings": embed_rows}
    out.write_text(json.dumps(document, indent=1))
    print(table(rows, levels))
    unbatched, batched = (r["requests_per_s"] for r in embed_rows)
    print(
        f"\nembeddings, {args.embeddings} concurrent single-text requests: {unbatched:,.0f}/s unbatched, "
        f"{batched:,.0f}/s batched ({batched / unbatched:.2f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
