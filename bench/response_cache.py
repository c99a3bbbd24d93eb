"""The response cache on the 100-tree forest: a hit, a cache-enabled miss and no cache, side by side.

    python bench/response_cache.py [REQUESTS] [ROWS]

Fits bench/models.py's ``rf`` (a 100-tree RandomForest on 20 features), serves it
twice from one two-worker ``servekit serve`` (``rf`` without a cache, ``rf_cached``
with ``cache: true``), and times V2 JSON requests of ROWS rows (default 100) end to end from one
kept-alive client, interleaved so that drift in the machine's load touches all
three alike: for each new request, ``rf`` (no cache) and ``rf_cached`` (a miss: the rows
are new), in turn first, then ``rf_cached`` again (a hit), then a readiness GET (the floor:
HTTP and the client alone).  Prints one JSON line: the median, mean and p99 milliseconds of each,
and the median over requests of each one's own ratios: the hit's speed-up over its miss and
its miss's cost over its uncached call.
"""

from __future__ import annotations

import http.client
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import joblib
import numpy as np
from servekit.testing import ServerProcess
from sklearn.ensemble import RandomForestClassifier


def fit(base: Path) -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, 20))
    y = (X[:, :5].sum(axis=1) > 0).astype(int) + (X[:, 5] > 1).astype(int)
    forest = RandomForestClassifier(n_estimators=100, random_state=0).fit(X, y)
    for name, settings in (("rf", ""), ("rf_cached", "cache: true\n")):
        (base / name / "1").mkdir(parents=True)
        joblib.dump(forest, base / name / "1" / "model.joblib")
        if settings:
            (base / name / "servekit.yaml").write_text(settings)


def timed(conn: http.client.HTTPConnection, path: str, body: bytes | None = None) -> tuple[float, bytes]:
    """Milliseconds of one request on the kept-alive connection, and the answer's body."""
    began = time.perf_counter()
    if body is None:
        conn.request("GET", path)
    else:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    answer = conn.getresponse()
    content = answer.read()
    spent = time.perf_counter() - began
    assert answer.status == 200, content[:300]
    return spent * 1000, content


def main(count: int, rows: int) -> dict[str, object]:
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory() as folder:
        base = Path(folder)
        fit(base)
        with ServerProcess(base, workers=2) as server:
            conn = http.client.HTTPConnection("127.0.0.1", server.http_port)
            times: dict[str, list[float]] = {"no_cache": [], "miss": [], "hit": [], "readiness": []}
            for i in range(count + 20):  # the first 20 warm up
                data = rng.normal(size=(rows, 20)).round(6).tolist()
                body = json.dumps(
                    {"inputs": [{"name": "input-0", "shape": [rows, 20], "datatype": "FP64", "data": data}]}
                ).encode()
                if i % 2:  # alternate which of the two goes first
                    plain, computed = timed(conn, "/v2/models/rf/infer", body)
                    miss, missed = timed(conn, "/v2/models/rf_cached/infer", body)
                else:
                    miss, missed = timed(conn, "/v2/models/rf_cached/infer", body)
                    plain, computed = timed(conn, "/v2/models/rf/infer", body)
                hit, cached = timed(conn, "/v2/models/rf_cached/infer", body)
                ready, _ = timed(conn, "/v2/health/ready")
                assert cached == missed and json.loads(cached)["outputs"] == json.loads(computed)["outputs"]
                if i >= 20:
                    times["no_cache"].append(plain)
                    times["miss"].append(miss)
                    times["hit"].append(hit)
                    times["readiness"].append(ready)
    result: dict[str, object] = {"requests": count, "rows": rows}
    for kind, values in times.items():
        result[f"{kind}_median_ms"] = round(statistics.median(values), 3)
        result[f"{kind}_mean_ms"] = round(statistics.fmean(values), 3)
        result[f"{kind}_p99_ms"] = round(statistics.quantiles(values, n=100)[98], 3)
    # each request's own ratios (its miss, its hit and its uncached call ran back to back), then
    # their median: the machine's drift between requests falls out of the pair
    pairs = list(zip(times["no_cache"], times["miss"], times["hit"], strict=True))
    result["hit_speedup"] = round(statistics.median(miss / hit for _, miss, hit in pairs), 2)
    result["miss_overhead_pct"] = round(100 * (statistics.median(miss / plain for plain, miss, _ in pairs) - 1), 2)
    return result


if __name__ == "__main__":
    arguments = [int(a) for a in sys.argv[1:3]]
    print(json.dumps(main(*arguments, *[300, 100][len(arguments) :])))
