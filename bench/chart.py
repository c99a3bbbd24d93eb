"""Draw ``chart.png`` from ``results.json``: throughput and p99 per server and load.

    python bench/chart.py bench/results/results.json   (needs matplotlib: bench/.venvs/tools)

One column per scenario (model, rows, protocol); the top row is throughput,
the bottom row p99 latency (log scale), one line per server across the
connection levels (colour: servekit, MLServer, KServe, the plain-WSGI
ceilings), so the standing is visible at a glance.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

COLOURS = {"servekit": "#1b7837", "mlserver": "#2166ac", "kserve": "#b2182b", "ceiling": "#888888"}
STYLES = [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"), ("-", "v"), ("--", "x")]  # one per server of a family


def styles(servers: list[dict]) -> dict[str, tuple[str, str]]:
    """Colour by family, then line and marker by the server's place within its family."""
    counts: dict[str, int] = {}
    found = {}
    for server in servers:
        nth = counts.get(server["family"], 0)
        counts[server["family"]] = nth + 1
        found[server["server"]] = STYLES[nth % len(STYLES)]
    return found


def main(path: Path) -> None:
    results = json.loads(path.read_text())
    scenarios = sorted(
        {(r["model"], r["rows"], r["protocol"]) for s in results["servers"] for r in s["runs"]},
        key=lambda k: (k[2], k[0], k[1]),
    )
    fig, axes = plt.subplots(2, len(scenarios), figsize=(3.2 * len(scenarios), 6.5), squeeze=False)
    style = styles(results["servers"])
    for col, (model, rows, protocol) in enumerate(scenarios):
        top, bottom = axes[0][col], axes[1][col]
        for server in results["servers"]:
            runs = sorted(
                (r for r in server["runs"] if (r["model"], r["rows"], r["protocol"]) == (model, rows, protocol)),
                key=lambda r: r["connections"],
            )
            if not runs:
                continue
            family = server["family"]
            line, marker = style[server["server"]]
            conns = [str(r["connections"]) for r in runs]
            kw = {"color": COLOURS.get(family, "black"), "linestyle": line, "marker": marker, "label": server["server"]}
            top.plot(conns, [r["rps"] for r in runs], **kw)
            bottom.plot(conns, [r["p99_ms"] for r in runs], **kw)
        top.set_title(f"{model}, {rows} row{'s' if rows > 1 else ''}, {protocol.upper()}", fontsize=9)
        top.set_ylim(bottom=0)
        bottom.set_yscale("log")
        bottom.set_xlabel("connections")
        if col == 0:
            top.set_ylabel("requests/s")
            bottom.set_ylabel("p99 latency (ms, log)")
    handles, labels = [], []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(path.parent / "chart.png", dpi=110)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
