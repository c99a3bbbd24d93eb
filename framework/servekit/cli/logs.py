"""``servekit logs`` and ``servekit replay``: search the request log, and send logged requests again.

Both read records either straight from the store (``--store URL``, the server's
``--request-log-url``: ``sqlite:///FILE``, ``postgresql://...``) or from a running
server (``--server URL``, ``GET /v1/logs/requests``, an ``admin`` key with
``--api-key``), with the filters of :mod:`servekit.observability.log_search`.

``servekit replay --to URL`` sends each record's request (oldest first) to a
server at ``--rate`` requests a second and compares: the status, the answer
(JSON compared value by value, numbers within ``--tolerance``; a V2 answer's
``model_version`` and ``id`` are not compared, so another version can be
checked against the log), and latency (the log's server-side time against
what the replaying client measured, which adds the network).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from servekit.observability.log_search import query_from

COMMANDS = ("logs", "replay")
#: answer fields that name the answering version or echo the request, not the prediction
IGNORED_FIELDS = frozenset({"model_version", "id"})
TABLE_COLUMNS = ("createdAt", "status", "durationMs", "model", "version", "path", "requestLogId", "traceId")


def add_commands(sub: Any) -> None:
    logs = sub.add_parser("logs", help="search the request log by model, version, status, latency and time")
    _source_arguments(logs)
    logs.add_argument(
        "--format", choices=("table", "json"), default="table", help="a table, or one JSON object per line"
    )
    replay = sub.add_parser("replay", help="send logged requests to a server again and compare the answers")
    _source_arguments(replay)
    replay.add_argument("--to", required=True, metavar="URL", help="the server to send them to")
    replay.add_argument("--to-api-key", default=os.environ.get("SERVEKIT_REPLAY_API_KEY"), help="its API key")
    replay.add_argument("--rate", type=float, default=10.0, help="requests per second (0: as fast as answered)")
    replay.add_argument("--concurrency", type=int, default=8, help="requests in flight at most")
    replay.add_argument("--tolerance", type=float, default=1e-6, help="relative difference numbers may have")
    replay.add_argument("--json", action="store_true", help="print the report as JSON")
    replay.add_argument("--show", type=int, default=5, help="differences to print (default 5)")


def _source_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--store",
        metavar="URL",
        default=os.environ.get("SERVEKIT_REQUEST_LOG_URL"),
        help="the log store (the server's --request-log-url; default $SERVEKIT_REQUEST_LOG_URL)",
    )
    where.add_argument("--server", metavar="URL", help="a running server to ask (GET /v1/logs/requests)")
    parser.add_argument("--api-key", default=os.environ.get("SERVEKIT_API_KEY"), help="an admin key for --server")
    parser.add_argument("--model")
    parser.add_argument("--version", dest="model_version", help="the version that answered")
    parser.add_argument("--status", help="a status (503) or a class (5xx)")
    parser.add_argument("--min-ms", help="latency at least this many milliseconds")
    parser.add_argument("--max-ms", help="latency at most this many milliseconds")
    parser.add_argument("--since", help="Unix seconds, ISO 8601 (2026-12-01T10:00:00Z) or an age (15m, 2h, 1d)")
    parser.add_argument("--until", help="as --since")
    parser.add_argument("--limit", default="100", help="records at most (default 100)")
    parser.add_argument("--oldest-first", action="store_true", help="oldest first (replay always is)")


def run_command(args: argparse.Namespace) -> int:
    try:
        records = _records(args, oldest_first=args.command == "replay" or args.oldest_first)
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"servekit {args.command}: {exc}", file=sys.stderr)
        return 2
    if args.command == "logs":
        _print_records(records, args.format)
        return 0
    report = replay(
        records,
        args.to,
        rate=args.rate,
        concurrency=max(1, args.concurrency),
        tolerance=args.tolerance,
        api_key=args.to_api_key,
    )
    print(json.dumps(report.to_json(), indent=2) if args.json else report.text(args.show))
    return 0 if not report.differences and not report.failed else 1


# -- reading records --------------------------------------------------------------------------


def _filters(args: argparse.Namespace, oldest_first: bool) -> dict[str, str | None]:
    values = {
        "model": args.model,
        "version": args.model_version,
        "status": args.status,
        "min_ms": args.min_ms,
        "max_ms": args.max_ms,
        "since": args.since,
        "until": args.until,
        "limit": args.limit,
        "order": "oldest" if oldest_first else "newest",
    }
    return values


def _records(args: argparse.Namespace, *, oldest_first: bool) -> list[dict[str, Any]]:
    """Matching records as the HTTP route gives them (``RequestLog.to_json`` without predictions)."""
    filters = _filters(args, oldest_first)
    if args.server:
        text = urllib.parse.urlencode({k: v for k, v in filters.items() if v is not None})
        headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        status, body, _ = _http("GET", args.server.rstrip("/") + "/v1/logs/requests?" + text, None, headers)
        if status != 200:
            raise RuntimeError(f"{args.server} answered {status}: {body[:500].decode(errors='replace')}")
        return json.loads(body)["requests"]
    if not args.store:
        raise ValueError("say where the log is: --store URL (the server's --request-log-url) or --server URL")
    from servekit.observability.log_store import open_backend

    query = query_from(filters)  # checked before a store is opened
    records = open_backend(args.store).search(query)
    found = []
    for record in records:
        doc = record.to_json(predictions=False)
        doc["requestBody"] = record.request_body  # as received, for replay
        doc["responseBody"] = record.response_body
        found.append(doc)
    return found


def _print_records(records: list[dict[str, Any]], fmt: str) -> None:
    if fmt == "json":
        for record in records:
            record.pop("requestBody", None)
            record.pop("responseBody", None)
            print(json.dumps(record))
        return
    rows = [[_cell(r.get(c)) for c in TABLE_COLUMNS] for r in records]
    widths = [max([len(c)] + [len(row[i]) for row in rows]) for i, c in enumerate(TABLE_COLUMNS)]
    print("  ".join(c.ljust(w) for c, w in zip(TABLE_COLUMNS, widths)).rstrip())
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())
    print(f"({len(records)} record{'s' if len(records) != 1 else ''})")


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.1f}"
    return "" if value is None else str(value)


# -- replaying ----------------------------------------------------------------------------------


@dataclass
class Difference:
    request_log_id: str
    path: str
    what: str


@dataclass
class Report:
    sent: int = 0
    same: int = 0
    skipped: list[str] = field(default_factory=list)
    failed: list[Difference] = field(default_factory=list)
    differences: list[Difference] = field(default_factory=list)
    logged_ms: list[float] = field(default_factory=list)
    replayed_ms: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "same": self.same,
            "different": len(self.differences),
            "failed": len(self.failed),
            "skipped": len(self.skipped),
            "seconds": round(self.seconds, 3),
            "latency_ms": {
                "logged": {"p50": _percentile(self.logged_ms, 50), "p99": _percentile(self.logged_ms, 99)},
                "replayed": {"p50": _percentile(self.replayed_ms, 50), "p99": _percentile(self.replayed_ms, 99)},
            },
            "differences": [vars(d) for d in self.differences],
            "failures": [vars(d) for d in self.failed],
        }

    def text(self, show: int) -> str:
        doc = self.to_json()
        logged, replayed = doc["latency_ms"]["logged"], doc["latency_ms"]["replayed"]
        lines = [
            f"replayed {self.sent} request(s) in {self.seconds:.1f}s: {self.same} same, "
            f"{len(self.differences)} different, {len(self.failed)} failed, {len(self.skipped)} skipped",
            f"latency p50 {_ms(logged['p50'])} logged (server) -> {_ms(replayed['p50'])} replayed (client); "
            f"p99 {_ms(logged['p99'])} -> {_ms(replayed['p99'])}",
        ]
        for d in (self.failed + self.differences)[:show]:
            lines.append(f"  {d.request_log_id} {d.path}: {d.what}")
        return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1)], 3)


def replay(
    records: list[dict[str, Any]],
    target: str,
    *,
    rate: float = 10.0,
    concurrency: int = 8,
    tolerance: float = 1e-6,
    api_key: str | None = None,
) -> Report:
    """Send ``records`` (oldest first) to ``target`` at ``rate`` per second; compare each answer."""
    report = Report()
    lock = threading.Lock()
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    base = target.rstrip("/")

    def one(record: dict[str, Any]) -> None:
        began = time.perf_counter()
        body = _request_body(record)
        try:
            status, answer, _ = _http(record["method"], base + record["path"], body, headers)
        except OSError as exc:
            with lock:
                report.failed.append(Difference(record["requestLogId"], record["path"], f"no answer: {exc}"))
            return
        took = (time.perf_counter() - began) * 1000
        what = _compare(record, status, answer, tolerance)
        with lock:
            report.replayed_ms.append(took)
            report.logged_ms.append(float(record["durationMs"]))
            if what is None:
                report.same += 1
            else:
                report.differences.append(Difference(record["requestLogId"], record["path"], what))

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="servekit-replay") as pool:
        for record in records:
            if record.get("method") != "POST" or _request_body(record) is None:
                report.skipped.append(record.get("requestLogId", ""))
                continue
            if rate > 0:
                time.sleep(max(0.0, started + report.sent / rate - time.monotonic()))
            report.sent += 1
            pool.submit(one, record)
    report.seconds = time.monotonic() - started
    return report


def _request_body(record: dict[str, Any]) -> bytes | None:
    """The logged request as it was sent; ``None`` when the log could not keep it whole."""
    if "requestBody" in record:  # read from the store: the text as received
        text = record["requestBody"]
        return text.encode() if text else None
    body = record.get("request")  # from the HTTP route: parsed when it was JSON
    if body is None:
        return None
    return body.encode() if isinstance(body, str) else json.dumps(body).encode()


def _logged_answer(record: dict[str, Any]) -> Any:
    if "responseBody" in record:
        text = record["responseBody"]
        try:
            return json.loads(text) if text else None
        except ValueError:
            return text
    return record.get("response")


def _compare(record: dict[str, Any], status: int, answer: bytes, tolerance: float) -> str | None:
    """How the replayed answer differs from the logged one, ``None`` when it does not."""
    if status != record["status"]:
        return f"status {record['status']} -> {status}"
    logged = _logged_answer(record)
    if logged is None or (isinstance(logged, str) and logged.startswith("(a stream of")):
        return None  # the log kept no answer to compare (too large, or a stream)
    try:
        replayed: Any = json.loads(answer)
    except ValueError:
        replayed = answer.decode(errors="replace")
    return _differs(logged, replayed, tolerance, "")


def _differs(a: Any, b: Any, tolerance: float, where: str) -> str | None:
    """Where ``b`` first differs from ``a`` (a JSON path and both values), ``None`` when it does not."""
    if isinstance(a, dict) and isinstance(b, dict):
        return _differs_in_object(a, b, tolerance, where)
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{where or '/'}: {len(a)} items -> {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            if found := _differs(x, y, tolerance, f"{where}/{i}"):
                return found
        return None
    return _differs_in_value(a, b, tolerance, where)


def _differs_in_object(a: dict, b: dict, tolerance: float, where: str) -> str | None:
    for key in sorted(set(a) | set(b)):
        if key in IGNORED_FIELDS:
            continue
        if key not in a or key not in b:
            return f"{where}/{key}: {'added' if key not in a else 'missing'}"
        if found := _differs(a[key], b[key], tolerance, f"{where}/{key}"):
            return found
    return None


def _differs_in_value(a: Any, b: Any, tolerance: float, where: str) -> str | None:
    if _is_number(a) and _is_number(b):
        if math.isclose(a, b, rel_tol=tolerance, abs_tol=tolerance):
            return None
        return f"{where or '/'}: {a} -> {b}"
    if a != b or isinstance(a, bool) != isinstance(b, bool):  # True == 1 in Python, not in JSON
        return f"{where or '/'}: {json.dumps(a)[:80]} -> {json.dumps(b)[:80]}"
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _http(method: str, url: str, body: bytes | None, headers: dict[str, str]) -> tuple[int, bytes, dict[str, str]]:
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)
