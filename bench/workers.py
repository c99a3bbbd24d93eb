"""Measure gunicorn worker models for servekit: gthread vs sync vs gevent, workers, threads, --preload.

    python bench/workers.py            (after bench/run.py has fitted the models once)

Each variant serves bench/results/work/models; wrk drives iris and the
RandomForest (batching on) at 8 and 64 connections over V2 JSON.  Prints a
table and writes bench/results/workers.json; docs/performance.md explains
the choice made from it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run as bench

LAUNCH = """
import sys
from servekit.server import settings as settings_mod
from servekit.server.gunicorn_app import ServekitApplication
import argparse
parser = argparse.ArgumentParser()
settings_mod.add_arguments(parser)
parser.add_argument("--worker-class", default="gthread")
args = parser.parse_args(sys.argv[1:])
worker_class = args.__dict__.pop("worker_class")
extra = {"worker_class": worker_class}
if worker_class == "gevent":
    extra["worker_connections"] = 1000
ServekitApplication(settings_mod.resolve(args), extra=extra).run()
"""

VARIANTS = [
    ("gthread w1 t8", ["--workers", "1", "--threads", "8"]),
    ("gthread w2 t8", ["--workers", "2", "--threads", "8"]),
    ("gthread w2 t32", ["--workers", "2", "--threads", "32"]),
    ("gthread w2 t32 preload", ["--workers", "2", "--threads", "32", "--preload"]),
    ("sync w2", ["--workers", "2", "--worker-class", "sync"]),
    ("gevent w2", ["--workers", "2", "--worker-class", "gevent"]),
]


def main() -> None:
    python = bench.servekit_python()
    port = 18700
    rows = []
    for name, flags in VARIANTS:
        command = [
            python,
            "-c",
            LAUNCH,
            str(bench.WORK / "models"),
            *bench.servekit_flags(port),
            "--max-batch-size",
            "32",
            *flags,
        ]
        server = bench.Server(name.replace(" ", "_"), "servekit", command, port, models=("iris", "rf"))
        running = bench.Running(server, bench.RESULTS / f"workers-{server.name}.log")
        row = {"variant": name}
        try:
            row["cold_start_s"] = round(running.wait_ready(), 2)
            time.sleep(1.5)
            row["idle"] = bench.memory(running.proc.pid)
            for model, conns in (("iris", 8), ("iris", 64), ("rf", 64)):
                url = server.url(model, "v2")
                bench.wrk(url, bench.body_path(model, 1, "v2"), conns, 1)
                row[f"{model}_c{conns}"] = bench.wrk(url, bench.body_path(model, 1, "v2"), conns, 4)
        except Exception as exc:
            row["error"] = str(exc)
        finally:
            row["sigterm_exit_s"] = running.stop()
        rows.append(row)
        print(json.dumps(row), flush=True)
    (bench.RESULTS / "workers.json").write_text(json.dumps(rows, indent=2))
    print("| variant | iris c8 | iris c64 | rf c64 (batching) | idle PSS MiB | cold start s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        cells = [
            f"{r[k]['rps']:,.0f}/s p99 {r[k]['p99_ms']:.0f} ms" if k in r else r.get("error", "")[:40]
            for k in ("iris_c8", "iris_c64", "rf_c64")
        ]
        print(
            f"| {r['variant']} | "
            + " | ".join(cells)
            + f" | {r.get('idle', {}).get('pss_mib', '')} | {r.get('cold_start_s', '')} |"
        )


if __name__ == "__main__":
    main()
