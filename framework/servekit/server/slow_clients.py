"""gunicorn's ``gthread`` worker that gives no thread to a request whose headers are incomplete.

gunicorn hands a connection to a worker thread once its first bytes arrive and
then reads the request line and headers in that thread: a client sending a byte
a second holds the thread, and a few dozen such clients hold every thread, so
ordinary requests wait.  This worker looks at the bytes waiting on the socket
(without blocking) before it commits a thread: until the end
of the headers (a blank line) is there, the connection goes back to the
worker's poller (gunicorn's own deferral of a connection that has sent nothing
yet) and costs no thread.  The headers must be complete within
``--header-timeout`` seconds of the request's first byte, and the body within
``--body-timeout`` more, or the connection is closed.

Under TLS the bytes on the socket are encrypted and cannot be peeked at: there
the thread reads the handshake, line and headers itself, and the watchdog
(:mod:`servekit.server.watchdog`) shuts the socket for reading when they take longer
than ``--header-timeout``, so a slow client holds a thread that long at most.
The body has its own deadline (``--body-timeout``, :mod:`servekit.server.limits`).
"""

from __future__ import annotations

import re
import socket
import threading
import time
from typing import Any

from gunicorn.workers import gthread
from gunicorn.workers.gthread import ThreadWorker

from servekit.server.watchdog import WATCHDOG, shut_reading

#: ``--header-timeout`` and ``--body-timeout``, set in the master before the fork (:mod:`.gunicorn_app`).
HEADER_TIMEOUT = 10.0
BODY_TIMEOUT = 60.0
#: Most of a body gathered in the poller: a larger one is read by a thread (under ``--body-timeout``).
EARLY_BODY = 1024 * 1024
_CHUNKED_END = re.compile(rb"(?:^|\r\n)0(?:;[^\r\n]*)?\r\n(?:[^\r\n]+\r\n)*\r\n$")

#: gunicorn's "back to the poller" answer of ``handle`` (gunicorn 23+); without it, the watchdog alone.
_DEFER = getattr(gthread, "_DEFER", None)
_PEEK = 65536

_current = threading.local()


class HeaderTimeoutWorker(ThreadWorker):
    def handle(self, conn: Any) -> Any:
        if HEADER_TIMEOUT <= 0:
            return super().handle(conn)
        waiting = self._headers_waiting(conn)
        if waiting is not None:
            return waiting
        if getattr(conn, "servekit_headers_in", False):  # read in the poller: nothing left to wait for
            conn.servekit_headers_in = False
            return super().handle(conn)
        guard = WATCHDOG.watch(HEADER_TIMEOUT, lambda: shut_reading(conn.sock))
        _current.guard = guard
        try:
            return super().handle(conn)
        finally:
            _current.guard = None
            WATCHDOG.release(guard)

    def handle_request(self, req: Any, conn: Any) -> Any:
        conn.servekit_first_byte = None  # the next request on this connection starts its own clock
        guard = getattr(_current, "guard", None)
        if guard is not None:  # the headers are in: the body and the app have deadlines of their own
            WATCHDOG.release(guard)
            _current.guard = None
        return super().handle_request(req, conn)

    def _headers_waiting(self, conn: Any) -> Any:
        """``_DEFER`` while the request is incomplete, ``False`` (close) once it is late, else ``None``.

        The bytes that have arrived are read (without blocking) and kept on the
        connection, so the socket turns readable again only when more arrive;
        once the headers and the start of the body (all of it, up to 1 MiB) are
        here they go to gunicorn's parser, which reads them before the socket.
        """
        if _DEFER is None or self.cfg.is_ssl or getattr(conn, "is_http2", False):
            return None
        head: bytearray = getattr(conn, "servekit_head", None) or bytearray()
        ended = _read_available(conn.sock, head)
        if not head:
            return None if ended or conn.initialized else _DEFER  # nothing yet: wait in the poller
        if ended:
            return False  # the client left mid-request
        done, headers_in = _complete(head)
        if done:
            return self._hand_over(conn, head, headers_in)
        now = time.monotonic()
        first = getattr(conn, "servekit_first_byte", None) or now
        conn.servekit_head, conn.servekit_first_byte = head, first
        allowed = HEADER_TIMEOUT + (BODY_TIMEOUT if headers_in else 0.0)
        return False if now - first > allowed else _DEFER

    def _hand_over(self, conn: Any, head: bytearray, headers_in: bool) -> None:
        """The headers are here (or too many to wait for): give them to gunicorn's parser, in this thread."""
        conn.servekit_head = None
        conn.servekit_headers_in = headers_in
        conn.sock.setblocking(True)
        conn.init()  # plain TCP: makes the parser; nothing is read
        conn.parser.unreader.unread(bytes(head))


def _read_available(sock: Any, head: bytearray) -> bool:
    """Append what ``sock`` holds now to ``head`` (never blocking); whether the client ended."""
    while len(head) < _PEEK + EARLY_BODY:
        try:
            piece = sock.recv(_PEEK, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        except OSError:
            return True
        if not piece:
            return True
        head += piece
    return False


def _complete(head: bytearray) -> tuple[bool, bool]:
    """(ready for a thread, headers complete): the headers and the body, or its first ``EARLY_BODY`` bytes."""
    end = head.find(b"\r\n\r\n")
    if end < 0:
        return len(head) >= _PEEK, False  # headers too large to wait for: gunicorn refuses them
    length, chunked = _framing(bytes(head[:end]))
    body = len(head) - end - 4
    if length < 0:  # Expect: 100-continue: the client waits for gunicorn's go-ahead before its body
        return True, True
    if chunked:
        return body >= EARLY_BODY or bool(_CHUNKED_END.search(head[-4096:])), True
    return body >= min(length, EARLY_BODY), True


def _framing(headers: bytes) -> tuple[int, bool]:
    """The body's ``Content-Length`` (0 when absent or unreadable, -1 with ``Expect: 100-continue``)
    and whether it is chunked."""
    length, chunked, expect = 0, False, False
    for line in headers.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            try:
                length = max(0, int(value.strip()))
            except ValueError:
                return 0, False  # gunicorn answers it 400
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
        elif name == b"expect" and b"100-continue" in value.lower():
            expect = True
    return (-1 if expect else length), chunked
