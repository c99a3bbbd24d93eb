"""servekit against Seldon MLServer, KServe and a plain WSGI ceiling: one run, same models, same load.

    python bench/run.py                        # everything: about 12 minutes on 2 cores
    python bench/run.py --skip-install         # reuse bench/.venvs as they are
    python bench/run.py --duration 1 --skip-install --only servekit,wsgi-gunicorn   # a smoke run
    python bench/run.py --only kserve-1w --merge   # re-measure one server, keep the others' numbers

Installs what it needs (``wrk`` from Debian; under ``bench/.venvs`` the peers'
virtualenvs and ``tools`` with py-spy and matplotlib), fits an iris
LogisticRegression and a 100-tree RandomForest once, then starts each server in
turn on 127.0.0.1 and measures cold start to ready, idle memory (PSS and RSS of
the whole process tree), ``wrk`` at 8 and 64 connections after a 1 s warm-up,
and the exit time after SIGTERM.

The line-up (``--only`` takes these names):

- ``servekit``: the defaults (gunicorn, ``--workers auto``, ``--preload`` auto,
  batching off), V2 and V1, iris and rf, 1 and 100 rows; one worker is profiled
  with py-spy under iris 1 row V2 at 64 connections, and a 1M-element FP32
  tensor goes through V2 JSON and the binary extension (the echo model);
- ``servekit-granian``: the same cells under ``--server granian``;
- ``servekit-onnx``: the same iris and rf converted to ONNX (bench/models.py), through
  servekit_onnx with the defaults, every cell of ``servekit``;
- ``servekit-batch`` / ``servekit-granian-batch``: ``--max-batch-size 32
  --max-batch-time-ms 2`` in each worker, 1-row V2 (rf for batching on vs off
  and vs MLServer's adaptive batching, iris as the in-worker reference);
- ``servekit-host`` / ``servekit-granian-host``: the same batching in model
  host processes (``--placement process``, docs/model-processes.md);
- ``mlserver`` (default settings, V2) and ``mlserver-batch`` (adaptive
  batching, 1-row V2); ``kserve-1w`` and ``kserve-2w`` (V2 and V1, every cell);
- ``wsgi-gunicorn`` and ``wsgi-granian``: ``peers/plain_wsgi.py`` (orjson, one
  numpy array, ``model.predict``) on each engine with 2 workers: the ceilings;
- ``servekit-trees``, ``mlserver-trees`` (defaults), ``mlserver-trees-batch``
  (adaptive batching), ``xgbserver-1w``, ``xgbserver-2w`` and ``lgbserver``: a
  100-round XGBoost and LightGBM booster (``xgb``, ``lgb``; bench/models.py)
  through servekit's plugins, MLServer's mlserver-xgboost and mlserver-lightgbm,
  and KServe's xgbserver and lgbserver (built from KServe's repository: they are
  not on PyPI), V2, 1 and 100 rows; bench/trees_report.py compares them.

servekit serves only the iris and rf folders (scikit-learn artifacts, so
``--preload`` is on for several workers); batched servekit runs read
``servekit_batch_size`` (and ``servekit_host_batch_size``) from ``/metrics``
around each run to report the mean batch.  Writes ``bench/results/results.json``,
then ``results.md`` (bench/report.py: every target of the performance issues,
met or missed) and ``chart.png`` (bench/chart.py).

Standard library only: it runs under any Python 3.9+, and finds servekit's
interpreter (this one if it imports servekit, else the repository's ``.venv``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pyspy

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VENVS = HERE / ".venvs"
RESULTS = HERE / "results"
WORK = RESULTS / "work"

MLSERVER_VERSION = "1.7.1"
KSERVE_VERSION = "0.21.0"
#: the newest tag of KServe's repository with xgbserver and lgbserver (unchanged since; not on PyPI)
KSERVE_RUNTIMES_REF = "v0.20.0"
CONNECTIONS = (8, 64)
ROWS = (1, 100)
STOP_TIMEOUT_S = 10.0  # after SIGTERM, seconds before the tree is killed
PROFILE_CELL = ("iris", 1, "v2", 64)  # model, rows, protocol, connections
PROFILE_SECONDS = 5


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


def ensure_debian_tool(command: str, package: str) -> None:
    """Install Debian's ``package`` when ``command`` is not on the PATH (the load generators)."""
    if shutil.which(command):
        return
    print(f"installing {command} (Debian package {package})...", flush=True)
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    subprocess.run([*sudo, "apt-get", "update", "-qq"], check=True)
    subprocess.run([*sudo, "apt-get", "install", "-y", "-qq", package], check=True)


def ensure_wrk() -> None:
    ensure_debian_tool("wrk", "wrk")


def ensure_venv(name: str, packages: list[str], without_deps: tuple[str, ...] = ()) -> str:
    """A virtualenv under bench/.venvs with ``packages`` (then ``without_deps``, each with ``--no-deps``);
    reused when its marker matches."""
    venv = VENVS / name
    python = venv / "bin" / "python"
    marker = venv / ".bench-packages"
    wanted = "\n".join([*packages, *without_deps])
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return str(python)
    print(f"creating bench/.venvs/{name}: {' '.join([*packages, *without_deps])}", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, *packages], check=True)
    if without_deps:
        subprocess.run([*pip, "--no-deps", *without_deps], check=True)
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
    family: str  # servekit | onnx (servekit on the ONNX graphs) | mlserver | kserve | ceiling
    command: list[str]
    port: int
    env: dict[str, str] = field(default_factory=dict)
    protocols: tuple[str, ...] = ("v2",)
    models: tuple[str, ...] = ("iris", "rf")
    rows: tuple[int, ...] = ROWS
    connections: tuple[int, ...] = CONNECTIONS
    note: str = ""
    batching: bool = False  # read servekit_batch_size from /metrics around each run
    profile: bool = False  # py-spy one worker under PROFILE_CELL's load

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, model: str, protocol: str) -> str:
        return f"{self.base}/v2/models/{model}/infer" if protocol == "v2" else f"{self.base}/v1/models/{model}:predict"

    def scenarios(self) -> list[tuple[str, str, int]]:
        """(protocol, model, rows) in the order they are measured."""
        return [(p, m, r) for p in self.protocols for m in self.models for r in self.rows]


class Running:
    def __init__(self, server: Server, log_path: Path):
        self.server = server
        self.log = open(log_path, "wb")  # noqa: SIM115 - open while the server runs, closed by stop()
        self.started = time.monotonic()
        env = {**os.environ, **server.env}
        self.proc = subprocess.Popen(
            # a process group of its own (for killpg), not a session: a new session is a new
            # scheduler autogroup, and CFS then splits the cores between wrk and the whole server
            # 50/50 whatever the server's process count (servekit measured ~30% lower that way)
            server.command,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=WORK,
            preexec_fn=os.setpgrp,
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
                status, _ = http(
                    "POST",
                    self.server.url(model, "v2" if "v2" in self.server.protocols else "v1"),
                    body_bytes(model, 1, "v2" if "v2" in self.server.protocols else "v1"),
                    timeout=2,
                )
            except (OSError, urllib.error.URLError):
                status = 0
            if status == 200:
                pending.pop(0)
            else:
                time.sleep(0.02)
        if pending:
            raise TimeoutError(f"{self.server.name} not ready after {timeout}s")
        return time.monotonic() - self.started

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> float | None:
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


def wrk_command(url: str, connections: int, seconds: float) -> list[str]:
    return [
        "wrk",
        "-t1",
        f"-c{connections}",
        f"-d{max(1, round(seconds))}s",
        "--timeout",
        "10s",
        "-s",
        str(HERE / "wrk_report.lua"),
        url,
    ]


def wrk(url: str, body: Path, connections: int, seconds: float) -> dict:
    env = {**os.environ, "BENCH_BODY": str(body)}
    out = subprocess.run(
        wrk_command(url, connections, seconds), capture_output=True, text=True, env=env, timeout=seconds + 60
    )
    for line in out.stdout.splitlines():
        if line.startswith("BENCH_JSON "):
            raw = json.loads(line[len("BENCH_JSON ") :])
            errors = raw["connect"] + raw["read"] + raw["write"] + raw["status"] + raw["timeout"]
            return {
                "rps": round(raw["requests"] / (raw["duration_us"] / 1e6), 1),
                "p50_ms": round(raw["p50_us"] / 1000, 2),
                "p99_ms": round(raw["p99_us"] / 1000, 2),
                "requests": raw["requests"],
                "errors": errors,
            }
    raise RuntimeError(f"wrk failed: {out.stdout[-500:]} {out.stderr[-500:]}")


_BATCH_LINE = re.compile(r"^(servekit_(?:host_)?batch_size)_(sum|count)\{([^}]*)\} (\S+)$")


def batch_counters(server: Server, model: str) -> dict[str, float]:
    """``servekit_batch_size`` and ``servekit_host_batch_size`` sums and counts for ``model``, from /metrics."""
    try:
        status, text = http("GET", f"{server.base}/metrics", timeout=10)
    except (OSError, urllib.error.URLError):
        return {}
    found: dict[str, float] = {}
    if status != 200:
        return found
    for line in text.decode(errors="replace").splitlines():
        match = _BATCH_LINE.match(line)
        if match and f'model="{model}"' in match[3]:
            key = f"{match[1]}_{match[2]}"
            found[key] = found.get(key, 0.0) + float(match[4])
    return found


def mean_batches(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Rows per predict call between two scrapes: in the workers' view and, with hosts, in the hosts'."""
    means = {}
    for metric, key in (("servekit_batch_size", "mean_batch"), ("servekit_host_batch_size", "mean_host_batch")):
        calls = after.get(f"{metric}_count", 0.0) - before.get(f"{metric}_count", 0.0)
        rows = after.get(f"{metric}_sum", 0.0) - before.get(f"{metric}_sum", 0.0)
        if calls > 0:
            means[key] = round(rows / calls, 2)
    return means


def measure(server: Server, protocol: str, model: str, rows: int, seconds: float) -> list[dict]:
    """One scenario at each connection level, after a check and a 1 s warm-up."""
    check_answer(server, model, rows, protocol)
    url, body = server.url(model, protocol), body_path(model, rows, protocol)
    wrk(url, body, 8, 1)  # warm-up
    runs = []
    for conns in server.connections:
        before = batch_counters(server, model) if server.batching else {}
        run = {
            "model": model,
            "rows": rows,
            "protocol": protocol,
            "connections": conns,
            **wrk(url, body, conns, seconds),
        }
        if server.batching:
            run.update(mean_batches(before, batch_counters(server, model)))
        runs.append(run)
        batch = f"  mean batch {run['mean_batch']}" if "mean_batch" in run else ""
        print(
            f"   {protocol} {model:4s} rows={rows:<3d} c={conns:<2d} {run['rps']:8.1f} req/s "
            f"p50 {run['p50_ms']:7.2f} ms p99 {run['p99_ms']:7.2f} ms{batch}"
            + (f"  ERRORS {run['errors']}" if run["errors"] else ""),
            flush=True,
        )
    return runs


def profile_under_load(server: Server, running: Running, py_spy: str) -> dict:
    """py-spy on the busiest worker while wrk drives PROFILE_CELL; the summary or the reason it failed."""
    model, rows, protocol, conns = PROFILE_CELL
    env = {**os.environ, "BENCH_BODY": str(body_path(model, rows, protocol))}
    load = subprocess.Popen(
        wrk_command(server.url(model, protocol), conns, PROFILE_SECONDS + 2),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        time.sleep(1.0)
        found = pyspy.profile_worker(
            py_spy, running.proc.pid, tree(running.proc.pid), PROFILE_SECONDS, RESULTS / f"{server.name}.pyspy.txt"
        )
    finally:
        load.wait(PROFILE_SECONDS + 60)
    found.update({"server": server.name, "model": model, "rows": rows, "protocol": protocol, "connections": conns})
    print(
        f"   profile: {found.get('error') or str(found['samples']) + ' samples of pid ' + str(found['pid'])}",
        flush=True,
    )
    return found


def bench_server(server: Server, seconds: float, py_spy: str = "") -> dict:
    print(f"== {server.name}", flush=True)
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    running = Running(server, RESULTS / f"{server.name}.log")
    result: dict = {"server": server.name, "family": server.family, "note": server.note, "runs": []}
    try:
        result["cold_start_s"] = round(running.wait_ready(), 2)
        time.sleep(2.0)  # let start-up threads settle before reading memory
        result["idle_memory"] = memory(running.proc.pid)
        print(f"   cold start {result['cold_start_s']} s, idle {result['idle_memory']}", flush=True)
        for protocol, model, rows in server.scenarios():
            result["runs"] += measure(server, protocol, model, rows, seconds)
        if server.profile and py_spy:
            result["profile"] = profile_under_load(server, running, py_spy)
    finally:
        result["sigterm_exit_s"] = running.stop()
        result["sigterm_timeout_s"] = STOP_TIMEOUT_S
        result["load_average_at_start"] = round(load_before, 2)
        result["elapsed_s"] = round(time.monotonic() - started, 1)
    print(f"   SIGTERM exit: {result['sigterm_exit_s']}; {result['elapsed_s']} s in all", flush=True)
    return result


def big_tensor(sk: str, port: int) -> dict:
    """The 1M-element FP32 round trip through servekit's echo model, V2 JSON vs the binary extension."""
    server = Server("servekit-big", "servekit", servekit_command(sk, [WORK / "models" / "echo"], port), port, models=())
    running = Running(server, RESULTS / "servekit-big.log")
    try:
        deadline = time.monotonic() + 120
        while http_ok(f"{server.base}/v2/models/echo/ready") is False:
            if time.monotonic() > deadline or running.proc.poll() is not None:
                raise RuntimeError("the echo model did not become ready")
            time.sleep(0.05)
        out = subprocess.run(
            [sk, str(HERE / "big_tensor.py"), server.base], capture_output=True, text=True, timeout=600
        )
        if out.returncode != 0:
            raise RuntimeError(out.stderr[-2000:])
        return json.loads(out.stdout.strip().splitlines()[-1])
    except Exception as exc:
        return {"error": str(exc)}
    finally:
        running.stop()


def http_ok(url: str) -> bool:
    try:
        return http("GET", url, timeout=2)[0] == 200
    except (OSError, urllib.error.URLError):
        return False


# ---------------------------------------------------------------------------
# The line-up
# ---------------------------------------------------------------------------


def servekit_command(sk: str, paths: list[Path], port: int) -> list[str]:
    return [sk, "-m", "servekit", "serve", *map(str, paths), *servekit_flags(port)]


def servekit_flags(port: int) -> list[str]:
    """Every benchmarked servekit: loopback HTTP on ``port``, no gRPC, quiet logs."""
    return ["--host", "127.0.0.1", "--http-port", str(port), "--grpc-port", "0", "--log-level", "warning"]


def servekit_lineup(sk: str, port: int) -> list[Server]:
    serve = servekit_command(sk, [WORK / "models" / "iris", WORK / "models" / "rf"], port)
    granian = ["--server", "granian"]
    batch = ["--max-batch-size", "32", "--max-batch-time-ms", "2"]
    host = ["--placement", "process", *batch]
    both = ("v2", "v1")
    one_row = {"rows": (1,), "batching": True}
    return [
        Server(
            "servekit",
            "servekit",
            serve,
            port,
            protocols=both,
            profile=True,
            note="defaults: gunicorn, --workers auto, --preload auto, fast lane, batching off",
        ),
        Server("servekit-granian", "servekit", serve + granian, port, protocols=both, note="--server granian"),
        Server(
            "servekit-onnx",
            "onnx",
            servekit_command(sk, [WORK / "onnx" / "iris", WORK / "onnx" / "rf"], port),
            port,
            protocols=both,
            note="the same iris and rf converted to ONNX (skl2onnx), through servekit_onnx; defaults",
        ),
        Server(
            "servekit-batch",
            "servekit",
            serve + batch,
            port,
            **one_row,
            note="--max-batch-size 32 --max-batch-time-ms 2: batching in each worker",
        ),
        Server(
            "servekit-granian-batch",
            "servekit",
            serve + granian + batch,
            port,
            **one_row,
            note="--server granian, batching in each worker",
        ),
        Server(
            "servekit-host",
            "servekit",
            serve + host,
            port,
            **one_row,
            note="--placement process + batching: one model host per model, batching there",
        ),
        Server(
            "servekit-granian-host",
            "servekit",
            serve + granian + host,
            port,
            **one_row,
            note="--server granian --placement process + batching",
        ),
    ]


def peer_lineup(mls: str, ks: str, port: int) -> list[Server]:
    mlserver = str(Path(mls).parent / "mlserver")
    mls_env = mlserver_env(port)
    ks_cmd = [
        ks,
        str(HERE / "peers" / "kserve_server.py"),
        "--model_dir",
        str(WORK / "models"),
        "--http_port",
        str(port),
        "--enable_grpc",
        "false",
        "--configure_logging",
        "false",
    ]
    both = ("v2", "v1")
    return [
        Server(
            "mlserver",
            "mlserver",
            [mlserver, "start", str(WORK / "mlserver")],
            port,
            env=mls_env,
            note=f"MLServer {MLSERVER_VERSION}, mlserver-sklearn, default settings (V2 only)",
        ),
        Server(
            "mlserver-batch",
            "mlserver",
            [mlserver, "start", str(WORK / "mlserver-batch")],
            port,
            env=mls_env,
            rows=(1,),
            note="adaptive batching: max_batch_size 32, max_batch_time 2 ms",
        ),
        Server(
            "kserve-1w",
            "kserve",
            ks_cmd + ["--workers", "1"],
            port,
            protocols=both,
            note=f"KServe {KSERVE_VERSION}, custom kserve.Model, 1 worker",
        ),
        Server("kserve-2w", "kserve", ks_cmd + ["--workers", "2"], port, protocols=both, note="2 workers"),
    ]


def ceiling_lineup(sk: str, port: int) -> list[Server]:
    env = {"BENCH_MODELS": str(WORK / "models")}
    peers = str(HERE / "peers")
    both = ("v2", "v1")
    return [
        Server(
            "wsgi-gunicorn",
            "ceiling",
            [
                sk,
                "-m",
                "gunicorn",
                "-w",
                "2",
                "-k",
                "gthread",
                "--threads",
                "16",
                "-b",
                f"127.0.0.1:{port}",
                "--chdir",
                peers,
                "plain_wsgi:app",
            ],
            port,
            env=env,
            protocols=both,
            note="peers/plain_wsgi.py on gunicorn, 2 gthread workers x 16 threads",
        ),
        Server(
            "wsgi-granian",
            "ceiling",
            [
                sk,
                "-m",
                "granian",
                "--interface",
                "wsgi",
                "--workers",
                "2",
                "--blocking-threads",
                "16",
                "--backpressure",
                "16",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--working-dir",
                peers,
                "--log-level",
                "warning",
                "plain_wsgi:app",
            ],
            port,
            env=env,
            protocols=both,
            note="peers/plain_wsgi.py on granian (WSGI), 2 workers x 16 threads",
        ),
    ]


def trees_lineup(sk: str, port: int) -> list[Server]:
    """The gradient-boosted trees through servekit's plugins, MLServer's runtimes (V2: MLServer has no
    V1; defaults and adaptive batching) and KServe's xgbserver and lgbserver (one model each)."""
    boosters = ("xgb", "lgb")
    serve = servekit_command(sk, [WORK / "models" / m for m in boosters], port)
    mlserver = str(VENVS / "mlserver-trees" / "bin" / "mlserver")
    kserve = str(VENVS / "kserve-trees" / "bin" / "python")

    def kserve_runtime(runtime: str, model: str, folder: Path, workers: int) -> list[str]:
        return [
            kserve,
            "-m",
            runtime,
            "--model_name",
            model,
            "--model_dir",
            str(folder),
            "--http_port",
            str(port),
            "--enable_grpc",
            "false",
            "--configure_logging",
            "false",
            "--workers",
            str(workers),
        ]

    xgbserver = f"KServe {KSERVE_VERSION} with xgbserver ({KSERVE_RUNTIMES_REF} source), nthread 1 (its default)"
    return [
        Server(
            "servekit-trees",
            "servekit",
            serve,
            port,
            models=boosters,
            note="servekit_xgboost and servekit_lightgbm, defaults (threads: the worker's share of the CPUs)",
        ),
        Server(
            "mlserver-trees",
            "mlserver",
            [mlserver, "start", str(WORK / "mlserver-trees")],
            port,
            env=mlserver_env(port),
            models=boosters,
            note=f"MLServer {MLSERVER_VERSION}, mlserver-xgboost and mlserver-lightgbm, default settings",
        ),
        Server(
            "mlserver-trees-batch",
            "mlserver",
            [mlserver, "start", str(WORK / "mlserver-trees-batch")],
            port,
            env=mlserver_env(port),
            models=boosters,
            note="the same with adaptive batching: max_batch_size 32, max_batch_time 2 ms",
        ),
        *(
            Server(
                f"xgbserver-{workers}w",
                "kserve",
                kserve_runtime("xgbserver", "xgb", WORK / "models" / "xgb" / "1", workers),
                port,
                models=("xgb",),
                note=f"{xgbserver}, {workers} worker(s)",
            )
            for workers in (1, 2)
        ),
        Server(
            "lgbserver",
            "kserve",
            kserve_runtime("lgbserver", "lgb", WORK / "kserve-lgb", 1),
            port,
            models=("lgb",),
            note=f"KServe {KSERVE_VERSION} with lgbserver ({KSERVE_RUNTIMES_REF} source): one worker, as it insists",
        ),
    ]


def mlserver_env(port: int) -> dict[str, str]:
    return {
        "MLSERVER_HTTP_PORT": str(port),
        "MLSERVER_HOST": "127.0.0.1",
        "MLSERVER_GRPC_PORT": str(port + 1),
        "MLSERVER_METRICS_PORT": str(port + 2),
        "MLSERVER_LOGGING_LEVEL": "WARNING",
    }


def lineup(sk: str, mls: str, ks: str, port: int) -> list[Server]:
    return servekit_lineup(sk, port) + peer_lineup(mls, ks, port) + ceiling_lineup(sk, port) + trees_lineup(sk, port)


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def environments(args: argparse.Namespace, sk: str) -> tuple[str, str, str]:
    """The MLServer, KServe and tools interpreters; unless --skip-install, the virtualenvs the
    servers chosen with --only need (all of them without it) are installed."""
    mls, ks, tools = (str(VENVS / n / "bin" / "python") for n in ("mlserver", "kserve", "tools"))
    if args.skip_install:
        return mls, ks, tools
    names = [n.strip() for n in args.only.split(",")] if args.only else None

    def needed(*servers: str) -> bool:
        return names is None or any(n in servers for n in names)

    pin = f"scikit-learn=={sklearn_version(sk)}"
    # uvloop 0.22 made get_event_loop() raise outside a running loop, which kills
    # MLServer 1.7.1's inference-pool workers at start: pin the one it was built against
    if needed("mlserver", "mlserver-batch"):
        mls = ensure_venv(
            "mlserver", [f"mlserver=={MLSERVER_VERSION}", f"mlserver-sklearn=={MLSERVER_VERSION}", pin, "uvloop<0.22"]
        )
    if needed("kserve-1w", "kserve-2w"):
        ks = ensure_venv("kserve", [f"kserve=={KSERVE_VERSION}", pin, "joblib"])
    tools = ensure_venv("tools", ["matplotlib", "py-spy"])
    if needed("mlserver-trees", "mlserver-trees-batch"):
        ensure_venv("mlserver-trees", [*mlserver_trees_packages(sk), *booster_packages(sk), "uvloop<0.22"])
    if needed("xgbserver-1w", "xgbserver-2w", "lgbserver"):
        ensure_venv("kserve-trees", [*kserve_trees_packages(), *booster_packages(sk)], kserve_tree_runtimes())
    return mls, ks, tools


def booster_packages(sk: str) -> list[str]:
    """xgboost and lightgbm at the versions servekit has: the peers load the same files with the same library."""
    probe = "import xgboost, lightgbm; print(xgboost.__version__, lightgbm.__version__)"
    out = subprocess.run([sk, "-c", probe], capture_output=True, text=True)
    xgb_version, lgb_version = out.stdout.split() if out.returncode == 0 else ("", "")
    return [
        f"xgboost=={xgb_version}" if xgb_version else "xgboost",
        f"lightgbm=={lgb_version}" if lgb_version else "lightgbm",
    ]


def mlserver_trees_packages(sk: str) -> list[str]:
    """MLServer with its XGBoost and LightGBM runtimes."""
    return [
        f"mlserver=={MLSERVER_VERSION}",
        f"mlserver-xgboost=={MLSERVER_VERSION}",
        f"mlserver-lightgbm=={MLSERVER_VERSION}",
    ]


def kserve_trees_packages() -> list[str]:
    """What KServe's xgbserver and lgbserver import (their pyprojects name kserve by a path in KServe's repo)."""
    return [f"kserve=={KSERVE_VERSION}", f"kserve-storage=={KSERVE_VERSION}", "pandas<3"]


def kserve_tree_runtimes() -> tuple[str, ...]:
    """KServe's xgbserver and lgbserver, built from KServe's repository (they are not on PyPI):
    the folders to install, from a clone under bench/.venvs/src.

    ``BENCH_KSERVE_GIT`` names another clone of github.com/kserve/kserve: a URL, or a local
    git directory (a mirror), from which only the two folders are read (``git archive``)."""
    repo = os.environ.get("BENCH_KSERVE_GIT", "https://github.com/kserve/kserve")
    source = VENVS / "src" / f"kserve-{KSERVE_RUNTIMES_REF}"
    folders = [f"python/{name}" for name in ("xgbserver", "lgbserver")]
    if not all((source / f).is_dir() for f in folders):
        shutil.rmtree(source, ignore_errors=True)
        source.mkdir(parents=True)
        if Path(repo).is_dir():
            tar = subprocess.run(
                ["git", "--git-dir", repo, "archive", KSERVE_RUNTIMES_REF, *folders], capture_output=True, check=True
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(source)], input=tar, check=True)
        else:
            clone = ["git", "clone", "-q", "--depth", "1", "--branch", KSERVE_RUNTIMES_REF, repo, str(source)]
            subprocess.run(clone, check=True)
    return tuple(str(source / f) for f in folders)


def chosen(servers: list[Server], only: str | None) -> list[Server]:
    if not only:
        return servers
    wanted = [n.strip() for n in only.split(",") if n.strip()]
    unknown = set(wanted) - {s.name for s in servers}
    if unknown:
        sys.exit(f"--only: unknown server(s) {', '.join(sorted(unknown))}; known: {', '.join(s.name for s in servers)}")
    return [s for s in servers if s.name in wanted]


def merged(results: dict, previous: Path, order: list[str]) -> dict:
    """With --merge: the last results.json's other servers and this run's fresh ones, in line-up order."""
    old = json.loads(previous.read_text())
    fresh = {s["server"] for s in results["servers"]}
    servers = [s for s in old["servers"] if s["server"] not in fresh] + results["servers"]
    place = {name: i for i, name in enumerate(order)}
    results["servers"] = sorted(servers, key=lambda s: place.get(s["server"], len(place)))
    for key in ("big_tensor", "profile"):
        if key not in results and key in old:
            results[key] = old[key]
    results["started"] = old["started"] + f" (re-run {results['started']}: {', '.join(sorted(fresh))})"
    return results


def run_all(servers: list[Server], args: argparse.Namespace, sk: str, py_spy: str) -> dict:
    results = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "load_average": os.getloadavg()[0]},
        "duration_s": args.duration,
        "connections": list(CONNECTIONS),
        "servers": [],
    }
    for server in servers:
        try:
            outcome = bench_server(server, args.duration, py_spy)
        except Exception as exc:  # one broken peer must not lose the others' numbers
            print(f"   FAILED: {exc}", flush=True)
            outcome = {"server": server.name, "family": server.family, "error": str(exc), "runs": []}
        if "profile" in outcome:
            results["profile"] = outcome.pop("profile")
        results["servers"].append(outcome)
        if server.name == "servekit":
            results["big_tensor"] = big_tensor(sk, args.port)
            print(f"   1M FP32: {results['big_tensor']}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per wrk run (default 4)")
    parser.add_argument("--only", help="comma-separated server names to run (see the line-up above)")
    parser.add_argument("--skip-install", action="store_true", help="use bench/.venvs as they are")
    parser.add_argument("--port", type=int, default=18600)
    parser.add_argument(
        "--merge", action="store_true", help="keep the other servers' numbers from the last results.json (with --only)"
    )
    args = parser.parse_args()

    sk = servekit_python()
    RESULTS.mkdir(parents=True, exist_ok=True)
    ensure_wrk()
    mls, ks, tools = environments(args, sk)
    everyone = lineup(sk, mls, ks, args.port)
    servers = chosen(everyone, args.only)
    if not args.merge or not (WORK / "bodies").exists():
        if WORK.exists():
            shutil.rmtree(WORK)
        WORK.mkdir(parents=True)
        subprocess.run([sk, str(HERE / "models.py"), str(WORK)], check=True)

    began = time.monotonic()
    results = run_all(servers, args, sk, str(Path(tools).parent / "py-spy"))
    results["elapsed_s"] = round(time.monotonic() - began, 1)
    previous = RESULTS / "results.json"
    if args.merge and previous.exists():
        results = merged(results, previous, [s.name for s in everyone])
    previous.write_text(json.dumps(results, indent=2))
    if any(s.name == "servekit-trees" for s in servers):
        subprocess.run([sk, str(HERE / "trees_report.py"), str(previous)], check=False)
    subprocess.run([sk, str(HERE / "report.py"), str(previous)], check=True, stdout=subprocess.DEVNULL)
    if Path(tools).exists():
        subprocess.run([tools, str(HERE / "chart.py"), str(previous)], check=False)
    targets = (RESULTS / "results.md").read_text().split("## Targets", 1)[-1].split("\n## ", 1)[0]
    print(
        f"== targets{targets}wrote {RESULTS / 'results.md'}, results.json and chart.png "
        f"({results['elapsed_s']} s of measuring)"
    )


if __name__ == "__main__":
    main()
