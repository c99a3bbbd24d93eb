"""What OpenTelemetry tracing costs: servekit with traces off, on at 100% sampling, and a baseline.

    python bench/tracing.py                            # this tree: traces off vs on (100%, OTLP/HTTP)
    python bench/tracing.py --baseline ../servekit-main  # and another checkout's servekit, traces not there

Each variant serves the iris LogisticRegression (bench/models.py) with the
defaults (2 workers here: one per CPU the bench may use is what ``--workers
auto`` picks) and takes ``wrk`` at 8 and 64 connections, iris 1 row V2 JSON;
variants run in turn, round after round (``--rounds``), so a noisy neighbour
hits every variant alike; the medians are reported.  Traces go to a small
OTLP/HTTP receiver in this process that reads each export and answers 200
(the exporter's work is measured, no collector's).

On a shared machine ``wrk``'s numbers swing with the neighbours, so each variant
also reports its CPU time per request: the app called in one process (no HTTP
server, no client), ``--cpu-requests`` V2 requests, ``time.process_time()`` of
the whole process (the span exporter's thread included) divided by their number.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from models import bodies, fit  # noqa: E402
from run import http_ok, wrk  # noqa: E402

ROOT = HERE.parent
WORK = HERE / "results" / "tracing"


class _Sink(BaseHTTPRequestHandler):
    spans_bytes = 0

    def do_POST(self) -> None:
        _Sink.spans_bytes += len(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def start_sink() -> str:
    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{sink.server_address[1]}"


def serve(tree: Path, port: int, env: dict[str, str]) -> subprocess.Popen:
    command = [sys.executable, "-m", "servekit", "serve", str(WORK / "models" / "iris")]
    command += ["--host", "127.0.0.1", "--http-port", str(port), "--grpc-port", "0", "--log-level", "warning"]
    command += ["--workers", "2"]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    path = f"{tree / 'framework'}:{tree / 'plugins'}"
    proc = subprocess.Popen(command, env={**clean, "PYTHONPATH": path, **env}, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not http_ok(f"http://127.0.0.1:{port}/v2/health/ready"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"servekit from {tree} did not start")
        time.sleep(0.1)
    return proc


_CPU_PROBE = """
import json, sys, time
from pathlib import Path
from servekit.server.app import create_app
from servekit.server.settings import Settings
try:
    from servekit.observability import tracing
except ImportError:  # a baseline from before traces
    tracing = None
app = create_app(Settings(paths=[sys.argv[1]], poll_interval=0, request_log_url="off"), start=False)
app.extensions["servekit"].repository.load_now()
body = Path(sys.argv[2]).read_bytes()
environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/v2/models/iris/infer", "CONTENT_TYPE": "application/json",
           "CONTENT_LENGTH": str(len(body)), "SERVER_NAME": "bench", "SERVER_PORT": "80", "wsgi.url_scheme": "http"}
import io
def one():
    env = dict(environ, **{"wsgi.input": io.BytesIO(body)})
    out = app(env, lambda status, headers, exc_info=None: None)
    b"".join(out)
    getattr(out, "close", lambda: None)()
for _ in range(500):
    one()
n = int(sys.argv[3])
began = time.process_time()
for _ in range(n):
    one()
if tracing is not None:
    tracing.force_flush()  # the exporter's work for these requests counts too
print(json.dumps({"cpu_us": (time.process_time() - began) / n * 1e6, "traced": bool(tracing and tracing.ON)}))
"""


def cpu_per_request(tree: Path, env: dict[str, str], requests: int) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PROMETHEUS_MULTIPROC_DIR"))}
    path = f"{tree / 'framework'}:{tree / 'plugins'}"
    body = WORK / "bodies" / "iris-1-v2.json"
    out = subprocess.run(
        [sys.executable, "-c", _CPU_PROBE, str(WORK / "models" / "iris"), str(body), str(requests)],
        env={**clean, "PYTHONPATH": path, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, help="another checkout to measure as it is (no tracing)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per wrk run")
    parser.add_argument("--port", type=int, default=18580)
    parser.add_argument("--cpu-requests", type=int, default=5000, help="requests per CPU-time probe")
    parser.add_argument("--cpu-only", action="store_true", help="only the CPU-time probes, no wrk")
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    bodies(WORK, fit(WORK))
    sink = start_sink()
    traced = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": sink,
        "OTEL_TRACES_SAMPLER": "always_on",
        "OTEL_BSP_MAX_QUEUE_SIZE": "65536",  # keep every span: the cost of all of them, none dropped
    }
    variants = {"off": (ROOT, {}), "on-100%": (ROOT, traced)}
    if args.baseline:
        variants = {"baseline": (args.baseline.resolve(), {}), **variants}
    body = WORK / "bodies" / "iris-1-v2.json"
    url = f"http://127.0.0.1:{args.port}/v2/models/iris/infer"
    results: dict[str, dict[int, list[dict]]] = {name: {8: [], 64: []} for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(args.rounds):
        for name, (tree, env) in variants.items():
            cpu[name].append(cpu_per_request(tree, env, args.cpu_requests)["cpu_us"])
            print(f"round {round_ + 1} {name:9} CPU {cpu[name][-1]:.0f} us per request")
    for round_ in range(0 if args.cpu_only else args.rounds):
        for name, (tree, env) in variants.items():
            proc = serve(tree, args.port, env)
            try:
                wrk(url, body, 8, 1.0)  # warm-up
                for connections in (8, 64):
                    cell = wrk(url, body, connections, args.duration)
                    results[name][connections].append(cell)
                    print(
                        f"round {round_ + 1} {name:9} c={connections:<3} {cell['rps']:8.0f}/s p99 {cell['p99_ms']} ms"
                    )
            finally:
                proc.terminate()
                proc.wait(30)
    reference = "baseline" if args.baseline else "off"
    cpu_median = {name: statistics.median(values) for name, values in cpu.items()}
    print(f"\nCPU time per request, in one process (medians of {args.rounds}, vs {reference}):")
    for name, value in cpu_median.items():
        print(f"  {name:9} {value:.0f} us ({value / cpu_median[reference]:.2f}x)")
    if args.cpu_only:
        (WORK / "results.json").write_text(json.dumps({"cpu_us": cpu}, indent=2))
        return
    summary = {
        name: {
            c: {
                "rps": statistics.median(r["rps"] for r in runs),
                "p99_ms": statistics.median(r["p99_ms"] for r in runs),
                "errors": sum(r["errors"] for r in runs),
            }
            for c, runs in cells.items()
        }
        for name, cells in results.items()
    }
    print(f"\nmedians of {args.rounds} rounds, iris 1 row V2 JSON, {args.duration:g} s each (vs {reference}):")
    for name, cells in summary.items():
        parts = [
            f"c={c} {v['rps']:.0f}/s ({v['rps'] / summary[reference][c]['rps']:.2f}x) p99 {v['p99_ms']} ms"
            for c, v in cells.items()
        ]
        print(f"  {name:9} " + "; ".join(parts))
    print(f"  exported {_Sink.spans_bytes / 1e6:.1f} MB of OTLP protobuf")
    (WORK / "results.json").write_text(json.dumps({"runs": results, "medians": summary, "cpu_us": cpu}, indent=2))


if __name__ == "__main__":
    main()
