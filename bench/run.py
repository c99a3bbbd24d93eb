"""servekit against Seldon MLServer and KServe, side by side, on the same models and load.

    python bench/run.py                 # everything (about 12-15 minutes on 2 cores)
    python bench/run.py --duration 3    # shorter wrk runs
    python bench/run.py --only servekit,kserve-1w --skip-install

Installs what it needs (``wrk`` from Debian, the peers' virtualenvs under
``bench/.venvs``), fits the models once, starts each server in turn on
127.0.0.1, measures cold start, idle memory of the whole process tree, load
with ``wrk`` at 1, 8 and 64 connections, and SIGTERM exit time, then writes
``bench/results/results.json``, ``results.md`` and ``chart.png``.

Standard library only: it runs under any Python 3.9+, and finds servekit's
interpreter (this one if it imports servekit, else the repository's ``.venv``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VENVS = HERE / ".venvs"
RESULTS = HERE / "results"
WORK = RESULTS / "work"

MLSERVER_VERSION = "1.7.1"
KSERVE_VERSION = "0.21.0"
CONNECTIONS = (1, 8, 64)
ROWS = (1, 100)


# ---------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------


def servekit_python() -> str:
    probe = subprocess.run([sys.executable, "-c", "import servekit"], capture_output=True)
    if probe.returncode == 0:
        return sys.executable
    venv = ROOT / ".venv" / "bin" / "python"
    if venv.exists():
        return str(venv)
    sys.exit("servekit is not importable; run `pip install -e .[sklearn]` first")


def sklearn_version(python: str) -> str:
    out = subprocess.run([python, "-c", "import sklearn; print(sklearn.__version__)"], capture_output=True, text=True)
    return out.stdout.strip()


def ensure_wrk() -> None:
    if shutil.which("wrk"):
        return
    print("installing wrk (Debian package)...", flush=True)
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    subprocess.run([*sudo, "apt-get", "update", "-qq"], check=True)
    subprocess.run([*sudo, "apt-get", "install", "-y", "-qq", "wrk"], check=True)


def ensure_venv(name: str, packages: list[str]) -> str:
    """A virtualenv under bench/.venvs with ``packages``; reused when its marker matches."""
    venv = VENVS / name
    python = venv / "bin" / "python"
    marker = venv / ".bench-packages"
    wanted = "\n".join(packages)
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return str(python)
    print(f"creating bench/.venvs/{name}: {' '.join(packages)}", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *packages], check=True)
    marker.write_text(wanted)
    return str(python)


# ---------------------------------------------------------------------------
# Processes: start, readiness, memory, stop
# ---------------------------------------------------------------------------


def http(method: str, url: str, body: bytes | None = None, timeout: float = 5.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def tree(pid: int) -> list[int]:
    """``pid`` and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, []))
    return found


def memory(pid: int) -> dict[str, float]:
    """RSS and PSS in MiB, summed over the process tree (PSS shares pages fairly)."""
    rss = pss = 0
    pids = tree(pid)
    for p in pids:
        try:
            text = Path(f"/proc/{p}/smaps_rollup").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("Rss:"):
                rss += int(line.split()[1])
            elif line.startswith("Pss:"):
                pss += int(line.split()[1])
    return {"rss_mib": round(rss / 1024, 1), "pss_mib": round(pss / 1024, 1), "processes": len(pids)}


@dataclass
class Server:
    name: str
    family: str  # servekit | mlserver | kserve | flask
    command: list[str]
    port: int
    env: dict[str, str] = field(default_factory=dict)
    protocols: tuple[str, ...] = ("v2",)
    models: tuple[str, ...] = ("iris", "rf")
    rows: tuple[int, ...] = ROWS
    connections: tuple[int, ...] = CONNECTIONS
    note: str = ""

    def url(self, model: str, protocol: str) -> str:
        base = f"http://127.0.0.1:{self.port}"
        return f"{base}/v2/models/{model}/infer" if protocol == "v2" else f"{base}/v1/models/{model}:predict"


class Running:
    def __init__(self, server: Server, log_path: Path):
        self.server = server
        self.log = open(log_path, "wb")  # noqa: SIM115 - open while the server runs, closed by stop()
        self.started = time.monotonic()
        env = {**os.environ, **server.env}
        self.proc = subprocess.Popen(
            server.command, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=WORK, start_new_session=True
        )

    def wait_ready(self, timeout: float = 120.0) -> float:
        """Seconds from process start until every model answers a real request."""
        deadline = self.started + timeout
        pending = list(self.server.models)
        while pending and time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.server.name} exited with {self.proc.returncode}")
            model = pending[0]
            try:
                status, _ = http("POST", self.server.url(model, "v2" if "v2" in self.server.protocols else "v1"),
                                 body_bytes(model, 1, "v2" if "v2" in self.server.protocols else "v1"), timeout=2)
            except (OSError, urllib.error.URLError):
                status = 0
            if status == 200:
                pending.pop(0)
            else:
                time.sleep(0.02)
        if pending:
            raise TimeoutError(f"{self.server.name} not ready after {timeout}s")
        return time.monotonic() - self.started

    def stop(self, timeout: float = 20.0) -> float | None:
        """SIGTERM the main process; seconds until the whole tree is gone, None if it had to be killed."""
        pids = tree(self.proc.pid)
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
            while any(Path(f"/proc/{p}").exists() and _alive(p) for p in pids):
                if time.monotonic() - started > timeout:
                    raise subprocess.TimeoutExpired(self.server.command, timeout)
                time.sleep(0.02)
            return time.monotonic() - started
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            return None
        finally:
            self.log.close()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# ---------------------------------------------------------------------------
# Load
# ---------------------------------------------------------------------------


def body_path(model: str, rows: int, protocol: str) -> Path:
    return WORK / "bodies" / f"{model}-{rows}-{protocol}.json"


def body_bytes(model: str, rows: int, protocol: str) -> bytes:
    return body_path(model, rows, protocol).read_bytes()


def check_answer(server: Server, model: str, rows: int, protocol: str) -> None:
    """One request before the load: it must succeed and answer one prediction per row."""
    status, payload = http("POST", server.url(model, protocol), body_bytes(model, rows, protocol), timeout=30)
    if status != 200:
        raise RuntimeError(f"{server.name} {model} {protocol}: HTTP {status}: {payload[:300]!r}")
    doc = json.loads(payload)
    count = len(doc["predictions"]) if protocol == "v1" else doc["outputs"][0]["shape"][0]
    if count != rows:
        raise RuntimeError(f"{server.name} {model} {protocol}: {count} predictions for {rows} rows")


def wrk(url: str, body: Path, connections: int, seconds: float) -> dict:
    env = {**os.environ, "BENCH_BODY": str(body)}
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--timeout", "10s", "-s", str(HERE / "wrk_report.lua"), url]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=seconds + 60)
    for line in out.stdout.splitlines():
        if line.startswith("BENCH_JSON "):
            raw = json.loads(line[len("BENCH_JSON "):])
            errors = raw["connect"] + raw["read"] + raw["write"] + raw["status"] + raw["timeout"]
            return {
                "rps": round(raw["requests"] / (raw["duration_us"] / 1e6), 1),
                "p50_ms": round(raw["p50_us"] / 1000, 2),
                "p99_ms": round(raw["p99_us"] / 1000, 2),
                "requests": raw["requests"],
                "errors": errors,
            }
    raise RuntimeError(f"wrk failed: {out.stdout[-500:]} {out.stderr[-500:]}")


def bench_server(server: Server, seconds: float) -> dict:
    print(f"== {server.name}", flush=True)
    load_before = os.getloadavg()[0]
    running = Running(server, RESULTS / f"{server.name}.log")
    result: dict = {"server": server.name, "family": server.family, "note": server.note, "runs": []}
    try:
        result["cold_start_s"] = round(running.wait_ready(), 2)
        time.sleep(2.0)  # let start-up threads settle before reading memory
        result["idle_memory"] = memory(running.proc.pid)
        print(f"   cold start {result['cold_start_s']} s, idle {result['idle_memory']}", flush=True)
        for protocol in server.protocols:
            for model in server.models:
                for rows in server.rows:
                    check_answer(server, model, rows, protocol)
                    url = server.url(model, protocol)
                    wrk(url, body_path(model, rows, protocol), 8, 1)  # warm-up
                    for conns in server.connections:
                        run = {"model": model, "rows": rows, "protocol": protocol, "connections": conns,
                               **wrk(url, body_path(model, rows, protocol), conns, seconds)}
                        result["runs"].append(run)
                        print(f"   {protocol} {model:4s} rows={rows:<3d} c={conns:<2d} {run['rps']:8.1f} req/s "
                              f"p50 {run['p50_ms']:7.2f} ms p99 {run['p99_ms']:7.2f} ms"
                              + (f"  ERRORS {run['errors']}" if run["errors"] else ""), flush=True)
    finally:
        result["sigterm_exit_s"] = running.stop()
        result["load_average_at_start"] = round(load_before, 2)
    print(f"   SIGTERM exit: {result['sigterm_exit_s']}", flush=True)
    return result


def big_tensor(python: str, port: int) -> dict:
    """The 1M-element FP32 round trip through servekit, V2 JSON vs the binary extension."""
    out = subprocess.run([python, str(HERE / "big_tensor.py"), f"http://127.0.0.1:{port}"],
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------
# The line-up
# ---------------------------------------------------------------------------


def lineup(sk: str, mls: str, ks: str, port: int) -> list[Server]:
    models = str(WORK / "models")
    serve = [sk, "-m", "servekit", "serve", models, "--host", "127.0.0.1", "--http-port", str(port),
             "--grpc-port", "0", "--log-level", "warning"]
    mls_dir = WORK / "mlserver"
    mls_env = {"MLSERVER_HTTP_PORT": str(port), "MLSERVER_HOST": "127.0.0.1", "MLSERVER_GRPC_PORT": str(port + 1),
               "MLSERVER_METRICS_PORT": str(port + 2), "MLSERVER_LOGGING_LEVEL": "WARNING"}
    ks_cmd = [ks, str(HERE / "peers" / "kserve_server.py"), "--model_dir", models, "--http_port", str(port),
              "--enable_grpc", "false", "--configure_logging", "false"]
    one_row = {"rows": (1,)}
    return [
        Server("servekit", "servekit", serve, port, protocols=("v2", "v1"),
               note="defaults: gthread, workers and threads from settings.py, batching off"),
        Server("servekit-batch", "servekit", serve + ["--threads", "32", "--max-batch-size", "32", "--max-batch-time-ms", "2"],
               port, **one_row, note="--threads 32 --max-batch-size 32 --max-batch-time-ms 2"),
        Server("servekit-2w", "servekit", serve + ["--workers", "2", "--preload"], port, protocols=("v2", "v1"),
               note="--workers 2 --preload (models shared copy-on-write)"),
        Server("servekit-2w-batch", "servekit",
               serve + ["--workers", "2", "--preload", "--threads", "32", "--max-batch-size", "32",
                        "--max-batch-time-ms", "2"],
               port, **one_row, note="--workers 2 --preload --threads 32 --max-batch-size 32 --max-batch-time-ms 2"),
        Server("mlserver", "mlserver", [str(Path(mls).parent / "mlserver"), "start", str(mls_dir)], port,
               env=mls_env, note=f"MLServer {MLSERVER_VERSION}, mlserver-sklearn, default settings"),
        Server("mlserver-batch", "mlserver", [str(Path(mls).parent / "mlserver"), "start", str(WORK / "mlserver-batch")],
               port, env=mls_env, **one_row,
               note="adaptive batching: max_batch_size 32, max_batch_time 2 ms"),
        Server("kserve-1w", "kserve", ks_cmd + ["--workers", "1"], port, protocols=("v2", "v1"),
               note=f"KServe {KSERVE_VERSION} custom kserve.Model, 1 worker"),
        Server("kserve-2w", "kserve", ks_cmd + ["--workers", "2"], port, protocols=("v2", "v1"), **one_row,
               note="2 workers"),
        Server("flask", "flask", [sk, "-m", "gunicorn", "-w", "2", "-k", "gthread", "--threads", "8",
                                  "-b", f"127.0.0.1:{port}", "--chdir", str(HERE / "peers"), "bare_flask:app"],
               port, env={"BENCH_MODEL": str(WORK / "models" / "iris" / "1" / "model.joblib")},
               models=("iris",), rows=(1,), note="bare Flask + orjson, gunicorn 2 workers gthread: our ceiling"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per wrk run (default 4)")
    parser.add_argument("--only", help="comma-separated server names to run")
    parser.add_argument("--skip-install", action="store_true", help="use bench/.venvs as they are")
    parser.add_argument("--port", type=int, default=18600)
    parser.add_argument("--merge", action="store_true",
                        help="keep the other servers' numbers from the last results.json (with --only)")
    args = parser.parse_args()

    sk = servekit_python()
    RESULTS.mkdir(parents=True, exist_ok=True)
    ensure_wrk()
    pin = f"scikit-learn=={sklearn_version(sk)}"
    if args.skip_install:
        mls, ks, tools = (str(VENVS / n / "bin" / "python") for n in ("mlserver", "kserve", "tools"))
    else:
        # uvloop 0.22 made get_event_loop() raise outside a running loop, which kills
        # MLServer 1.7.1's inference-pool workers at start: pin the one it was built against
        mls = ensure_venv("mlserver", [f"mlserver=={MLSERVER_VERSION}", f"mlserver-sklearn=={MLSERVER_VERSION}", pin,
                                       "uvloop<0.22"])
        ks = ensure_venv("kserve", [f"kserve=={KSERVE_VERSION}", pin, "joblib"])
        tools = ensure_venv("tools", ["matplotlib", "py-spy"])  # py-spy: for profiling by hand

    if not args.merge:
        if WORK.exists():
            shutil.rmtree(WORK)
        WORK.mkdir(parents=True)
        subprocess.run([sk, str(HERE / "models.py"), str(WORK)], check=True)

    servers = lineup(sk, mls, ks, args.port)
    if args.only:
        wanted = set(args.only.split(","))
        servers = [s for s in servers if s.name in wanted]
    results = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "load_average": os.getloadavg()[0]},
        "duration_s": args.duration,
        "servers": [],
    }
    for server in servers:
        try:
            results["servers"].append(bench_server(server, args.duration))
        except Exception as exc:  # one broken peer must not lose the others' numbers
            print(f"   FAILED: {exc}", flush=True)
            results["servers"].append({"server": server.name, "family": server.family, "error": str(exc), "runs": []})
        if server.name == "servekit":
            running = Running(Server("servekit-big", "servekit", lineup(sk, mls, ks, args.port)[0].command,
                                     args.port, models=("iris",)), RESULTS / "servekit-big.log")
            try:
                running.wait_ready()
                results["big_tensor"] = big_tensor(sk, args.port)
                print(f"   1M FP32: {results['big_tensor']}", flush=True)
            except Exception as exc:
                results["big_tensor"] = {"error": str(exc)}
            finally:
                running.stop()

    previous = RESULTS / "results.json"
    if args.merge and previous.exists():
        old = json.loads(previous.read_text())
        fresh = {s["server"] for s in results["servers"]}
        results["servers"] = [s for s in old["servers"] if s["server"] not in fresh] + results["servers"]
        results.setdefault("big_tensor", old.get("big_tensor"))
        results["started"] = old["started"] + f" (re-run {results['started']}: {', '.join(sorted(fresh))})"
    previous.write_text(json.dumps(results, indent=2))
    subprocess.run([sk, str(HERE / "report.py"), str(RESULTS / "results.json")], check=True)
    if Path(tools).exists():
        subprocess.run([tools, str(HERE / "chart.py"), str(RESULTS / "results.json")], check=False)
    print(f"wrote {RESULTS / 'results.md'}, results.json and chart.png")


if __name__ == "__main__":
    main()
