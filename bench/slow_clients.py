"""Normal traffic beside 200 slow clients: p50/p99 of ordinary requests with and without them.

    python bench/slow_clients.py                      # gunicorn and granian, 200 slow clients
    python bench/slow_clients.py --engines granian --slow 50 --requests 500
    PYTHONPATH=old/framework python bench/slow_clients.py --no-timeouts   # a servekit before issue 22

Each slow client opens a connection and sends a request one byte a second (its
headers, or a body after complete headers); when the server cuts it off
(``--header-timeout``, ``--body-timeout``) it connects again at once, so the
server faces 200 slow connections the whole time.  Meanwhile four client threads
send V2 infer requests to the iris model over keep-alive connections; the
latency of each is recorded.  The first phase measures the same traffic with no
slow clients.  The slow clients' requests are ``POST`` to V2 infer: the most a
slow client can hold.

Prints one line per engine and phase; servekit's goal is a p99 with slow clients
within twice the p99 without.  Standard library only, like bench/run.py.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
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


def normal_traffic(port: int, total: int, threads: int = 4) -> list[float]:
    """``total`` V2 infer requests from ``threads`` keep-alive clients; each latency in ms."""
    latencies: list[float] = []
    lock = threading.Lock()
    per = total // threads

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for _ in range(per):
            start = time.perf_counter()
            conn.request("POST", "/v2/models/iris/infer", BODY, {"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            took = (time.perf_counter() - start) * 1000
            if response.status != 200:
                raise RuntimeError(f"normal request answered {response.status}")
            with lock:
                latencies.append(took)
        conn.close()

    workers = [threading.Thread(target=client) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return latencies


def slow_client(port: int, stop: threading.Event, body: bool, counts: dict[str, int]) -> None:
    """One connection trickling a request a byte a second; reconnect when the server cuts it off."""
    head = b"POST /v2/models/iris/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += b"Content-Length: 100000\r\n\r\n"
    while not stop.is_set():
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            time.sleep(0.1)
            continue
        counts["connections"] += 1
        data = head if not body else None
        try:
            if body:
                sock.sendall(head)
            sock.settimeout(1.0)
            i = 0
            while not stop.is_set():
                sock.sendall(data[i : i + 1] if data and i < len(data) else b"x")
                i += 1
                try:
                    if not sock.recv(4096):
                        break  # the server closed it
                    counts["answered"] += 1
                    break
                except TimeoutError:
                    continue
        except OSError:
            pass
        finally:
            sock.close()


def percentiles(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def run_engine(engine: str, slow: int, total: int, repo: Path, timeouts: bool = True) -> None:
    from servekit.testing import ServerProcess

    flags = {"header_timeout": 10, "body_timeout": 10} if timeouts else {}
    with ServerProcess(repo, server=engine, workers=2, **flags) as server:
        normal_traffic(server.http_port, 200)  # warm-up
        p50, p99 = percentiles(normal_traffic(server.http_port, total))
        print(f"{engine:9} no slow clients      p50 {p50:7.2f} ms  p99 {p99:7.2f} ms")
        stop, counts = threading.Event(), {"connections": 0, "answered": 0}
        threads = [
            threading.Thread(target=slow_client, args=(server.http_port, stop, i % 2 == 1, counts), daemon=True)
            for i in range(slow)
        ]
        for t in threads:
            t.start()
        time.sleep(3)  # every slow client connected and holding
        p50s, p99s = percentiles(normal_traffic(server.http_port, total))
        stop.set()
        print(
            f"{engine:9} {slow} slow clients     p50 {p50s:7.2f} ms  p99 {p99s:7.2f} ms"
            f"  (p99 x{p99s / p99:.2f}; slow connections opened {counts['connections']})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="gunicorn,granian")
    parser.add_argument("--slow", type=int, default=200)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument(
        "--no-timeouts", action="store_true", help="pass no timeout flags (to measure a servekit without them)"
    )
    args = parser.parse_args()
    from sklearn_models import fit_iris

    repo = Path(tempfile.mkdtemp(prefix="servekit-slow-clients-"))
    fit_iris(repo / "iris")
    for engine in args.engines.split(","):
        run_engine(engine, args.slow, args.requests, repo, timeouts=not args.no_timeouts)


if __name__ == "__main__":
    main()
