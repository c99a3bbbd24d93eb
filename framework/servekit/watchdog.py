"""Read deadlines for slow clients: a request's headers and body must arrive in time.

A client that sends one byte a second would otherwise hold a worker thread for
as long as it likes.  One watchdog thread per worker process keeps the deadlines
of the reads in progress; when one passes, it shuts the connection's socket for
reading, so the blocked ``recv`` returns at once and the read fails.  The reader
then answers 408 (a body) or just closes the connection (headers: there is no
request to answer yet).

Where the server hands the WSGI app no socket (granian), each body read runs in
a helper thread that the request waits for only until the deadline
(:meth:`servekit.limits.LimitsMiddleware._read`): the request is answered 408
and its thread is free, while the helper waits for granian to end the
connection; granian's own ``header_read_timeout`` bounds the headers.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from .errors import BadRequest, RequestTimeout, ServekitError

log = logging.getLogger("servekit.watchdog")


class Guard:
    """One read under a deadline; ``fired`` once the watchdog cut it off."""

    def __init__(self, deadline: float | None, timeout: float):
        self.deadline = deadline
        self.timeout = timeout
        self.fired = False
        self.done = False
        self.cuts = False  # the watchdog can cut the read (it holds the socket)

    def expired(self) -> bool:
        return self.fired or (self.deadline is not None and time.monotonic() > self.deadline)

    def check(self) -> None:
        """:class:`RequestTimeout` if the deadline passed (the body came too slowly)."""
        if self.expired():
            raise RequestTimeout(f"request body not received within {self.timeout:g}s (--body-timeout)")


class Watchdog:
    """Deadlines for reads in progress, kept by one daemon thread started on first use."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Guard, Callable[[], None]]] = []
        self._count = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def watch(self, timeout: float, cut: Callable[[], None]) -> Guard:
        """Call ``cut`` once ``timeout`` seconds pass, unless :meth:`release` comes first."""
        guard = Guard(time.monotonic() + timeout, timeout)
        with self._cond:
            heapq.heappush(self._heap, (guard.deadline or 0.0, next(self._count), guard, cut))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="servekit-watchdog", daemon=True)
                self._thread.start()
            self._cond.notify()
        return guard

    def release(self, guard: Guard) -> None:
        with self._cond:
            guard.done = True  # its entry is dropped when it comes up

    @contextlib.contextmanager
    def guard(self, environ: dict, timeout: float) -> Iterator[Guard]:
        """Read a request body under ``timeout`` seconds; a failed read becomes a clear 4xx."""
        if timeout <= 0:
            yield Guard(None, timeout)
            return
        sock = environ.get("gunicorn.socket")
        if sock is not None:
            guard = self.watch(timeout, lambda: shut_reading(sock))
            guard.cuts = True
        else:
            guard = Guard(time.monotonic() + timeout, timeout)
        try:
            yield guard
        except ServekitError:
            raise
        except Exception as exc:  # the server's reader: a cut socket, a malformed chunk, a client gone
            guard.check()
            raise BadRequest(f"request body could not be read ({type(exc).__name__})") from None
        finally:
            self.release(guard)
        guard.check()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap:
                    self._cond.wait()
                deadline, _, guard, cut = self._heap[0]
                wait = deadline - time.monotonic()
                if not guard.done and wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
                if guard.done:
                    continue
                guard.fired = True
            try:
                cut()
            except Exception:  # a socket already closed: nothing left to cut
                log.debug("cutting a slow client failed", exc_info=True)


def shut_reading(sock: Any) -> None:
    """Make a blocked ``recv`` on ``sock`` return at once (the client is too slow)."""
    if sock is None:
        return
    with contextlib.suppress(OSError):
        # the plain socket's shutdown, also under TLS: SSLSocket's own drops its TLS state
        socket.socket.shutdown(sock, socket.SHUT_RD)


#: The worker's one watchdog (a process has one set of threads).
WATCHDOG = Watchdog()
