"""gunicorn's ``gthread`` worker with a deadline on each request's TLS handshake, line and headers.

gunicorn hands a connection to a worker thread once its first bytes arrive and
then reads the request line and headers in that thread without a deadline: a
client sending a byte a second holds the thread for as long as it likes, and a
few dozen such clients hold every thread.  Here each request's handshake, line
and headers must arrive within ``--header-timeout`` seconds: the watchdog
(:mod:`servekit.watchdog`) shuts the socket for reading when they do not, the
read fails and gunicorn closes the connection.  The body has its own deadline
(``--body-timeout``, :mod:`servekit.limits`).
"""

from __future__ import annotations

import threading
from typing import Any

from gunicorn.workers.gthread import ThreadWorker

from ..watchdog import WATCHDOG, shut_reading

#: ``--header-timeout``, set in the master before the fork (:mod:`.gunicorn_app`).
HEADER_TIMEOUT = 10.0

_current = threading.local()


class HeaderTimeoutWorker(ThreadWorker):
    def handle(self, conn: Any) -> Any:
        guard = WATCHDOG.watch(HEADER_TIMEOUT, lambda: shut_reading(conn.sock)) if HEADER_TIMEOUT > 0 else None
        _current.guard = guard
        try:
            return super().handle(conn)
        finally:
            _current.guard = None
            if guard is not None:
                WATCHDOG.release(guard)

    def handle_request(self, req: Any, conn: Any) -> Any:
        guard = getattr(_current, "guard", None)
        if guard is not None:  # the headers are in: the body and the app have deadlines of their own
            WATCHDOG.release(guard)
            _current.guard = None
        return super().handle_request(req, conn)
