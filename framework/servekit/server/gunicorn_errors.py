"""gunicorn's own answers to requests it refuses before the app sees them, as JSON.

gunicorn answers a malformed request (a negative or unreadable
``Content-Length``, a bad request line, too many headers) itself, with an HTML
page; every other error servekit sends is ``{"error": message}``.  gunicorn
has no setting for that page, so each worker replaces the one function that
writes it (``gunicorn.util.write_error``, which every worker class calls):
same status and reason, the message as JSON.
"""

from __future__ import annotations

from typing import Any

import orjson
from gunicorn import util


def write_json_error(sock: Any, status_int: int, reason: str, mesg: str) -> None:
    body = orjson.dumps({"error": mesg or reason})
    head = (
        f"HTTP/1.1 {status_int} {reason}\r\n"
        "Connection: close\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    util.write_nonblock(sock, head.encode("latin-1") + body)


def install() -> None:
    """In a worker: gunicorn's error answers are JSON from now on."""
    util.write_error = write_json_error
