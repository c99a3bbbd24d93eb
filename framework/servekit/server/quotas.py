"""Per-key quotas: requests and tokens per minute and concurrent requests, held across every worker.

A key in ``--api-key-file`` (or ``SERVEKIT_API_KEYS``) may carry
``requests_per_minute=``, ``tokens_per_minute=`` and ``max_concurrent=``
(:class:`servekit.server.auth.Quota`).  This WSGI layer, inside the limits and
outside the fast lane and Flask, admits each request of such a key or answers it
``429`` with ``Retry-After``.  The counts live in the server's shared store
(:mod:`servekit.dataplane.shared_store`), each admission one ``BEGIN IMMEDIATE``
transaction, so a bound holds exactly however the workers share the requests.

- requests per minute: a sliding window, the admitted requests of the last 60 s;
- tokens per minute: the prompt and completion tokens of the key's generations
  (OpenAI's completions and chat, Triton's generate) in the last 60 s, counted
  when each answer ends; a key past its budget is refused until enough of them
  leave the window (as OpenAI, which counts what a request used);
- concurrent requests: admitted and not yet answered to their last byte.

Every answer to a bounded key carries the IETF draft's ``RateLimit-Policy`` and
``RateLimit`` headers (draft-ietf-httpapi-ratelimit-headers), and on OpenAI's
routes OpenAI's ``x-ratelimit-limit-requests``, ``x-ratelimit-remaining-requests``,
``x-ratelimit-reset-requests`` and their ``-tokens`` twins.  gRPC calls are held by
the same bounds (``servekit.server.grpc_server``): ``RESOURCE_EXHAUSTED`` with a
``retry-after`` trailer.  ``/metrics`` counts
``servekit_quota_requests_total{key,outcome}`` and ``servekit_quota_tokens_total{key}``
under the key's ``name=`` (or ``sha256:`` and 8 hex digits of its hash), never the key.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from servekit.dataplane.shared_store import Store
from servekit.errors import TooManyRequests
from servekit.observability import generation_metrics
from servekit.routes import is_open_path, is_openai_path
from servekit.server.auth import ApiKey, Quota
from servekit.server.limits import error_response

WINDOW = 60.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS admitted (key TEXT NOT NULL, at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS admitted_key ON admitted (key, at);
CREATE TABLE IF NOT EXISTS used_tokens (key TEXT NOT NULL, at REAL NOT NULL, tokens INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS used_tokens_key ON used_tokens (key, at);
CREATE TABLE IF NOT EXISTS running (id INTEGER PRIMARY KEY, key TEXT NOT NULL, pid INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS running_key ON running (key);
"""


class Standing:
    """A key's counts at its admission: what its headers say."""

    def __init__(self, quota: Quota, requests: int, tokens: int, oldest_request: float, oldest_tokens: float):
        self.quota = quota
        self.requests, self.tokens = requests, tokens
        now = time.time()
        self.requests_reset = max(0.0, oldest_request + WINDOW - now) if requests else 0.0
        self.tokens_reset = max(0.0, oldest_tokens + WINDOW - now) if tokens else 0.0

    def headers(self, openai: bool) -> list[tuple[str, str]]:
        q = self.quota
        policies, now = [], []
        if q.requests_per_minute:
            left = max(0, q.requests_per_minute - self.requests)
            policies.append(f'"requests";q={q.requests_per_minute};w={int(WINDOW)}')
            now.append(f'"requests";r={left};t={math.ceil(self.requests_reset)}')
        if q.tokens_per_minute:
            left = max(0, q.tokens_per_minute - self.tokens)
            policies.append(f'"tokens";q={q.tokens_per_minute};w={int(WINDOW)}')
            now.append(f'"tokens";r={left};t={math.ceil(self.tokens_reset)}')
        headers = [("RateLimit-Policy", ", ".join(policies)), ("RateLimit", ", ".join(now))] if policies else []
        if openai:
            for kind, limit, used, reset in (
                ("requests", q.requests_per_minute, self.requests, self.requests_reset),
                ("tokens", q.tokens_per_minute, self.tokens, self.tokens_reset),
            ):
                if limit:
                    headers += [
                        (f"x-ratelimit-limit-{kind}", str(limit)),
                        (f"x-ratelimit-remaining-{kind}", str(max(0, limit - used))),
                        (f"x-ratelimit-reset-{kind}", _duration(reset)),
                    ]
        return headers


class Quotas:
    """The counts of every bounded key, in the server's shared store."""

    def __init__(self) -> None:
        self.store = Store("quotas.sqlite", _SCHEMA)

    def admit(self, quota: Quota) -> tuple[int | None, str, Standing]:
        """``(running row id, "", standing)`` when admitted; ``(None, what is exhausted, standing)`` otherwise."""
        now = time.time()
        key = quota.name
        with self.store.transaction() as tx:
            tx.execute("DELETE FROM admitted WHERE key = ? AND at <= ?", (key, now - WINDOW))
            tx.execute("DELETE FROM used_tokens WHERE key = ? AND at <= ?", (key, now - WINDOW))
            requests, oldest_request = tx.execute(
                "SELECT count(*), coalesce(min(at), 0) FROM admitted WHERE key = ?", (key,)
            ).fetchone()
            tokens, oldest_tokens = tx.execute(
                "SELECT coalesce(sum(tokens), 0), coalesce(min(at), 0) FROM used_tokens WHERE key = ?", (key,)
            ).fetchone()
            standing = Standing(quota, requests, tokens, oldest_request, oldest_tokens)
            if quota.requests_per_minute and requests >= quota.requests_per_minute:
                return None, "requests", standing
            if quota.tokens_per_minute and tokens >= quota.tokens_per_minute:
                return None, "tokens", standing
            if quota.max_concurrent and _running(tx, key) >= quota.max_concurrent:
                return None, "concurrency", standing
            tx.execute("INSERT INTO admitted VALUES (?, ?)", (key, now))
            row = tx.execute("INSERT INTO running (key, pid) VALUES (?, ?)", (key, os.getpid())).lastrowid
            standing.requests += 1
            if standing.requests == 1:
                standing.requests_reset = WINDOW
            return row, "", standing

    def done(self, quota: Quota, row: int | None, tokens: int) -> None:
        """Tokens used count; with ``row``, the answer's last byte went out and its place frees."""
        if row is None and not tokens:
            return
        with self.store.transaction() as tx:
            if row is not None:
                tx.execute("DELETE FROM running WHERE id = ?", (row,))
            if tokens:
                tx.execute("INSERT INTO used_tokens VALUES (?, ?, ?)", (quota.name, time.time(), tokens))


def _running(tx: Any, key: str) -> int:
    """Requests of ``key`` being answered, less those of a worker that died (its rows go)."""
    pids = [pid for (pid,) in tx.execute("SELECT DISTINCT pid FROM running WHERE key = ?", (key,))]
    for pid in pids:
        if pid != os.getpid() and not _alive(pid):
            tx.execute("DELETE FROM running WHERE pid = ?", (pid,))
    return int(tx.execute("SELECT count(*) FROM running WHERE key = ?", (key,)).fetchone()[0])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _duration(seconds: float) -> str:
    """OpenAI's reset times: ``1s``, ``6m0s``, ``120ms``."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    whole = math.ceil(seconds)
    minutes, rest = divmod(whole, 60)
    return f"{minutes}m{rest}s" if minutes else f"{rest}s"


_WHY = {
    "requests": "requests per minute",
    "tokens": "tokens per minute",
    "concurrency": "concurrent requests",
}


def refusal(quota: Quota, exhausted: str, standing: Standing) -> tuple[TooManyRequests, int]:
    """The 429 for a request refused by ``exhausted`` (counted), and its ``Retry-After`` seconds."""
    _metrics().requests.labels(quota.name, "limited_" + exhausted).inc()
    retry = standing.requests_reset if exhausted == "requests" else standing.tokens_reset
    error = TooManyRequests(f"API key {quota.name!r} is over its {_WHY[exhausted]}; retry later")
    return error, max(1, math.ceil(retry)) if exhausted != "concurrency" else 1


def admitted(quota: Quota) -> None:
    """Count an admitted request of ``quota``'s key (an HTTP request, a gRPC call)."""
    _metrics().requests.labels(quota.name, "admitted").inc()


class _Counters:
    def __init__(self) -> None:
        from prometheus_client import Counter

        self.requests = Counter(
            "servekit_quota_requests", "requests of a bounded API key, by outcome", ("key", "outcome")
        )
        self.tokens = Counter("servekit_quota_tokens", "tokens counted against a key's quota", ("key",))


_counters: _Counters | None = None
_counters_lock = threading.Lock()


def _metrics() -> _Counters:
    global _counters
    with _counters_lock:
        if _counters is None:
            _counters = _Counters()
    return _counters


class QuotaMiddleware:
    """Admits each request of a bounded key, or answers 429; frees its place when its answer ends."""

    def __init__(self, app: Callable, api_key: ApiKey) -> None:
        self.app = app
        self.api_key = api_key
        self.quotas = Quotas()

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        quota = None
        if not is_open_path(path, self.api_key.open_paths):
            quota = self.api_key.quota_of(environ.get("HTTP_AUTHORIZATION"))
        if quota is None:
            return self.app(environ, start_response)
        openai = is_openai_path(path)
        row, exhausted, standing = self.quotas.admit(quota)
        headers = standing.headers(openai)
        if row is None:
            error, seconds = refusal(quota, exhausted, standing)
            return error_response(start_response, error, path, [("Retry-After", str(seconds)), *headers])
        admitted(quota)
        charged = generation_metrics.count_tokens()

        def start(status: str, response_headers: list, exc_info: Any = None) -> Any:
            return start_response(status, [*response_headers, *headers], exc_info)

        try:
            body = self.app(environ, start)
        except BaseException:
            self._charge(quota, row, charged)
            raise
        # a whole answer's tokens count now, before the client can send its next request;
        # a stream's as it ends
        self._charge(quota, None, charged)
        return _Finishing(body, lambda: self._charge(quota, row, charged))

    def _charge(self, quota: Quota, row: int | None, charged: list[int]) -> None:
        charge(self.quotas, quota, row, charged)


def charge(quotas: Quotas, quota: Quota, row: int | None, charged: list[int]) -> None:
    """Count the tokens used so far (``charged``, then zeroed); with ``row``, the request ends."""
    tokens, charged[0] = charged[0], 0
    quotas.done(quota, row, tokens)
    if tokens:
        _metrics().tokens.labels(quota.name).inc(tokens)


class _Finishing:
    """A response body that runs ``finish`` once when the server closes it (after its last byte)."""

    def __init__(self, body: Iterable[bytes], finish: Callable[[], None]) -> None:
        self.body = body
        self._finish: Callable[[], None] | None = finish

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.body)

    def close(self) -> None:
        try:
            close = getattr(self.body, "close", None)
            if close is not None:
                close()
        finally:
            finish, self._finish = self._finish, None
            if finish is not None:
                finish()


def install(app: Any, api_key: ApiKey | None) -> None:
    """Wrap ``app.wsgi_app`` when there are keys (a key file may gain bounds while it serves)."""
    if api_key is not None:
        app.wsgi_app = QuotaMiddleware(app.wsgi_app, api_key)
