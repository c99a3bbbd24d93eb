"""Turn ``results.json`` into ``results.md``: each target of the performance issues met or missed, then the tables.

    python bench/report.py bench/results/results.json

The targets come from two issues:

- **Performance I** (the serving engine): iris 1 row against the best peer on
  V2 and on V1 (KServe's V1: MLServer has none), 100-row requests against each
  peer, the share of each engine's plain-WSGI ceiling servekit keeps, and the
  default configuration's cold start and idle memory;
- **Performance II** (model processes): the RandomForest with batching on
  against MLServer's adaptive batching and against servekit with batching off,
  the mean batch size, and what a model host costs a cheap model.

"The best peer" is the peer configuration with the highest throughput in that
cell; its p99 is the one servekit's must not exceed.  A target whose cells were
not measured reads ``n/a``; a row that only reports a number reads ``measured``.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PEERS = ("mlserver", "kserve")
DEFAULTS, GRANIAN = "servekit", "servekit-granian"
CEILINGS = {DEFAULTS: "wsgi-gunicorn", GRANIAN: "wsgi-granian"}
HOST_PAIRS = (("servekit-host", "servekit-batch"), ("servekit-granian-host", "servekit-granian-batch"))
COLD_START_S, IDLE_PSS_MIB, SLACK = 1.6, 200.0, 1.10

Key = tuple  # (model, rows, protocol, connections)


@dataclass
class Target:
    issue: str
    text: str
    met: bool | None  # None: not measured
    measured: str
    informational: bool = False

    @property
    def verdict(self) -> str:
        if self.met is None:
            return "n/a"
        if self.informational:
            return "measured"
        return "yes" if self.met else "**no**"


class Results:
    """results.json with look-ups by server, family and cell."""

    def __init__(self, doc: dict):
        self.doc = doc
        self.servers = {s["server"]: s for s in doc["servers"]}
        self.family = {s["server"]: s["family"] for s in doc["servers"]}
        self.runs: dict[tuple, dict] = {}
        for s in doc["servers"]:
            for r in s["runs"]:
                self.runs[(s["server"], r["model"], r["rows"], r["protocol"], r["connections"])] = r

    def names(self, *families: str) -> list[str]:
        return [n for n, f in self.family.items() if f in families]

    def batched(self) -> list[str]:
        return [n for n in self.names("servekit") if n.endswith(("-batch", "-host"))]

    def run(self, name: str, key: Key) -> dict:
        return self.runs[(name, *key)]

    def best(self, names: list[str], key: Key) -> tuple[str, dict] | None:
        found = [(n, self.runs[(n, *key)]) for n in names if (n, *key) in self.runs]
        return max(found, key=lambda item: item[1]["rps"]) if found else None


def cell(key: Key) -> str:
    model, rows, protocol, conns = key
    return f"{model} {rows} row{'s' if rows > 1 else ''} {protocol.upper()} c={conns}"


def rps(run: dict) -> str:
    return f"{run['rps']:,.0f}/s"


# ---------------------------------------------------------------------------
# Performance I: the serving engine
# ---------------------------------------------------------------------------


def against_best_peer(res: Results, name: str, factor: float, key: Key) -> tuple[bool, str]:
    ours = res.run(name, key)
    peer_name, peer = res.best(res.names(*PEERS), key)
    ratio = ours["rps"] / peer["rps"]
    ok = ratio >= factor and ours["p99_ms"] <= peer["p99_ms"]
    return ok, (
        f"{rps(ours)} = **{ratio:.2f}x** {peer_name} ({rps(peer)}); p99 {ours['p99_ms']:.1f} vs {peer['p99_ms']:.1f} ms"
    )


def hundred_rows(res: Results, name: str) -> tuple[bool, str] | None:
    """Every 100-row cell ``name`` ran, against MLServer's best and KServe's best there."""
    ratios = []
    for (server, model, rows, protocol, conns), run in res.runs.items():
        if server != name or rows != 100:
            continue
        key = (model, rows, protocol, conns)
        for family in PEERS:
            peer = res.best(res.names(family), key)
            if peer:
                ratios.append((run["rps"] / peer[1]["rps"], f"{cell(key)} vs {peer[0]}"))
    if not ratios:
        return None
    worst, best = min(ratios), max(ratios)
    passed = sum(r >= 1.5 for r, _ in ratios)
    return worst[0] >= 1.5, (
        f"{passed} of {len(ratios)} comparisons >= 1.5x; lowest **{worst[0]:.2f}x** "
        f"({worst[1]}), highest {best[0]:.2f}x ({best[1]})"
    )


def ceiling_share(res: Results, name: str) -> tuple[bool, str] | None:
    """servekit / the plain WSGI callable on the same engine, over every cell both ran."""
    ceiling = CEILINGS[name]
    ratios = {}
    for (server, *key), run in res.runs.items():
        other = res.runs.get((ceiling, *key))
        if server == name and other and other["rps"]:
            ratios[tuple(key)] = run["rps"] / other["rps"]
    if not ratios:
        return None
    low = min(ratios, key=ratios.get)
    high = max(ratios, key=ratios.get)
    headline = [f"c={k[3]} {ratios[k]:.2f}x" for k in sorted(ratios) if k[:3] == ("iris", 1, "v2")]
    return ratios[low] >= 0.6, (
        f"iris 1 row V2: {', '.join(headline)}; over {len(ratios)} cells lowest **{ratios[low]:.2f}x** "
        f"({cell(low)}, {ratios[low] - 0.6:+.2f} against the 0.6x bar), median "
        f"{statistics.median(ratios.values()):.2f}x, highest {ratios[high]:.2f}x ({cell(high)})"
    )


def start_and_memory(res: Results) -> list[Target]:
    s = res.servers.get(DEFAULTS)
    if not s or "error" in s:
        return [Target("I", "cold start to ready", None, "not measured"), Target("I", "idle PSS", None, "not measured")]
    peers = ", ".join(
        f"{n} {res.servers[n]['cold_start_s']} s" for n in res.names(*PEERS) if "cold_start_s" in res.servers[n]
    )
    pss = s["idle_memory"]["pss_mib"]
    peer_pss = ", ".join(
        f"{n} {res.servers[n]['idle_memory']['pss_mib']} MiB"
        for n in res.names(*PEERS)
        if "idle_memory" in res.servers[n]
    )
    return [
        Target(
            "I",
            f"servekit defaults: cold start to ready <= {COLD_START_S} s + 10% ({COLD_START_S * SLACK:.2f} s)",
            s["cold_start_s"] <= COLD_START_S * SLACK,
            f"{s['cold_start_s']} s (peers: {peers})",
        ),
        Target(
            "I",
            f"servekit defaults: idle PSS <= {IDLE_PSS_MIB:.0f} MiB + 10% ({IDLE_PSS_MIB * SLACK:.0f} MiB)",
            pss <= IDLE_PSS_MIB * SLACK,
            f"{pss} MiB, {s['idle_memory']['processes']} processes (peers: {peer_pss})",
        ),
    ]


def performance_one(res: Results, check: Callable[..., Target]) -> list[Target]:
    out = []
    for name, factor, label in ((DEFAULTS, 1.5, "servekit defaults"), (GRANIAN, 3.0, "servekit granian")):
        for protocol, against in (("v2", "best peer"), ("v1", "KServe's best V1")):
            for conns in (8, 64):
                key = ("iris", 1, protocol, conns)
                out.append(
                    check(
                        "I",
                        f"iris 1 row {protocol.upper()} JSON c={conns}: {label} >= {factor}x {against}, p99 no worse",
                        lambda n=name, f=factor, k=key: against_best_peer(res, n, f, k),
                    )
                )
    for name, label in ((DEFAULTS, "servekit defaults"), (GRANIAN, "servekit granian")):
        out.append(
            check(
                "I",
                f"100-row requests, every cell: {label} >= 1.5x MLServer's best and KServe's best",
                lambda n=name: hundred_rows(res, n),
            )
        )
    for name, label in (
        (DEFAULTS, "servekit defaults >= 0.6x plain WSGI on gunicorn"),
        (GRANIAN, "servekit granian >= 0.6x plain WSGI on granian"),
    ):
        out.append(check("I", f"{label} (every cell)", lambda n=name: ceiling_share(res, n)))
    return out + start_and_memory(res)


# ---------------------------------------------------------------------------
# Performance II: model processes
# ---------------------------------------------------------------------------


def batch_note(run: dict) -> str:
    if "mean_host_batch" in run:
        return f"mean batch {run.get('mean_batch', '?')} (in the host {run['mean_host_batch']})"
    return f"mean batch {run['mean_batch']}" if "mean_batch" in run else "mean batch not read"


def rf_against_mlserver(res: Results, factor: float, conns: int) -> tuple[bool, str]:
    key = ("rf", 1, "v2", conns)
    peer = res.run("mlserver-batch", key)
    name, ours = res.best(res.batched(), key)
    each = "; ".join(
        f"{n} {rps(r)} {r['rps'] / peer['rps']:.2f}x p99 {r['p99_ms']:.0f} ms"
        for n in res.batched()
        if (r := res.runs.get((n, *key)))
    )
    ok = ours["rps"] >= factor * peer["rps"] and ours["p99_ms"] <= peer["p99_ms"]
    return ok, (
        f"best {name} {rps(ours)} = **{ours['rps'] / peer['rps']:.2f}x** mlserver-batch ({rps(peer)}); "
        f"p99 {ours['p99_ms']:.1f} vs {peer['p99_ms']:.1f} ms. Each: {each}"
    )


def batching_on_off(res: Results) -> tuple[bool, str]:
    key = ("rf", 1, "v2", 64)
    off = res.run(DEFAULTS, key)
    name, on = res.best(res.batched(), key)
    each = "; ".join(
        f"{n} {r['rps'] / off['rps']:.2f}x, {batch_note(r)}" for n in res.batched() if (r := res.runs.get((n, *key)))
    )
    return on["rps"] >= 5 * off["rps"], (
        f"best {name} {rps(on)} vs servekit {rps(off)} = "
        f"**{on['rps'] / off['rps']:.2f}x**, {batch_note(on)}. Each: {each}"
    )


def host_cost(res: Results, host: str, worker: str) -> tuple[bool, str]:
    costs, parts = [], []
    for conns in (8, 64):
        key = ("iris", 1, "v2", conns)
        h, w = res.run(host, key), res.run(worker, key)
        cost = 1 - h["rps"] / w["rps"]
        costs.append(cost)
        parts.append(
            f"c={conns}: {rps(h)} vs {rps(w)} = **{cost:+.0%}** (p99 {h['p99_ms']:.1f} vs {w['p99_ms']:.1f} ms)"
        )
        default = res.runs.get((DEFAULTS if "granian" not in host else GRANIAN, *key))
        if default:
            parts[-1] += f", {1 - h['rps'] / default['rps']:+.0%} against no batching"
    return max(costs) <= 0.15, "; ".join(parts)


def performance_two(res: Results, check: Callable[..., Target]) -> list[Target]:
    out = [
        check(
            "II",
            "RandomForest 1 row V2 c=64, batching on (servekit's best batched config): >= 2x MLServer "
            "adaptive batching, p99 no worse",
            lambda: rf_against_mlserver(res, 2.0, 64),
        ),
        check(
            "II",
            "RandomForest 1 row V2 c=8, batching on: >= 1.5x MLServer adaptive batching, p99 no worse",
            lambda: rf_against_mlserver(res, 1.5, 8),
        ),
        check(
            "II",
            "RandomForest 1 row V2 c=64: batching on >= 5x batching off (servekit defaults)",
            lambda: batching_on_off(res),
        ),
    ]
    for host, worker in HOST_PAIRS:
        out.append(
            check(
                "II",
                f"iris 1 row V2 through a model host costs <= 15% throughput: {host} vs {worker} "
                "(same flags, in-worker placement)",
                lambda h=host, w=worker: host_cost(res, h, w),
            )
        )
    return out


# ---------------------------------------------------------------------------
# Other measurements
# ---------------------------------------------------------------------------


def others(res: Results, check: Callable[..., Target]) -> list[Target]:
    def big() -> tuple[bool, str] | None:
        b = res.doc.get("big_tensor") or {}
        if "speedup" not in b:
            return None
        return b["speedup"] >= 5, f"JSON {b['json_s']} s, binary {b['binary_s']} s: {b['speedup']}x"

    def term() -> tuple[bool, str]:
        s = res.servers[DEFAULTS]
        exit_s = s["sigterm_exit_s"]
        return exit_s is not None and exit_s < 2, "killed" if exit_s is None else f"{exit_s:.2f} s"

    def batches() -> tuple[bool, str] | None:
        parts = [
            f"{n} {r['model']} c={r['connections']}: {batch_note(r)}"
            for n in res.batched()
            for r in res.servers[n]["runs"]
            if "mean_batch" in r
        ]
        return (True, "; ".join(parts)) if parts else None

    rows = [
        check("other", "1M FP32 elements: binary extension >= 5x faster than JSON end to end", big),
        check("other", "servekit defaults: SIGTERM with no load exits in < 2 s", term),
    ]
    mean = check("other", "mean batch size (rows per predict call, from /metrics around each run)", batches)
    mean.informational = True
    return [mean, *rows]


def targets(res: Results) -> list[Target]:
    def check(issue: str, text: str, test: Callable[[], tuple[bool, str] | None]) -> Target:
        try:
            got = test()
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            got = None  # a server or cell missing from this run
        return Target(issue, text, None, "not measured") if got is None else Target(issue, text, got[0], got[1])

    return performance_one(res, check) + performance_two(res, check) + others(res, check)


# ---------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------


def target_tables(res: Results) -> list[str]:
    titles = {
        "I": "Performance I: the serving engine",
        "II": "Performance II: model processes",
        "other": "Other measurements",
    }
    found = targets(res)
    met = sum(t.met is True for t in found if not t.informational and t.issue != "other")
    counted = sum(t.met is not None for t in found if not t.informational and t.issue != "other")
    lines = [f"{met} of {counted} measured targets of the two issues met.", ""]
    for issue, title in titles.items():
        lines += [f"### {title}", "", "| target | met | measured |", "|---|---|---|"]
        lines += [f"| {t.text} | {t.verdict} | {t.measured} |" for t in found if t.issue == issue]
        lines.append("")
    return lines


def profile_section(res: Results) -> list[str]:
    p = res.doc.get("profile")
    if not p:
        return []
    where = f"{p.get('server')}, {cell((p.get('model'), p.get('rows'), p.get('protocol'), p.get('connections')))}"
    lines = [f"## Profile of one servekit worker ({where})", ""]
    if "error" in p:
        return lines + [f"py-spy could not profile the worker: {p['error']}", ""]
    ticks = p["seconds"] * p.get("rate_hz", 100)
    lines += [
        f"`py-spy record --gil`, {p['seconds']} s at {p.get('rate_hz', 100)} Hz on worker pid {p['pid']}: "
        f"{p['samples']} of {ticks} ticks found a thread holding the GIL ({p['samples'] / ticks:.0%}); the "
        "rest the worker waited for a core or for I/O. Own time is the innermost frame; percentages are of "
        "the GIL samples.",
        "",
        "| own samples | % | function |",
        "|---|---|---|",
    ]
    lines += [f"| {n} | {pct} | `{frame}` |" for frame, n, pct in p["own"]]
    lines += [
        "",
        "Cumulative time in servekit's own functions (on the stack anywhere):",
        "",
        "| samples | % | function |",
        "|---|---|---|",
    ]
    lines += [f"| {n} | {pct} | `{frame}` |" for frame, n, pct in p["servekit_cumulative"]]
    return lines + [""]


def scenario_table(doc: dict, res: Results) -> list[str]:
    servers = [s["server"] for s in doc["servers"] if s["runs"]]
    scenarios = sorted({k[1:] for k in res.runs}, key=lambda k: (k[2], k[0], k[1], k[3]))
    lines = [
        "| protocol | model | rows | conns | " + " | ".join(servers) + " |",
        "|---|---|---|---|" + "---|" * len(servers),
    ]
    for model, rows, protocol, conns in scenarios:
        cells = []
        for name in servers:
            run = res.runs.get((name, model, rows, protocol, conns))
            cells.append(
                ""
                if run is None
                else f"{run['rps']:,.0f}/s<br>p50 {run['p50_ms']:.1f} p99 {run['p99_ms']:.1f} ms"
                + (f"<br>batch {run['mean_batch']}" if "mean_batch" in run else "")
                + (f"<br>**{run['errors']} errors**" if run["errors"] else "")
            )
        lines.append(f"| {protocol.upper()} | {model} | {rows} | {conns} | " + " | ".join(cells) + " |")
    return lines


def ratio_table(res: Results) -> list[str]:
    """Each servekit throughput over each peer's and over its engine's ceiling, per cell both ran."""
    refs = res.names(*PEERS) + res.names("ceiling")
    lines = [
        "| protocol | model | rows | conns | servekit config | " + " | ".join(f"÷ {p}" for p in refs) + " |",
        "|---|---|---|---|---|" + "---|" * len(refs),
    ]
    ours = set(res.names("servekit"))
    for (name, model, rows, protocol, conns), run in sorted(
        res.runs.items(), key=lambda kv: (kv[0][3], kv[0][1], kv[0][2], kv[0][4])
    ):
        if name not in ours:
            continue
        cells = []
        for peer in refs:
            other = res.runs.get((peer, model, rows, protocol, conns))
            cells.append("" if other is None or not other["rps"] else f"{run['rps'] / other['rps']:.2f}x")
        if any(cells):
            lines.append(f"| {protocol.upper()} | {model} | {rows} | {conns} | {name} | " + " | ".join(cells) + " |")
    return lines


def process_table(doc: dict) -> list[str]:
    lines = [
        "| server | cold start (s) | idle PSS (MiB) | idle RSS (MiB) | processes | SIGTERM exit (s) | "
        "time in the run (s) | notes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in doc["servers"]:
        if "error" in s:
            lines.append(f"| {s['server']} | failed: {' '.join(s['error'].split())[:160]} | | | | | | |")
            continue
        mem = s.get("idle_memory", {})
        exit_s = s.get("sigterm_exit_s")
        killed = f"killed after {s.get('sigterm_timeout_s', 20):g}"
        lines.append(
            f"| {s['server']} | {s.get('cold_start_s', '')} | {mem.get('pss_mib', '')} | {mem.get('rss_mib', '')} | "
            f"{mem.get('processes', '')} | {killed if exit_s is None else round(exit_s, 2)} | "
            f"{s.get('elapsed_s', '')} | {s.get('note', '')} |"
        )
    return lines


def render(doc: dict) -> str:
    res = Results(doc)
    conns = ", ".join(str(c) for c in doc.get("connections", [8, 64]))
    lines = [
        "# servekit vs MLServer vs KServe, and the plain-WSGI ceilings",
        "",
        "![throughput and p99 per server and load](chart.png)",
        "",
        f"Run {doc['started']} on {doc['machine']['cpus']} CPUs (load average at start "
        f"{doc['machine']['load_average']:.2f}); wrk on loopback sharing the cores, {conns} connections, "
        f"{doc['duration_s']} s per run after a 1 s warm-up"
        + f", {sum(s.get('elapsed_s', 0) for s in doc['servers']):.0f} s of servers running"
        + ". Throughput in requests/s, latency in milliseconds.",
        "",
        "## Targets",
        "",
        *target_tables(res),
        *profile_section(res),
        "## Processes",
        "",
        *process_table(doc),
        "",
    ]
    big = doc.get("big_tensor")
    if big:
        lines += [
            "## 1M-element FP32 tensor (servekit echo model, client encode + round trip + decode)",
            "",
            f"`{json.dumps(big)}`",
            "",
        ]
    lines += [
        "## Throughput and latency",
        "",
        *scenario_table(doc, res),
        "",
        "## servekit throughput as a ratio to each peer and ceiling",
        "",
        *ratio_table(res),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    path = Path(sys.argv[1])
    text = render(json.loads(path.read_text()))
    (path.parent / "results.md").write_text(text)
    print(text)
