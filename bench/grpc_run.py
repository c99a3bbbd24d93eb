"""gRPC: servekit's V2 ``ModelInfer`` and TF Serving ``Predict`` beside MLServer's and KServe's gRPC, one run.

    python bench/grpc_run.py                      # everything (about 30 minutes on 2 cores: three rounds a cell)
    python bench/grpc_run.py --only servekit,kserve --duration 2
    python bench/grpc_run.py --before OLD_TREE   # beside an earlier tree: git archive OLD framework plugins | tar -x -C OLD_TREE
    python bench/grpc_run.py --rows 1 --only servekit,mlserver,mlserver-batch,kserve   # the issue's target cells

Run it with servekit's Python (it builds the protobuf bodies with servekit's
messages); the peers' virtualenvs are bench/run.py's (``bench/.venvs``, built by
running it once), used when they exist.  The load generator is ``h2load`` (Debian's ``nghttp2-client``,
installed when missing): one thread of C sending a fixed, length-prefixed
protobuf body per unary call (``content-type: application/grpc``, ``te:
trailers``), 8 connections with 1 stream each (8 streams) and with 8 each (64).

Every cell is checked before the load (one call through grpcio: status OK, one
prediction per row, the answer's size) and after it: h2load counts the DATA
bytes it received, and an answer that is not a whole successful message (a
``grpc-status`` other than 0 arrives as trailers alone) is an error.  p50/p99
come from h2load's per-request log; the server's CPU time per request (all its
processes, from /proc) is less disturbed by other work on the machine than
throughput, though not immune (docs/performance.md uses callgrind for that).  servekit servers also answer the same 1-row cells over HTTP (V2 JSON,
``wrk``, as bench/run.py), so the two wires compare in the same run.

Each cell runs ``--rounds`` times (default 3), its wires interleaved (V2, TF
Serving, HTTP; then again), and the round with the median throughput is the
cell's figure, every round's beside it.  The kernel hashes each of h2load's
connections to one worker's ``SO_REUSEPORT`` socket, so a round's split (5/3,
6/2, ...) is its own: one round per wire compares two splits, not two wires.

The line-up (``--only``):

- ``servekit``: the defaults (gunicorn, ``--workers auto``), every cell, V2 and
  TF Serving, plus ``ModelStreamInfer``/``PredictStreamed`` with many messages
  on one stream and a py-spy profile under iris 1 row at 64 streams;
- ``servekit-before``: the same server from an earlier tree (``--before DIR``, a
  checkout or ``git archive`` of an older commit, its ``framework`` and ``plugins``
  put first on ``PYTHONPATH``), profiled the same way: the before and after;
- ``servekit-granian``: ``--server granian``; ``servekit-batch``:
  ``--max-batch-size 32 --max-batch-time-ms 2`` (1-row V2 cells);
- ``servekit-2x``: twice as many workers as CPUs (1-row V2 and TF Serving cells, and
  HTTP): each worker's gRPC server binds the port with ``SO_REUSEPORT``, the kernel
  hashes each of h2load's 8 connections to one of them, and with a second process
  on each CPU an uneven split still keeps both CPUs busy;
- ``mlserver`` and ``mlserver-batch`` (adaptive batching), V2 only;
- ``kserve``: KServe's gRPC server (``peers/kserve_server.py``, 1 worker), V2 only;
- ``big``: a 1M-element FP32 tensor through the echo model, V2 JSON, the binary
  extension and gRPC raw contents (bench/big_tensor.py).

Writes ``bench/results/grpc.json`` and ``bench/results/grpc.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import numpy as np
import run
from run import RESULTS, VENVS, WORK, Running, Server
from servekit.codecs import tensor_proto
from servekit.protocols.grpc.protos.inference import grpc_service_pb2 as v2_pb
from servekit.protocols.grpc.protos.inference import grpc_service_pb2_grpc as v2_grpc
from servekit.protocols.grpc.protos.tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
from servekit.server.cpus import available_cpus

HERE = Path(__file__).resolve().parent
STREAMS = ((8, 1), (8, 8))  # (connections, streams per connection): 8 and 64 streams
MODELS = ("iris", "rf")
ROWS = (1, 100)
METHODS = {
    "v2": "/inference.GRPCInferenceService/ModelInfer",
    "tf": "/tensorflow.serving.PredictionService/Predict",
}
PROFILE_CELL = ("v2", "iris", 1, 64)
STREAM_MESSAGES = 2000


# ---------------------------------------------------------------------------
# Bodies and answers
# ---------------------------------------------------------------------------


def sample(model: str, rows: int) -> np.ndarray:
    doc = json.loads(run.body_bytes(model, rows, "v2"))
    tensor = doc["inputs"][0]
    return np.asarray(tensor["data"], dtype=np.float64).reshape(tensor["shape"])


def request_of(protocol: str, model: str, rows: int):
    """The message a client sends: raw contents (as tritonclient) or a TensorProto (as tf.make_tensor_proto)."""
    x = sample(model, rows)
    if protocol == "v2":
        request = v2_pb.ModelInferRequest(model_name=model)
        request.inputs.add(name="input", datatype="FP64", shape=list(x.shape))
        request.raw_input_contents.append(x.astype("<f8").tobytes())
        return request
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    tensor_proto.from_numpy(x, request.inputs["input"])
    return request


def framed(message) -> bytes:
    """A gRPC length-prefixed message: no compression flag, 4-byte big-endian length, the bytes."""
    data = message.SerializeToString()
    return b"\0" + struct.pack(">I", len(data)) + data


def body_file(protocol: str, model: str, rows: int) -> Path:
    path = WORK / "bodies" / f"{model}-{rows}-{protocol}.grpc"
    path.write_bytes(framed(request_of(protocol, model, rows)))
    return path


def check_answer(port: int, protocol: str, model: str, rows: int) -> int:
    """One call through grpcio: it must succeed with one prediction per row; returns the answer's framed size."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        if protocol == "v2":
            response = v2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
                request_of(protocol, model, rows), timeout=30
            )
            count = response.outputs[0].shape[0]
        else:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            response = stub.Predict(request_of(protocol, model, rows), timeout=30)
            count = next(iter(response.outputs.values())).tensor_shape.dim[0].size
    if count != rows:
        raise RuntimeError(f"{protocol} {model}: {count} predictions for {rows} rows")
    return response.ByteSize() + 5


# ---------------------------------------------------------------------------
# Load
# ---------------------------------------------------------------------------


def ensure_h2load() -> None:
    run.ensure_debian_tool("h2load", "nghttp2-client")


def cpu_ticks(pid: int) -> int:
    total = 0
    for p in run.tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total


def cpu_us_per(ticks: int, requests: int) -> float:
    """Clock ticks of server CPU as microseconds per answered request."""
    return round(ticks * 1e6 / os.sysconf("SC_CLK_TCK") / max(1, requests), 1)


def h2load(port: int, method: str, body: Path, connections: int, streams: int, seconds: float) -> dict:
    with tempfile.NamedTemporaryFile("r", suffix=".log") as log:
        command = [
            "h2load",
            "-t1",
            f"-c{connections}",
            f"-m{streams}",
            f"-D{max(1, round(seconds))}",
            "--warm-up-time=1",
            "-H",
            "content-type: application/grpc",
            "-H",
            "te: trailers",
            "-d",
            str(body),
            f"--log-file={log.name}",
            f"http://127.0.0.1:{port}{method}",
        ]
        load = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.5)  # past the warm-up: every connection is open
        split = connection_split(port)
        stdout, stderr = load.communicate(timeout=seconds + 60)
        out = subprocess.CompletedProcess(command, load.returncode, stdout, stderr)
        times = sorted(int(line.split("\t")[2]) for line in log.read().splitlines() if line.count("\t") == 2)
    text = out.stdout
    try:
        done = int(text.split(" done,")[0].rsplit(",", 1)[1].split()[0])
        data = int(text.split("headers (space savings")[1].split("(")[1].split(")")[0])
        finished = float(text.split("finished in ")[1].split("s,")[0])
    except (IndexError, ValueError):
        raise RuntimeError(f"h2load failed: {text[-800:]} {out.stderr[-400:]}") from None
    return {"done": done, "data_bytes": data, "seconds": finished, "times_us": times, "split": split}


def connection_split(port: int) -> list[int]:
    """Established connections to ``port`` per server process, most first: how SO_REUSEPORT spread them."""
    out = subprocess.run(
        ["ss", "-Htnp", "state", "established", f"( sport = :{port} )"], capture_output=True, text=True
    ).stdout
    counts: dict[str, int] = {}
    for pid in re.findall(r"pid=(\d+)", out):
        counts[pid] = counts.get(pid, 0) + 1
    return sorted(counts.values(), reverse=True)


def percentile(times: list[int], q: float) -> float:
    if not times:
        return 0.0
    return round(times[min(len(times) - 1, int(q * len(times)))] / 1000, 2)


def grpc_round(
    running: Running, grpc_port: int, protocol: str, model: str, rows: int, answer: int, load: tuple, seconds: float
) -> dict:
    """One h2load run of a gRPC cell: throughput, latency, the server's CPU and the connection split."""
    connections, streams = load
    before = cpu_ticks(running.proc.pid)
    raw = h2load(grpc_port, METHODS[protocol], body_file(protocol, model, rows), connections, streams, seconds)
    ticks = cpu_ticks(running.proc.pid) - before
    answered = raw["data_bytes"] // answer
    return {
        "wire": "grpc",
        "protocol": protocol,
        "model": model,
        "rows": rows,
        "streams": connections * streams,
        "rps": round(answered / raw["seconds"], 1),
        "p50_ms": percentile(raw["times_us"], 0.50),
        "p99_ms": percentile(raw["times_us"], 0.99),
        "requests": raw["done"],
        "errors": max(0, raw["done"] - answered),
        "cpu_us_per_request": cpu_us_per(ticks, answered),
        "connections_per_process": raw["split"],
    }


def http_round(server: Server, running: Running, model: str, load: tuple, seconds: float) -> dict:
    """The same 1-row cell over HTTP (V2 JSON, wrk, as many connections as gRPC has streams)."""
    connections = load[0] * load[1]
    before = cpu_ticks(running.proc.pid)
    raw = run.wrk(server.url(model, "v2"), run.body_path(model, 1, "v2"), connections, seconds)
    ticks = cpu_ticks(running.proc.pid) - before
    return {
        "wire": "http",
        "protocol": "v2-json",
        "model": model,
        "rows": 1,
        "streams": connections,
        **{k: raw[k] for k in ("rps", "p50_ms", "p99_ms", "requests", "errors")},
        "cpu_us_per_request": cpu_us_per(ticks, raw["requests"]),
    }


def median_of(rounds: list[dict]) -> dict:
    """The round with the median throughput (the lower of the two middle ones), with every round beside it.

    The kernel spreads h2load's 8 connections over the workers' ``SO_REUSEPORT`` sockets by a hash of
    each connection's ports, so each round of a cell runs on a split of its own; the rounds of the
    cells that are compared run interleaved, and the median compares them on the same odds.
    """
    ordered = sorted(rounds, key=lambda cell: cell["rps"])
    cell = dict(ordered[(len(ordered) - 1) // 2])
    cell["rounds"] = [
        {k: c[k] for k in ("rps", "p99_ms", "errors", "connections_per_process") if k in c} for c in rounds
    ]
    cell["errors"] = sum(c["errors"] for c in rounds)
    return cell


def report(server: Server, cell: dict) -> None:
    print(
        f"   {cell['wire']:4s} {cell['protocol']:7s} {cell['model']:4s} rows={cell['rows']:<3d} "
        f"streams={cell['streams']:<2d} {cell['rps']:8.1f} req/s p50 {cell['p50_ms']:6.2f} ms "
        f"p99 {cell['p99_ms']:7.2f} ms  cpu {cell['cpu_us_per_request']:6.1f} us/req"
        + (f"  split {cell['connections_per_process']}" if cell.get("connections_per_process") else "")
        + (f"  ERRORS {cell['errors']}" if cell["errors"] else ""),
        flush=True,
    )


def stream_throughput(port: int, messages: int = STREAM_MESSAGES) -> dict:
    """``ModelStreamInfer`` and ``PredictStreamed``: many 1-row iris messages on one stream, answers per second."""
    out = {}
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        v2_stub = v2_grpc.GRPCInferenceServiceStub(channel)
        tf_stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        v2_request, tf_request = request_of("v2", "iris", 1), request_of("tf", "iris", 1)
        for name, call, request in (
            ("ModelStreamInfer", v2_stub.ModelStreamInfer, v2_request),
            ("PredictStreamed", tf_stub.PredictStreamed, tf_request),
        ):
            started = time.perf_counter()
            answers = list(call(iter([request] * messages), timeout=120))
            seconds = time.perf_counter() - started
            failed = [a for a in answers if getattr(a, "error_message", "")]
            out[name] = {
                "messages": messages,
                "answers": len(answers),
                "errors": len(failed),
                "per_s": round(len(answers) / seconds, 1),
            }
    return out


def profile(server: Server, running: Running, grpc_port: int, py_spy: str, seconds: int = 5) -> dict:
    protocol, model, rows, streams = PROFILE_CELL
    body = body_file(protocol, model, rows)
    command = ["h2load", "-t1", "-c8", f"-m{streams // 8}", f"-D{seconds + 2}", "-H", "content-type: application/grpc"]
    command += ["-H", "te: trailers", "-d", str(body), f"http://127.0.0.1:{grpc_port}{METHODS[protocol]}"]
    load = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)
        found = run.pyspy.profile_worker(
            py_spy, running.proc.pid, run.tree(running.proc.pid), seconds, RESULTS / f"{server.name}.grpc.pyspy.txt"
        )
    finally:
        load.wait(seconds + 60)
    found.update({"server": server.name, "cell": list(PROFILE_CELL)})
    print(f"   profile: {found.get('error') or str(found['samples']) + ' GIL samples of pid ' + str(found['pid'])}")
    return found


# ---------------------------------------------------------------------------
# The line-up
# ---------------------------------------------------------------------------


def lineup(sk: str, port: int, before: Path | None = None) -> list[tuple[Server, int, dict]]:
    """(server, its gRPC port, what to measure)."""
    grpc_port = port + 1
    paths = [WORK / "models" / "iris", WORK / "models" / "rf"]
    flags = ["--host", "127.0.0.1", "--http-port", str(port), "--grpc-port", str(grpc_port), "--log-level", "warning"]
    serve = [sk, "-m", "servekit", "serve", *map(str, paths), *flags]
    batch = ["--max-batch-size", "32", "--max-batch-time-ms", "2"]
    cpus = available_cpus()
    everything = {"protocols": ("v2", "tf"), "rows": ROWS, "http": True}
    one_row = {"protocols": ("v2",), "rows": (1,), "http": True}
    servers = [
        (
            Server("servekit", "servekit", serve, port, note="defaults: gunicorn, --workers auto"),
            grpc_port,
            {**everything, "profile": True, "streams": True},
        ),
    ]
    if before is not None:
        tree = f"{before / 'framework'}{os.pathsep}{before / 'plugins'}"
        note = f"the defaults from the earlier tree given with --before ({before.name}), first on PYTHONPATH"
        server = Server("servekit-before", "servekit", serve, port, env={"PYTHONPATH": tree}, note=note)
        servers.append((server, grpc_port, {**everything, "profile": True}))
    servers += [
        (
            Server("servekit-granian", "servekit", serve + ["--server", "granian"], port, note="--server granian"),
            grpc_port,
            one_row,
        ),
        (Server("servekit-batch", "servekit", serve + batch, port, note="batching in each worker"), grpc_port, one_row),
        (
            Server("servekit-2x", "servekit", serve + ["--workers", str(2 * cpus)], port, note=f"--workers {2 * cpus}"),
            grpc_port,
            {**one_row, "protocols": ("v2", "tf")},
        ),
    ]
    mls = VENVS / "mlserver" / "bin" / "mlserver"
    if mls.exists():
        env = run.mlserver_env(port)
        for name, folder, note in (
            ("mlserver", "mlserver", f"MLServer {run.MLSERVER_VERSION}, mlserver-sklearn, default settings"),
            ("mlserver-batch", "mlserver-batch", "adaptive batching: max_batch_size 32, max_batch_time 2 ms"),
        ):
            server = Server(name, "mlserver", [str(mls), "start", str(WORK / folder)], port, env=env, note=note)
            servers.append(
                (
                    server,
                    int(env["MLSERVER_GRPC_PORT"]),
                    {"protocols": ("v2",), "rows": (1,) if "batch" in name else ROWS},
                )
            )
    ks = VENVS / "kserve" / "bin" / "python"
    if ks.exists():
        command = [
            str(ks),
            str(HERE / "peers" / "kserve_server.py"),
            "--model_dir",
            str(WORK / "models"),
            "--http_port",
            str(port),
        ]
        command += [
            "--grpc_port",
            str(grpc_port),
            "--enable_grpc",
            "true",
            "--workers",
            "1",
            "--configure_logging",
            "false",
        ]
        server = Server(
            "kserve", "kserve", command, port, note=f"KServe {run.KSERVE_VERSION}, custom kserve.Model, gRPC, 1 worker"
        )
        servers.append((server, grpc_port, {"protocols": ("v2",), "rows": ROWS}))
    return servers


def bench(server: Server, grpc_port: int, plan: dict, seconds: float, py_spy: str) -> dict:
    print(f"== {server.name}", flush=True)
    running = Running(server, RESULTS / f"{server.name}.grpc.log")
    result: dict = {"server": server.name, "family": server.family, "note": server.note, "runs": []}
    try:
        result["cold_start_s"] = round(running.wait_ready(), 2)
        deadline = time.monotonic() + 60
        while True:  # the gRPC port may open after HTTP answers
            try:
                check_answer(grpc_port, "v2", "iris", 1)
                break
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        answers = {}
        for protocol in plan["protocols"]:
            for model in MODELS:
                for rows in plan["rows"]:
                    answers[protocol, model, rows] = check_answer(grpc_port, protocol, model, rows)
                    h2load(grpc_port, METHODS[protocol], body_file(protocol, model, rows), 8, 1, 1)  # warm-up
        if plan.get("http"):
            for model in MODELS:
                run.check_answer(server, model, 1, "v2")
        for model in MODELS:
            for rows in plan["rows"]:
                for load in STREAMS:
                    kinds = [p for p in plan["protocols"] if (p, model, rows) in answers]
                    kinds += ["http"] if plan.get("http") and rows == 1 else []
                    rounds: dict[str, list[dict]] = {kind: [] for kind in kinds}
                    for _ in range(plan["rounds"]):
                        for kind in kinds:
                            if kind == "http":
                                cell = http_round(server, running, model, load, seconds)
                            else:
                                cell = grpc_round(
                                    running, grpc_port, kind, model, rows, answers[kind, model, rows], load, seconds
                                )
                            report(server, cell)
                            rounds[kind].append(cell)
                    result["runs"] += [median_of(rounds[kind]) for kind in kinds]
        if plan.get("streams"):
            result["streaming"] = stream_throughput(grpc_port)
            print(f"   streaming: {result['streaming']}", flush=True)
        if plan.get("profile") and py_spy:
            result["profile"] = profile(server, running, grpc_port, py_spy)
    except Exception as exc:  # one broken server must not lose the others' numbers
        print(f"   FAILED: {exc}", flush=True)
        result["error"] = str(exc)
    finally:
        running.stop()
    return result


def big_tensor(sk: str, port: int) -> dict:
    """1M FP32 elements through the echo model: V2 JSON, the binary extension and gRPC raw contents."""
    command = [sk, "-m", "servekit", "serve", str(WORK / "models" / "echo"), "--host", "127.0.0.1"]
    command += ["--http-port", str(port), "--grpc-port", str(port + 1), "--log-level", "warning"]
    running = Running(Server("servekit-big", "servekit", command, port, models=()), RESULTS / "servekit-big.grpc.log")
    try:
        deadline = time.monotonic() + 120
        while not run.http_ok(f"http://127.0.0.1:{port}/v2/models/echo/ready"):
            if time.monotonic() > deadline or running.proc.poll() is not None:
                raise RuntimeError("the echo model did not become ready")
            time.sleep(0.05)
        time.sleep(1.0)  # every worker's gRPC port
        out = subprocess.run(
            [sk, str(HERE / "big_tensor.py"), f"http://127.0.0.1:{port}", f"127.0.0.1:{port + 1}"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if out.returncode != 0:
            raise RuntimeError(out.stderr[-2000:])
        return json.loads(out.stdout.strip().splitlines()[-1])
    except Exception as exc:
        return {"error": str(exc)}
    finally:
        running.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per h2load run (default 4)")
    parser.add_argument("--only", help="comma-separated server names")
    parser.add_argument("--port", type=int, default=18800)
    parser.add_argument("--before", type=Path, help="an earlier tree (framework/, plugins/) to run as servekit-before")
    parser.add_argument("--rows", default="1,100", help="rows per request to measure, comma-separated (default 1,100)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of each cell, interleaved across its wires; the median is kept (default 3)",
    )
    parser.add_argument("--py-spy", default=shutil.which("py-spy") or "", help="py-spy to profile with")
    args = parser.parse_args()
    ensure_h2load()
    run.ensure_wrk()
    sk = sys.executable
    RESULTS.mkdir(parents=True, exist_ok=True)
    if not (WORK / "bodies").exists():
        WORK.mkdir(parents=True, exist_ok=True)
        subprocess.run([sk, str(HERE / "models.py"), str(WORK)], check=True)
    servers = lineup(sk, args.port, args.before)
    rows = {int(r) for r in args.rows.split(",")}
    for _server, _port, plan in servers:
        plan["rows"] = tuple(r for r in plan["rows"] if r in rows)
        plan["rounds"] = max(1, args.rounds)
    if args.only:
        wanted = {n.strip() for n in args.only.split(",")}
        servers = [s for s in servers if s[0].name in wanted or (s[0].name == "servekit-big" and "big" in wanted)]
    results = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "load_average": os.getloadavg()[0]},
        "duration_s": args.duration,
        "rounds": max(1, args.rounds),
        "servers": [bench(server, port, plan, args.duration, args.py_spy) for server, port, plan in servers],
    }
    if not args.only or "big" in (args.only or ""):
        results["big_tensor"] = big_tensor(sk, args.port)
        print(f"== 1M FP32: {results['big_tensor']}", flush=True)
    results["load_average_at_end"] = os.getloadavg()[0]
    (RESULTS / "grpc.json").write_text(json.dumps(results, indent=2))
    subprocess.run([sk, str(HERE / "grpc_report.py"), str(RESULTS / "grpc.json")], check=False)


if __name__ == "__main__":
    main()
