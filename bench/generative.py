"""Concurrent chat streams on one small causal LM: per-request ``generate`` against continuous batching.

    python bench/generative.py [--levels 1,4,16,64] [--tokens 128] [--workers 2] [--threads 64]
                               [--layers 12] [--width 128]

One ``servekit serve`` holds the same small GPT-2 (random weights, built here:
``--layers`` blocks of ``--width``, the suite's 400-token byte-level tokenizer)
three times: ``generate`` (``options.continuous_batching: false``: one
``model.generate`` per request, as before), ``continuous`` (a batch per HTTP
worker, the default) and ``continuous-host`` (``placement: process``: every
worker feeds one batch in a model host).  For each model and each level N, N
chat streams run at once through the ``openai`` client (spread over four
client processes, so the client's own parsing is not the bottleneck), each asking for
``--tokens`` new tokens (``ignore_eos``), and the script prints total tokens
per second, time to first token p50/p99 and the gap between streamed chunks
(inter-token latency) p50/p99, side by side, with each model's throughput
over the one-at-a-time figure (``generate`` with one stream: the issue's
baseline) and the CPU time each process kind (workers, model host) spent per
generated token; then all-MiniLM-L6-v2 answers
``--embeddings`` concurrent single-text embeddings requests without and with
adaptive batching (:data:`EMBED_MODELS`), with the texts per ``embed`` call
(``servekit_batch_size`` at ``/metrics``) and the CPU time per request of the
workers and of the client processes.  First, the same GPT-2 in this process
without HTTP (threads calling ``complete``) shows what the model side alone
does.  The numbers are also
written as JSON
beside this file (``results/generative.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

from servekit.tally import FLUSH_SECONDS

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
#: the one-stream level runs this many streams one after another (one TTFT sample would be noise)
ONE_STREAM_ROUNDS = 4


def build_gpt2(folder: Path, layers: int, width: int) -> Path:
    """The suite's tiny GPT-2 folder (tokenizer, chat template) with a model of ``layers`` x ``width``.

    The default, 12 x 128 (GPT-2 small's twelve blocks, 64-wide heads, a narrow
    width), makes a decoding step cost what a small real model's does on a GPU
    in eager PyTorch (about 7-9 ms alone: the per-block fixed cost, which is
    what batching shares), while 64 rows' arithmetic stays small on a CPU core
    as it does on a GPU.  The tests' 2 x 32 model steps in well under a
    millisecond, less than one SSE chunk costs, so it measures HTTP rather than
    batching; GPT-2 small's own 768 width would make a CPU step arithmetic-bound,
    which no GPU deployment of a small model is.
    """
    import torch
    from generative_models import build_tiny_gpt2
    from transformers import GPT2Config, GPT2LMHeadModel

    build_tiny_gpt2(folder)
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    config = GPT2Config(
        vocab_size=vocab,
        n_positions=256,
        n_embd=width,
        n_layer=layers,
        n_head=max(1, width // 64),
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


def build(base: Path, layers: int, width: int) -> None:
    first = build_gpt2(base / "generate", layers, width)
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


def _tree(root: int) -> dict[int, str]:
    """The server's processes by kind: ``workers`` (the HTTP workers, forked) and ``host`` (model hosts)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    kinds: dict[int, str] = {}
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        try:
            command = (Path("/proc") / str(pid) / "cmdline").read_bytes()
        except OSError:
            continue
        kinds[pid] = "host" if b"servekit.hosts.host" in command else "master" if pid == root else "workers"
        frontier.extend(child for child, parent in parents.items() if parent == pid)
    return kinds


def cpu_seconds(root: int) -> dict[str, float]:
    """User + system CPU seconds so far of the server's processes, summed by kind."""
    tick = os.sysconf("SC_CLK_TCK")
    totals: dict[str, float] = {}
    for pid, kind in _tree(root).items():
        try:
            fields = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        totals[kind] = totals.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return totals


_client = None


def _streams(url: str, model: str, count: int, tokens: int, rounds: int = 1) -> list[dict]:
    """``count`` streams at once from this client process (its own GIL), one thread each, each
    thread running ``rounds`` streams one after another."""
    global _client
    import openai

    if _client is None:
        _client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)
    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(lambda _: one_stream(_client, model, tokens), range(count * rounds)))


def level(clients: ProcessPoolExecutor, url: str, model: str, streams: int, tokens: int, root: int = 0) -> dict:
    """``streams`` chats at once, spread over the client processes (the openai client parses in Python)."""
    share = [streams // CLIENT_PROCESSES + (i < streams % CLIENT_PROCESSES) for i in range(CLIENT_PROCESSES)]
    rounds = ONE_STREAM_ROUNDS if streams == 1 else 1  # one stream: several in a row, for TTFT percentiles
    before = cpu_seconds(root) if root else {}
    start = time.perf_counter()
    futures = [clients.submit(_streams, url, model, n, tokens, rounds) for n in share if n]
    results = [r for f in futures for r in f.result()]
    wall = time.perf_counter() - start
    after = cpu_seconds(root) if root else {}
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
        # CPU time per generated token, by process kind (the master only forks and watches)
        **{f"cpu_us_per_token_{k}": 1e6 * (after[k] - before.get(k, 0.0)) / max(total, 1) for k in after},
    }


#: ``minilm-batched`` waits for the running call (up to 1 s) and so runs one batch at a time per worker;
#: with 5 ms its batch-mates stop waiting long before a ~100 ms call ends and run in small concurrent calls
EMBED_MODELS = {
    "minilm": "{}\n",
    "minilm-batched": "batching: {max_batch_size: 64, max_batch_time_ms: 1000}\n",
    "minilm-batched-5ms": "batching: {max_batch_size: 64, max_batch_time_ms: 5}\n",
}


def build_embedders(base: Path) -> None:
    from generative_models import minilm_folder

    for name, settings in EMBED_MODELS.items():
        folder = base / name
        folder.mkdir()
        for item in minilm_folder().iterdir():
            if item.name != "servekit.yaml":
                (folder / item.name).symlink_to(item)
        (folder / "servekit.yaml").write_text(settings)


def _embeddings(url: str, model: str, count: int, rounds: int) -> tuple[int, float]:
    """``count`` threads each sending ``rounds`` single-text requests; how many, and this
    client process's CPU seconds meanwhile (the openai client's share of the cores).

    A client of its own each time: connections left idle between levels (the
    ``/metrics`` scrapes wait for the workers' flush) could outlive the server's
    keep-alive and be closed just as a request reuses them (no retries here)."""
    import openai

    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)

    def worker(i: int) -> int:
        for r in range(rounds):
            client.embeddings.create(model=model, input=f"request {i} round {r}: the quick brown fox")
        return rounds

    start = time.process_time()
    with client, ThreadPoolExecutor(count) as pool:
        done = sum(pool.map(worker, range(count)))
    return done, time.process_time() - start


def embed_calls(url: str, model: str) -> tuple[float, float]:
    """``servekit_batch_size{model}``'s count and sum from ``/metrics``: embed calls and the texts in them."""
    from urllib.request import urlopen

    from prometheus_client.parser import text_string_to_metric_families

    found = {"servekit_batch_size_count": 0.0, "servekit_batch_size_sum": 0.0}
    with urlopen(url + "/metrics", timeout=60) as reply:
        for family in text_string_to_metric_families(reply.read().decode()):
            for sample in family.samples:
                if sample.name in found and sample.labels.get("model") == model:
                    found[sample.name] += sample.value
    return found["servekit_batch_size_count"], found["servekit_batch_size_sum"]


def embed_level(
    clients: ProcessPoolExecutor, url: str, model: str, concurrent: int, rounds: int, root: int = 0
) -> dict:
    """``concurrent`` single-text requests at once, spread over the client processes; with ``root``
    (the server's pid) also the embed calls they made and the CPU seconds of each process kind."""
    share = [concurrent // CLIENT_PROCESSES] * CLIENT_PROCESSES
    if root:
        time.sleep(3 * FLUSH_SECONDS)  # the warm-up's last observations reach /metrics first
    before = cpu_seconds(root) if root else {}
    calls_before = embed_calls(url, model) if root else (0.0, 0.0)
    start = time.perf_counter()
    parts = [f.result() for f in [clients.submit(_embeddings, url + "/v1", model, n, rounds) for n in share]]
    wall = time.perf_counter() - start
    row = {"model": model, "concurrent": concurrent, "requests": sum(n for n, _ in parts), "seconds": wall}
    if root:
        after = cpu_seconds(root)
        time.sleep(3 * FLUSH_SECONDS)  # every worker's last observations reach /metrics
        row["embed_calls"], row["texts"] = (a - b for a, b in zip(embed_calls(url, model), calls_before))
        row["cpu_s_workers"] = after["workers"] - before["workers"]
        row["cpu_s_clients"] = sum(cpu for _, cpu in parts)
    return row


def embed_summary(rows: list[dict]) -> dict:
    """One model's interleaved rounds summed: requests per second, texts per embed call, CPU per request."""
    total = {key: sum(r[key] for r in rows) for key in ("requests", "seconds", "embed_calls", "texts")}
    cpu = {kind: sum(r[f"cpu_s_{kind}"] for r in rows) for kind in ("workers", "clients")}
    return {
        "model": rows[0]["model"],
        "concurrent": rows[0]["concurrent"],
        "rounds": len(rows),
        **total,
        "requests_per_s": total["requests"] / total["seconds"],
        "requests_per_s_by_round": [r["requests"] / r["seconds"] for r in rows],
        "texts_per_call": total["texts"] / max(total["embed_calls"], 1),
        **{f"cpu_ms_per_request_{kind}": 1e3 * cpu[kind] / total["requests"] for kind in cpu},
    }


def in_process(base: Path, levels: list[int], generate_levels: list[int], tokens: int) -> list[dict]:
    """The same model without HTTP: N threads calling ``complete`` (what the model side alone can do)."""
    from servekit.generation import GenerationRequest
    from servekit.types import ModelConfig
    from servekit_huggingface import loader

    rows = []
    for name, options, counts in (
        ("generate", {"continuous_batching": False}, generate_levels),
        ("continuous", {}, levels),
    ):
        model = loader.load_folder(base / "generate", ModelConfig(options=options))
        ask = GenerationRequest(prompt="hello there", max_tokens=tokens, temperature=1.0, options={"ignore_eos": True})
        model.complete(ask)  # warm up
        for n in counts:
            start = time.perf_counter()
            with ThreadPoolExecutor(n) as pool:
                done = sum(r.completion_tokens for r in pool.map(model.complete, [ask] * n))
            rows.append({"model": name, "streams": n, "tokens_per_s": done / (time.perf_counter() - start)})
            print(json.dumps(rows[-1]), flush=True)
        if model.scheduler is not None:
            model.scheduler.stop()
    return rows


def table(rows: list[dict], levels: list[int]) -> str:
    """Side by side: each row over ``generate`` at the same level and over one stream at a time."""
    lines = [
        "| streams | model | tokens/s | vs one at a time | vs generate | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 "
        "| CPU/token workers | CPU/token host |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    alone = _find(rows, "generate", 1)
    for n in levels:
        same = _find(rows, "generate", n)
        for r in (r for r in rows if r["streams"] == n):
            over_alone = f"{r['tokens_per_s'] / alone['tokens_per_s']:.2f}x" if alone else "-"
            over_same = f"{r['tokens_per_s'] / same['tokens_per_s']:.2f}x" if same else "-"
            host = r.get("cpu_us_per_token_host")
            lines.append(
                f"| {n} | {r['model']} | {r['tokens_per_s']:,.0f} | {over_alone} | {over_same} | "
                f"{r['ttft_p50_ms']:,.0f} ms | {r['ttft_p99_ms']:,.0f} ms | "
                f"{r['itl_p50_ms']:.1f} ms | {r['itl_p99_ms']:.1f} ms | "
                f"{r.get('cpu_us_per_token_workers', float('nan')):,.0f} us | "
                + (f"{host:,.0f} us |" if host is not None else "- |")
            )
    return "\n".join(lines)


def _find(rows: list[dict], model: str, streams: int) -> dict | None:
    return next((r for r in rows if r["streams"] == streams and r["model"] == model), None)


def targets(rows: list[dict]) -> list[str]:
    """The issue's targets, each model against them: throughput over one stream at a time, TTFT p99 at 16."""
    alone = _find(rows, "generate", 1)
    lines = []
    for model in MODELS:
        if model == "generate" or alone is None:
            continue
        parts = []
        for n, goal in ((16, 6), (64, 10)):
            r = _find(rows, model, n)
            if r:
                gain = r["tokens_per_s"] / alone["tokens_per_s"]
                parts.append(f"{n} streams {gain:.2f}x (target {goal}x: {'met' if gain >= goal else 'missed'})")
        unloaded, loaded = _find(rows, model, 1), _find(rows, model, 16)
        if unloaded and loaded:
            ratio = loaded["ttft_p99_ms"] / unloaded["ttft_p99_ms"]
            parts.append(
                f"TTFT p99 at 16 streams {ratio:.2f}x unloaded (target <= 3x: {'met' if ratio <= 3 else 'missed'})"
            )
        lines.append(f"{model}: " + "; ".join(parts))
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", default="1,4,16,64")
    parser.add_argument(
        "--generate-levels", default="1,4,16", help="levels for per-request generate (64 of them take minutes)"
    )
    parser.add_argument("--layers", type=int, default=12, help="the bench GPT-2's blocks")
    parser.add_argument("--width", type=int, default=128, help="the bench GPT-2's hidden size")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--workers", default="auto")
    parser.add_argument(
        "--threads", type=int, default=64, help="per worker: every stream in flight however the connections spread"
    )
    parser.add_argument("--embeddings", type=int, default=64, help="concurrent single-text embeddings requests")
    parser.add_argument("--embed-rounds", type=int, default=3, help="interleaved rounds of each embeddings model")
    parser.add_argument("--in-process-only", action="store_true", help="only the model side, without a server")
    parser.add_argument("--embeddings-only", action="store_true", help="only the embeddings, through a server")
    args = parser.parse_args()
    levels = [int(n) for n in args.levels.split(",")]
    generate_levels = [int(n) for n in args.generate_levels.split(",")]

    from servekit.testing import ServerProcess

    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        if args.embeddings_only:
            levels, local = [], []
        else:
            build(base, args.layers, args.width)
            local = in_process(base, levels, generate_levels, args.tokens)
        one = _find(local, "generate", 1)
        print(
            "in process, tokens/s: "
            + "; ".join(
                f"{r['model']} {r['streams']}: {r['tokens_per_s']:,.0f}"
                + (f" ({r['tokens_per_s'] / one['tokens_per_s']:.2f}x one at a time)" if one else "")
                for r in local
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
            for model in MODELS if levels else ():  # warm up: every worker's copy, the host, every client process
                level(clients, url, model, 2 * CLIENT_PROCESSES, 8)
            root = server.proc.pid if server.proc else 0
            for n in levels:
                for model in MODELS:
                    if model == "generate" and n not in generate_levels:
                        continue
                    rows.append(level(clients, url, model, n, args.tokens, root))
                    print(json.dumps(rows[-1]), flush=True)
            for model in EMBED_MODELS:
                embed_level(clients, server.url, model, CLIENT_PROCESSES * 2, 2)  # warm up
            by_model: dict[str, list[dict]] = {model: [] for model in EMBED_MODELS}
            for _ in range(args.embed_rounds):  # interleaved: a noisy machine's slow spell hits every model
                for model in EMBED_MODELS:
                    by_model[model].append(embed_level(clients, server.url, model, args.embeddings, 8, root))
                    print(json.dumps(by_model[model][-1]), flush=True)
            embed_rows = [embed_summary(rounds) for rounds in by_model.values()]
    out = HERE / "results" / "generative.json"
    out.parent.mkdir(exist_ok=True)
    document = {
        "tokens": args.tokens,
        "model": {"layers": args.layers, "width": args.width},
        "load_average": os.getloadavg(),
        "rows": rows,
        "in_process": local,
        "embeddings": embed_rows,
    }
    out.write_text(json.dumps(document, indent=1))
    print(table(rows, levels))
    print("\n".join(targets(rows)))
    unbatched = embed_rows[0]["requests_per_s"]
    print(
        f"\nembeddings, {args.embeddings} concurrent single-text requests: "
        + "; ".join(
            f"{r['model']} {r['requests_per_s']:,.0f}/s ({r['requests_per_s'] / unbatched:.2f}x; rounds "
            + "/".join(f"{v:,.0f}" for v in r["requests_per_s_by_round"])
            + "), "
            f"{r['texts_per_call']:.1f} texts per embed call, CPU per request "
            f"{r['cpu_ms_per_request_workers']:.1f} ms workers, {r['cpu_ms_per_request_clients']:.1f} ms clients"
            for r in embed_rows
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
