"""bench/results/grpc.json as Markdown: the cells side by side and the targets of the gRPC issue.

python bench/grpc_report.py bench/results/grpc.json     # writes bench/results/grpc.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def cells(result: dict) -> dict[tuple, dict]:
    return {(r["wire"], r["protocol"], r["model"], r["rows"], r["streams"]): r for r in result.get("runs", [])}


def rounds_text(cell: dict) -> str:
    """Every round's throughput, with its connection split where the kernel made one."""
    parts = []
    for r in cell.get("rounds", []):
        split = "/".join(map(str, r.get("connections_per_process") or []))
        parts.append(f"{r['rps']:,.0f}" + (f" ({split})" if split else ""))
    return f" [rounds {', '.join(parts)}]" if parts else ""


def fmt(cell: dict | None) -> str:
    if not cell:
        return "-"
    errors = f", **{cell['errors']} errors**" if cell["errors"] else ""
    return f"{cell['rps']:,.0f} ({cell['p99_ms']:.1f} ms, {cell['cpu_us_per_request']:.0f} us){errors}"


def table(servers: list[dict]) -> list[str]:
    keys: list[tuple] = []
    for server in servers:
        for key in cells(server):
            if key not in keys:
                keys.append(key)
    names = [s["server"] for s in servers]
    lines = ["| wire | request | model | rows | streams | " + " | ".join(names) + " |"]
    lines.append("|" + "---|" * (5 + len(names)))
    by_server = [cells(s) for s in servers]
    for key in keys:
        wire, protocol, model, rows, streams = key
        label = {"v2": "V2 ModelInfer", "tf": "TF Predict", "v2-json": "V2 JSON"}[protocol]
        row = [wire, label, model, str(rows), str(streams)] + [fmt(found.get(key)) for found in by_server]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def targets(results: dict) -> list[str]:
    servers = {s["server"]: cells(s) for s in results["servers"] if s.get("runs")}
    peers = {n: c for n, c in servers.items() if not n.startswith("servekit")}
    out = ["| target | met | measured |", "|---|---|---|"]

    def row(name: str, met: bool | None, text: str) -> None:
        out.append(f"| {name} | {'yes' if met else ('**no**' if met is False else 'n/a')} | {text} |")

    ours = servers.get("servekit", {})
    for model in ("iris", "rf"):
        for streams in (8, 64):
            key = ("grpc", "v2", model, 1, streams)
            mine = ours.get(key)
            best = max(((n, c[key]) for n, c in peers.items() if key in c), key=lambda p: p[1]["rps"], default=None)
            if mine and best:
                ratio = mine["rps"] / best[1]["rps"]
                met = ratio >= 2 and mine["p99_ms"] <= best[1]["p99_ms"]
                row(
                    f"V2 gRPC {model} 1 row, {streams} streams: servekit >= 2x best peer gRPC, p99 no worse",
                    met,
                    f"{mine['rps']:,.0f}/s = **{ratio:.2f}x** {best[0]} ({best[1]['rps']:,.0f}/s); p99 {mine['p99_ms']} vs {best[1]['p99_ms']} ms"
                    f"{rounds_text(mine)}",
                )
            for name in ("servekit", "servekit-granian"):
                found = servers.get(name, {})
                grpc_cell, http_cell = found.get(key), found.get(("http", "v2-json", model, 1, streams))
                if grpc_cell and http_cell:
                    ratio = grpc_cell["rps"] / http_cell["rps"]
                    row(
                        f"{name} {model} 1 row, {streams} streams: gRPC >= V2 HTTP on the same engine",
                        ratio >= 1,
                        f"gRPC {grpc_cell['rps']:,.0f}/s vs HTTP {http_cell['rps']:,.0f}/s = **{ratio:.2f}x**; "
                        f"CPU {grpc_cell['cpu_us_per_request']:.0f} vs {http_cell['cpu_us_per_request']:.0f} us per request; "
                        f"gRPC{rounds_text(grpc_cell)}, HTTP{rounds_text(http_cell)}",
                    )
    for model in ("iris", "rf"):
        for rows in (1, 100):
            for streams in (8, 64):
                v2 = ours.get(("grpc", "v2", model, rows, streams))
                tf = ours.get(("grpc", "tf", model, rows, streams))
                if v2 and tf:
                    ratio = tf["rps"] / v2["rps"]
                    row(
                        f"TF Predict within 10% of V2 ModelInfer: {model} {rows} row(s), {streams} streams",
                        ratio >= 0.9,
                        f"{tf['rps']:,.0f} vs {v2['rps']:,.0f}/s = {ratio:.2f}x; TF{rounds_text(tf)}, V2{rounds_text(v2)}",
                    )
    big = results.get("big_tensor", {})
    if "grpc_speedup" in big:
        row(
            "1M FP32 elements: gRPC raw contents >= 5x V2 JSON end to end",
            big["grpc_speedup"] >= 5,
            f"JSON {big['json_s']} s, gRPC {big['grpc_s']} s: {big['grpc_speedup']}x (binary HTTP extension {big['binary_s']} s: {big['speedup']}x)",
        )
    return out


def profile_lines(result: dict) -> list[str]:
    found = result.get("profile")
    if not found or "error" in found:
        return [f"(no profile: {found.get('error') if found else 'not taken'})"]
    lines = [
        f"`py-spy record --gil` on worker {found['pid']}, {found['seconds']} s at {found['rate_hz']} Hz: "
        f"{found['samples']} samples with the GIL held.",
        "",
        "| own samples | % | function |",
        "|---|---|---|",
    ]
    lines += [f"| {n} | {pct} | `{frame}` |" for frame, n, pct in found["own"][:10]]
    return lines


def render(results: dict) -> str:
    servers = results["servers"]
    lines = [
        "# gRPC: servekit beside MLServer's and KServe's gRPC",
        "",
        f"Run {results['started']} on {results['machine']['cpus']} CPUs (load average at start "
        f"{results['machine']['load_average']:.2f}, at the end {results.get('load_average_at_end', 0):.2f}); "
        f"h2load and wrk on loopback sharing the cores, {results['duration_s']} s per round after a 1 s warm-up, "
        f"{results.get('rounds', 1)} interleaved round(s) per cell. "
        "Each cell: the median round's requests/s (p99, server CPU time per request).",
        "",
        "## Targets",
        "",
        *targets(results),
        "",
        "## Every cell",
        "",
        *table([s for s in servers if s.get("runs")]),
        "",
    ]
    for server in servers:
        if server.get("error"):
            lines.append(f"- {server['server']}: FAILED: {server['error']}")
        if server.get("streaming"):
            parts = [
                f"{name} {v['per_s']:,.0f} answers/s ({v['errors']} errors)" for name, v in server["streaming"].items()
            ]
            lines.append(
                f"- {server['server']} streaming, {server['streaming']['ModelStreamInfer']['messages']} messages on one stream: "
                + "; ".join(parts)
            )
    lines.append("")
    for server in servers:
        if "profile" in server:
            lines += [
                f"## Profile: {server['server']}, iris 1 row V2 ModelInfer, 64 streams",
                "",
                *profile_lines(server),
                "",
            ]
    lines += ["## Servers", ""] + [f"- **{s['server']}**: {s['note']}" for s in servers]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    source = Path(sys.argv[1])
    results = json.loads(source.read_text())
    (source.parent / "grpc.md").write_text(render(results))
    print(source.parent / "grpc.md")
