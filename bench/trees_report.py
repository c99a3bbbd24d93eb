"""The gradient-boosted trees part of ``results.json``: servekit against every peer, cell by cell.

    python bench/trees_report.py bench/results/results.json     # writes results-trees.md beside it

The target (issue 23): at 64 connections, in every cell (XGBoost and LightGBM,
1 and 100 rows), servekit-trees >= 2x the best peer's throughput at a p99 no
worse than that peer's.  "The best peer" is whichever of MLServer's runtimes
(defaults, adaptive batching) and KServe's xgbserver/lgbserver answered the
most requests per second in that cell.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SERVEKIT = "servekit-trees"
PEERS = ("mlserver-trees", "mlserver-trees-batch", "xgbserver-1w", "xgbserver-2w", "lgbserver")
MODELS = {"xgb": "XGBoost", "lgb": "LightGBM"}
TARGET_RATIO, TARGET_CONNECTIONS = 2.0, 64


def cells(doc: dict) -> dict[tuple[str, str, int, int], dict]:
    """(server, model, rows, connections) -> the wrk run."""
    found = {}
    for server in doc["servers"]:
        for run in server["runs"]:
            found[(server["server"], run["model"], run["rows"], run["connections"])] = run
    return found


def report(doc: dict) -> tuple[str, bool]:
    runs = cells(doc)
    servers = {s["server"]: s for s in doc["servers"]}
    peers = [p for p in PEERS if p in servers]
    connections = sorted({k[3] for k in runs if k[0] == SERVEKIT})
    lines = ["## Gradient-boosted trees (XGBoost, LightGBM; V2 JSON)", ""]
    loads = [s["load_average_at_start"] for s in doc["servers"] if "load_average_at_start" in s]
    lines.append(
        f"Run {doc['started']} on {doc['machine']['cpus']} CPUs, {doc['duration_s']} s per wrk run; "
        f"1-minute load average when each server started: {min(loads, default=0):.1f} to {max(loads, default=0):.1f}."
    )
    lines += ["", "### Target", ""]
    lines.append(
        f"| cell (c={TARGET_CONNECTIONS}) | servekit req/s | p99 ms | best peer | req/s | p99 ms | ratio | met |"
    )
    lines.append("|---|---|---|---|---|---|---|---|")
    met_all, measured = True, 0
    for model, label in MODELS.items():
        for rows in (1, 100):
            ours = runs.get((SERVEKIT, model, rows, TARGET_CONNECTIONS))
            theirs = [
                (p, runs[(p, model, rows, TARGET_CONNECTIONS)])
                for p in peers
                if (p, model, rows, TARGET_CONNECTIONS) in runs
            ]
            if ours is None or not theirs:
                lines.append(f"| {label} {rows} row(s) | n/a | | | | | | n/a |")
                met_all = False
                continue
            name, best = max(theirs, key=lambda item: item[1]["rps"])
            ratio = ours["rps"] / best["rps"] if best["rps"] else float("inf")
            met = ratio >= TARGET_RATIO and ours["p99_ms"] <= best["p99_ms"] and not ours["errors"]
            met_all &= met
            measured += 1
            lines.append(
                f"| {label} {rows} row(s) | {ours['rps']:,.0f} | {ours['p99_ms']:.1f} | {name} | {best['rps']:,.0f} | "
                f"{best['p99_ms']:.1f} | **{ratio:.2f}x** | {'yes' if met else '**no**'} |"
            )
    lines += ["", "### Every cell (req/s, p99 ms in brackets; servekit's ratio to each peer below)", ""]
    header = [SERVEKIT, *peers]
    lines.append("| model | rows | c | " + " | ".join(header) + " |")
    lines.append("|---|---|---|" + "---|" * len(header))
    for model, label in MODELS.items():
        for rows in (1, 100):
            for conns in connections:
                row = []
                for name in header:
                    run = runs.get((name, model, rows, conns))
                    row.append("" if run is None else f"{run['rps']:,.0f} ({run['p99_ms']:.1f})")
                lines.append(f"| {label} | {rows} | {conns} | " + " | ".join(row) + " |")
                ours = runs.get((SERVEKIT, model, rows, conns))
                ratios = []
                for name in header:
                    run = runs.get((name, model, rows, conns))
                    ratios.append(
                        "" if run is None or ours is None or name == SERVEKIT else f"{ours['rps'] / run['rps']:.2f}x"
                    )
                lines.append("| | | | " + " | ".join(ratios) + " |")
    lines += [
        "",
        "### Servers",
        "",
        "| server | cold start s | idle PSS MiB | processes | what |",
        "|---|---|---|---|---|",
    ]
    for name in header:
        s = servers[name]
        memory = s.get("idle_memory", {})
        lines.append(
            f"| {name} | {s.get('cold_start_s', 'failed')} | {memory.get('pss_mib', '')} | {memory.get('processes', '')} | "
            f"{s.get('note', '')}{' ERROR: ' + s['error'] if s.get('error') else ''} |"
        )
    errors = sum(r["errors"] for k, r in runs.items() if k[0] in header)
    lines += ["", f"Failed requests over all these runs: {errors}."]
    return "\n".join(lines) + "\n", met_all and measured == 4


def main() -> None:
    path = Path(sys.argv[1])
    text, met = report(json.loads(path.read_text()))
    (path.parent / "results-trees.md").write_text(text)
    print(text)
    print(f"trees target at c={TARGET_CONNECTIONS}: {'met' if met else 'missed'} in every cell")


if __name__ == "__main__":
    main()
