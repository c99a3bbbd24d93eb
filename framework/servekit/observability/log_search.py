"""Searching the request log: ``GET /v1/logs/requests`` (admin scope) and ``servekit logs``.

Both take the same filters (:func:`query_from`): ``model``, ``version``,
``status`` (``503`` or ``5xx``), ``min_ms``/``max_ms`` (latency, inclusive),
``since``/``until`` (Unix seconds, ISO 8601 such as ``2026-12-01T10:00:00Z``, or
an age such as ``15m``, ``2h``, ``1d``), ``limit`` (default 100) and ``order``
(``newest``, the default, or ``oldest``).  Records come back newest first,
without their predictions (``GET /v1/logs/requests/ID`` has them).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from datetime import datetime, timezone

from flask import Blueprint, Response, current_app, request

from servekit.errors import BadRequest, NotFound
from servekit.observability.log_store import Query

bp = Blueprint("log_search", __name__)

FILTERS = ("model", "version", "status", "min_ms", "max_ms", "since", "until", "limit", "order")
_AGE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def moment(text: str, now: float | None = None) -> float:
    """Unix seconds from seconds, ISO 8601 (UTC unless it says) or an age (``15m``: 15 minutes ago)."""
    text = text.strip()
    if (age := _AGE.match(text)) is not None:
        return (time.time() if now is None else now) - float(age[1]) * _UNIT[age[2]]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"not a time: {text!r} (Unix seconds, ISO 8601 like 2026-12-01T10:00:00Z, or an age like 15m)"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.timestamp()


def query_from(values: Mapping[str, str | None]) -> Query:
    """A :class:`Query` from text filters (a query string, the command line); ``ValueError`` names a bad one."""
    unknown = sorted(set(values) - set(FILTERS))
    if unknown:
        raise ValueError(f"unknown filter(s) {', '.join(unknown)}; known: {', '.join(FILTERS)}")

    def number(key: str) -> float | None:
        value = values.get(key)
        if value is None or value == "":
            return None
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"{key} must be a number of milliseconds, found {value!r}") from None

    order = values.get("order") or "newest"
    if order not in ("newest", "oldest"):
        raise ValueError(f"order must be newest or oldest, found {order!r}")
    limit = values.get("limit") or "100"
    if not limit.isdigit():
        raise ValueError(f"limit must be a whole number, found {limit!r}")
    since, until = values.get("since"), values.get("until")
    return Query(
        model=values.get("model") or None,
        version=values.get("version") or None,
        status=values.get("status") or None,
        min_ms=number("min_ms"),
        max_ms=number("max_ms"),
        since=moment(since) if since else None,
        until=moment(until) if until else None,
        limit=int(limit),
        oldest_first=order == "oldest",
    )


@bp.get("/v1/logs/requests")
def search_requests():
    store = current_app.extensions.get("servekit.request_log")
    if store is None:
        raise NotFound("request logging is off (--request-log-url off)")
    try:
        query = query_from(request.args.to_dict())
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    records = store.search(query)
    body = {"requests": [r.to_json(predictions=False) for r in records]}
    return Response(json.dumps(body), mimetype="application/json")
