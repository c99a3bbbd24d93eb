"""The same streams through three protocols: OpenAI completions (SSE), Triton's generate_stream (SSE)
and V2 gRPC ``ModelStreamInfer`` (tritonclient: a call per stream, and every request on one call),
on one continuous batch.

    python bench/generate_protocols.py [--levels 1,16,64] [--tokens 64] [--workers 2] [--layers 12] [--width 128]

One ``servekit serve`` (``--workers`` HTTP workers, each with its gRPC server)
holds the bench GPT-2 of ``bench/generative.py`` in one model host
(``placement: process``), so every protocol feeds the same scheduler.  For each
level N, N streams run at once per protocol (threads in this process, each
with its own connection; ``grpc-one-call``: N requests on one ``ModelStreamInfer``
call, from one client), each asking for ``--tokens`` new tokens
(``ignore_eos``, sampled at temperature 1, seeded); the script prints tokens per
second, time to first piece p50/p99 and the gap between pieces p50, side by
side, with the load average before each run.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "support"))

from generative import build_gpt2, percentile  # noqa: E402

PROMPT = "hello there, how are you?"


def _timed(pieces) -> dict:
    start = time.perf_counter()
    arrivals = []
    for _ in pieces:
        arrivals.append(time.perf_counter())
    return {"ttft": arrivals[0] - start, "gaps": [b - a for a, b in zip(arrivals, arrivals[1:])], "n": len(arrivals)}


def openai_pieces(url: str, tokens: int, seed: int):
    import requests

    body = {"model": "gpt", "prompt": PROMPT, "max_tokens": tokens, "temperature": 1.0, "seed": seed}
    with requests.post(url + "/v1/completions", json={**body, "stream": True, "ignore_eos": True}, stream=True) as r:
        for line in r.iter_lines():
            if line.startswith(b"data: {") and json.loads(line[6:])["choices"][0]["text"]:
                yield line


def generate_pieces(url: str, tokens: int, seed: int):
    import requests

    body = {"text_input": PROMPT, "max_tokens": tokens, "temperature": 1.0, "seed": seed, "ignore_eos": True}
    with requests.post(url + "/v2/models/gpt/generate_stream", json=body, stream=True) as r:
        for line in r.iter_lines():
            if line.startswith(b"data: {"):
                yield line


def grpc_pieces(address: str, tokens: int, seed: int):
    import numpy as np
    import tritonclient.grpc as grpcclient

    prompt = grpcclient.InferInput("text_input", [1], "BYTES")
    prompt.set_data_from_numpy(np.array([PROMPT.encode()], dtype=object))
    got: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(address) as client:
        client.start_stream(callback=lambda result, error: got.put(error or result))
        parameters = {"max_tokens": tokens, "temperature": "1.0", "seed": seed, "ignore_eos": True}
        client.async_stream_infer("gpt", [prompt], parameters=parameters, enable_empty_final_response=True)
        while True:
            item = got.get(timeout=600)
            if isinstance(item, Exception):
                raise item
            if item.get_response().parameters["triton_final_response"].bool_param:
                break
            yield item
        client.stop_stream()


def one_call(address: str, streams: int, tokens: int) -> list[dict]:
    """``streams`` generate requests on one ModelStreamInfer call (vLLM's sample client's way)."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    prompt = grpcclient.InferInput("text_input", [1], "BYTES")
    prompt.set_data_from_numpy(np.array([PROMPT.encode()], dtype=object))
    got: queue.Queue = queue.Queue()
    arrivals: dict[str, list[float]] = {str(i): [] for i in range(streams)}
    with grpcclient.InferenceServerClient(address) as client:
        client.start_stream(callback=lambda result, error: got.put((time.perf_counter(), error or result)))
        start = time.perf_counter()
        for i in range(streams):
            parameters = {"max_tokens": tokens, "temperature": "1.0", "seed": i, "ignore_eos": True}
            client.async_stream_infer(
                "gpt", [prompt], request_id=str(i), parameters=parameters, enable_empty_final_response=True
            )
        finals = 0
        while finals < streams:
            at, item = got.get(timeout=600)
            if isinstance(item, Exception):
                raise item
            response = item.get_response()
            if response.parameters["triton_final_response"].bool_param:
                finals += 1
            else:
                arrivals[response.id].append(at)
        client.stop_stream()
    return [
        {"ttft": times[0] - start, "gaps": [b - a for a, b in zip(times, times[1:])], "n": len(times)}
        for times in arrivals.values()
    ]


def run_level(pieces, target: str, streams: int, tokens: int) -> dict:
    load = os.getloadavg()[0]
    start = time.perf_counter()
    if pieces is one_call:
        results = one_call(target, streams, tokens)
    else:
        with ThreadPoolExecutor(streams) as pool:
            results = list(pool.map(lambda i: _timed(pieces(target, tokens, i)), range(streams)))
    wall = time.perf_counter() - start
    ttfts = [r["ttft"] for r in results]
    gaps = [g for r in results for g in r["gaps"]]
    return {
        "streams": streams,
        "pieces": sum(r["n"] for r in results),
        "tokens_per_s": streams * tokens / wall,
        "ttft_p50_ms": 1e3 * percentile(ttfts, 50),
        "ttft_p99_ms": 1e3 * percentile(ttfts, 99),
        "gap_p50_ms": 1e3 * percentile(gaps, 50),
        "load": load,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", default="1,16,64")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--workers", default="2")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=128)
    args = parser.parse_args()
    levels = [int(n) for n in args.levels.split(",")]
    from servekit.testing import ServerProcess

    with tempfile.TemporaryDirectory() as tmp:
        folder = build_gpt2(Path(tmp) / "gpt", args.layers, args.width)
        (folder / "servekit.yaml").write_text(f"placement: process\noptions: {{max_num_seqs: {max(levels)}}}\n")
        server = ServerProcess(tmp, workers=args.workers, threads=max(levels), grpc_port="auto")
        with server.start(timeout=300):
            grpc_address = f"127.0.0.1:{server.grpc_port}"
            protocols = {
                "openai-sse": (openai_pieces, server.url),
                "generate_stream": (generate_pieces, server.url),
                "grpc-stream": (grpc_pieces, grpc_address),
                "grpc-one-call": (one_call, grpc_address),
            }
            for pieces, target in protocols.values():  # warm-up: the first batch, connections
                run_level(pieces, target, 2, 4)
            print(f"{'protocol':16} {'N':>3} {'tok/s':>8} {'TTFT p50':>9} {'TTFT p99':>9} {'gap p50':>8} {'load':>5}")
            for streams in levels:
                for name, (pieces, target) in protocols.items():
                    row = run_level(pieces, target, streams, args.tokens)
                    print(
                        f"{name:16} {streams:>3} {row['tokens_per_s']:>8.1f} {row['ttft_p50_ms']:>7.1f}ms "
                        f"{row['ttft_p99_ms']:>7.1f}ms {row['gap_p50_ms']:>6.1f}ms {row['load']:>5.2f}",
                        flush=True,
                    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
