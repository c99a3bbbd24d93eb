"""Served latency with ``shadow:`` at 100 % against no shadow: does the copy stay off the served requests' time?

    python bench/shadow.py                       # 2,000 V2 requests per phase, 4 client threads
    python bench/shadow.py --requests 5000 --threads 8 --workers 2
    python bench/shadow.py --aa                  # neither server shadows: the bench's own bias

Two servers of the iris model (a LogisticRegression), the request log on (SQLite) in
both: one with no shadow, one with ``shadow: {target: candidate, fraction: 1.0}``, which
sends a copy of every request to a second iris model through its shadow process and logs
its answer.  Both warm up, then the same traffic goes to each in turn, in ``--rounds``
rounds that alternate which goes first (the machine's drift falls on both alike).
Prints p50 and p99 of the served requests of each and p99's change; servekit's goal is a change within
10 %.  Standard library and servekit's test helpers only, like bench/run.py.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))

BODY = json.dumps(
    {
        "inputs": [
            {"name": n, "shape": [1], "datatype": "FP64", "data": [v]}
            for n, v in (("sepal_length", 5.1), ("sepal_width", 3.5), ("petal_length", 1.4), ("petal_width", 0.2))
        ]
    }
).encode()


def traffic(port: int, total: int, threads: int) -> list[float]:
    """``total`` V2 infer requests from ``threads`` keep-alive clients; each latency in ms."""
    latencies: list[float] = []
    lock = threading.Lock()

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        mine = []
        for _ in range(total // threads):
            start = time.perf_counter()
            conn.request("POST", "/v2/models/iris/infer", BODY, {"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            mine.append((time.perf_counter() - start) * 1000)
            if response.status != 200:
                raise SystemExit(f"answered {response.status}")
        with lock:
            latencies.extend(mine)

    workers = [threading.Thread(target=client) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return latencies


@contextlib.contextmanager
def server(shadow: bool, args: argparse.Namespace) -> Iterator[int]:
    """A server of the iris model, with or without ``shadow:``; its HTTP port, warmed up."""
    from servekit.testing import ServerProcess
    from sklearn_models import fit_iris

    base = Path(tempfile.mkdtemp(prefix="servekit-shadow-bench-"))
    try:
        fit_iris(base / "iris")
        fit_iris(base / "candidate")
        settings = "shadow:\n  target: candidate\n  fraction: 1.0\n" if shadow else "{}\n"
        (base / "iris" / "servekit.yaml").write_text(settings)
        with ServerProcess(base, workers=args.workers, request_log_url="sqlite") as running:
            traffic(running.http_port, args.requests // 4, args.threads)  # warm-up
            yield running.http_port
    finally:
        shutil.rmtree(base, ignore_errors=True)


def summary(latencies: list[float]) -> tuple[float, float]:
    return statistics.median(latencies), statistics.quantiles(latencies, n=100)[98]


def dropped_copies(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    return int(
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("servekit_shadow_dropped_total{")
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000, help="timed requests per phase")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=4, help="the phases alternate in this many rounds")
    parser.add_argument("--aa", action="store_true", help="no shadow on either server: the bench's own bias and noise")
    args = parser.parse_args()
    plain: list[float] = []
    shadowed: list[float] = []
    with server(False, args) as plain_port, server(not args.aa, args) as shadow_port:
        for round_ in range(args.rounds):  # alternate, so the machine's drift falls on both alike
            order = [(plain_port, plain), (shadow_port, shadowed)]
            for port, latencies in order if round_ % 2 == 0 else reversed(order):
                latencies.extend(traffic(port, args.requests // args.rounds, args.threads))
                time.sleep(1.0)  # the shadow server's last copies finish before the other phase
        dropped = dropped_copies(shadow_port)
    p50, p99 = summary(plain)
    s50, s99 = summary(shadowed)
    sent = args.requests + args.requests // 4
    print(f"no shadow:          p50 {p50:.2f} ms  p99 {p99:.2f} ms")
    if args.aa:
        print(f"the other, no shadow: p50 {s50:.2f} ms  p99 {s99:.2f} ms")
    else:
        print(f"shadow at 100 %:    p50 {s50:.2f} ms  p99 {s99:.2f} ms  ({dropped} of {sent} copies dropped)")
    print(f"p99 change: {100 * (s99 - p99) / p99:+.1f} %")


if __name__ == "__main__":
    main()
