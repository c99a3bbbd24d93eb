"""Rerank one query against 16 passages at 32 concurrent clients: servekit, a CrossEncoder behind
FastAPI, and KServe's Hugging Face server, on the same cross-encoder folder, one run.

    python bench/rerank.py [--seconds 40] [--only NAME,...]

The folder is a cross-encoder the size of ``cross-encoder/ms-marco-MiniLM-L6-v2`` (the packaged
all-MiniLM-L6-v2 encoder with a one-label head: 22.7 M parameters; scores are not meaningful,
the cost is).  Each server runs alone on the machine, answers one checked request, gets a 2 s
warm-up, then ``wrk`` holds 32 connections for ``--seconds``.  Bodies: TEI's ``/rerank``
(``query``, ``texts``) for servekit and the FastAPI peer; KServe's V1 ``:predict`` for KServe, whose
Hugging Face server has no rerank route and no sentence-pair input on its own (transformers)
backend: its tokenizer call takes texts only, and transformers refuses a JSON pair as a
pre-tokenized example. So each pair goes as one text, ``QUERY [SEP] PASSAGE``: the same tokens,
padding and forward passes as the pair (its segment ids are all 0, so its logits differ a little;
the cost is the same), ``task: sequence_classification``, ``--backend huggingface``. Its answer
is each pair's class (0: a one-label head has one); ``--return_raw_logits``, which would give the
scores, fails on a one-label head (``IndexError`` in its postprocess, every request a 500).

KServe's server runs from ``bench/.venvs/kserve-hf``: KServe 0.21.0 from PyPI with the vLLM it
pins (0.24.0, which brings its own torch 2.11; KServe's OpenAI types import vLLM at start even
for the transformers backend), its ``huggingfaceserver`` and ``kserve-storage`` from KServe's
repository:
    python -m venv bench/.venvs/kserve-hf
    bench/.venvs/kserve-hf/bin/pip install kserve==0.21.0 vllm==0.24.0 transformers accelerate
    bench/.venvs/kserve-hf/bin/pip install --no-deps KSERVE_REPO/python/huggingfaceserver KSERVE_REPO/python/storage
With the default ``--backend auto`` the server picks vLLM for a BERT classifier, and vLLM's
CUDA wheel cannot name a device on a machine without a GPU: it exits before it reads its
arguments."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORK = HERE / "results" / "work" / "rerank"
KSERVE_PYTHON = HERE / ".venvs" / "kserve-hf" / "bin" / "python"
sys.path[:0] = [str(ROOT / "tests" / "support"), str(HERE)]

QUERY = "how do I keep a model server from running out of memory under load"
TEXT = (
    "a server holds each model once per worker unless it runs in its own process and the batcher merges "
    "concurrent requests into one forward pass bounded by rows and by padded tokens so memory stays flat "
    "while throughput grows with the batch until the cores are busy and queues form behind them"
)
WORDS = TEXT.split(" ")


def passages() -> list[str]:
    return [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(40 + 4 * i)) for i in range(16)]


def build_folder() -> Path:
    folder = WORK / "models" / "reranker"
    if (folder / "config.json").exists():
        return folder
    from generative_models import minilm_folder
    from transformers import AutoTokenizer, BertForSequenceClassification

    model = BertForSequenceClassification.from_pretrained(str(minilm_folder()), num_labels=1)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(minilm_folder())).save_pretrained(folder)
    return folder


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict, timeout: float = 60) -> object:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return json.load(answer)


def servers(folder: Path) -> dict[str, dict]:
    texts = passages()
    tei = {"query": QUERY, "texts": texts}
    pairs = {"instances": [f"{QUERY} [SEP] {text}" for text in texts]}  # the module's docstring says why
    found = {
        "servekit": {
            "command": lambda port: [sys.executable, "-m", "servekit", "serve", str(folder.parent),
                                     "--http-port", str(port), "--grpc-port", "0"],
            "path": "/rerank", "body": tei, "note": "servekit serve, defaults (2 workers on 2 CPUs)",
        },
        "fastapi-1w": {
            "command": lambda port: [sys.executable, str(HERE / "peers" / "cross_encoder_fastapi.py"),
                                     "--model", str(folder), "--port", str(port), "--workers", "1"],
            "path": "/rerank", "body": tei, "note": "sentence-transformers CrossEncoder, FastAPI, uvicorn 1 worker",
        },
        "fastapi-2w": {
            "command": lambda port: [sys.executable, str(HERE / "peers" / "cross_encoder_fastapi.py"),
                                     "--model", str(folder), "--port", str(port), "--workers", "2"],
            "path": "/rerank", "body": tei, "note": "the same, 2 workers",
        },
    }  # fmt: skip
    if KSERVE_PYTHON.exists():
        for workers in (1, 2):
            found[f"kserve-hf-{workers}w"] = {
                "command": lambda port, w=workers: [str(KSERVE_PYTHON), "-m", "huggingfaceserver", "--model_dir",
                                                    str(folder), "--model_name", "reranker", "--backend", "huggingface",
                                                    "--task", "sequence_classification", "--http_port", str(port),
                                                    "--enable_grpc", "false", "--workers", str(w)],
                "path": "/v1/models/reranker:predict", "body": pairs,
                "note": f"KServe 0.21.0 huggingfaceserver (task sequence_classification), {workers} worker(s)",
            }  # fmt: skip
    return found


def wait_ready(url: str, path: str, body: dict, proc: subprocess.Popen, timeout: float = 180) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode})")
        try:
            return post(url + path, body)
        except OSError:
            time.sleep(0.5)
    raise RuntimeError("never ready")


def wrk(url: str, body: dict, connections: int, seconds: int) -> dict:
    path = WORK / "body.json"
    path.write_text(json.dumps(body))
    command = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "30s", "-s",
               str(HERE / "wrk_report.lua"), url]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "BENCH_BODY": str(path)})
    line = next(x for x in out.stdout.splitlines() if x.startswith("BENCH_JSON "))
    raw = json.loads(line[len("BENCH_JSON ") :])
    errors = raw["connect"] + raw["read"] + raw["write"] + raw["status"] + raw["timeout"]
    return {
        "rps": round(raw["requests"] / (raw["duration_us"] / 1e6), 2),
        "p50_ms": round(raw["p50_us"] / 1000, 1),
        "p99_ms": round(raw["p99_us"] / 1000, 1),
        "errors": errors,
    }


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=40)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    folder = build_folder()
    chosen = servers(folder)
    if args.only:
        chosen = {k: v for k, v in chosen.items() if k in args.only.split(",")}
    results = {}
    for name, server in chosen.items():
        port = free_port()
        log = (WORK / f"{name}.log").open("w")
        proc = subprocess.Popen(server["command"](port), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            first = wait_ready(url, server["path"], server["body"], proc)
            print(f"{name}: first answer {json.dumps(first)[:120]}", flush=True)
            wrk(url + server["path"], server["body"], 8, 2)  # warm-up
            results[name] = {**wrk(url + server["path"], server["body"], args.connections, args.seconds)}
            results[name]["note"] = server["note"]
            print(json.dumps({"server": name, **results[name]}), flush=True)
        except Exception as exc:  # a peer that cannot run is reported, the others still measured
            print(f"{name}: {type(exc).__name__}: {exc} (see {log.name})", flush=True)
        finally:
            stop(proc)
    if "servekit" in results:
        base = results["servekit"]["rps"]
        print(f"\nrerank, 1 query x 16 passages, {args.connections} connections, {args.seconds} s each")
        for name, r in results.items():
            print(f"{name:>14}: {r['rps']:7.1f} req/s  p50 {r['p50_ms']:7.1f} ms  p99 {r['p99_ms']:7.1f} ms"
                  f"  servekit/this {base / r['rps']:4.2f}x  errors {r['errors']}  ({r['note']})")  # fmt: skip


if __name__ == "__main__":
    main()
