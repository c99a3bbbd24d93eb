"""Read deadlines for slow clients: a request's headers and body must arrive in time.

A client that sends one byte a second would otherwise hold a worker thread for
as long as it likes.  One watchdog thread per worker process keeps the deadlines
of the reads in progress; when one passes, it shuts the connection's socket for
reading, so the blocked ``recv`` returns at once and the read fails.  The reader
then answers 408 (a body) or just closes the connection (headers: there is no
request to answer yet).

Where the server hands the WSGI app no socket (granian), each body read runs in
a helper thread that the request waits for only until the deadline
(:meth:`servekit.server.limits.LimitsMiddleware._read`): the request is answered 408
and its thread is free, while the helper waits for granian to end the
connection; granian's own ``header_read_timeout`` bounds the headers.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import queue
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

from servekit.errors import BadRequest, RequestTimeout, ServekitError

log = logging.getLogger("servekit.watchdog")


class Guard:
    """One read under a deadline; ``fired`` once the watchdog cut it off."""

    def __init__(self, deadline: float | None, timeout: float):
        self.deadline = deadline
        self.timeout = timeout
        self.fired = False
        self.cuts = False  # the watchdog can cut the read (it holds the socket)
        self.key = 0  # its place in the watchdog's queue

    def expired(self) -> bool:
        return self.fired or (self.deadline is not None and time.monotonic() > self.deadline)

    def check(self) -> None:
        """:class:`RequestTimeout` if the deadline passed (the body came too slowly)."""
        if self.expired():
            raise RequestTimeout(f"request body not received within {self.timeout:g}s (--body-timeout)")


class Watchdog:
    """Deadlines for reads in progress, kept by one daemon thread started on first use.

    Callers use a few fixed timeouts (``--header-timeout``, ``--body-timeout``),
    so the deadlines of one timeout come in the order they were set: each
    timeout keeps a first-in, first-out queue, :meth:`release` takes its entry
    out at once, and only the oldest entry of each queue can be due.  The
    thread sleeps until the earliest of those, or for the shortest timeout when
    nothing is watched (an entry set later is due later still), so a request
    costs two dictionary operations under a lock and never wakes the thread;
    only a timeout not seen before does.
    """

    def __init__(self) -> None:
        self._queues: dict[float, OrderedDict[int, tuple[Guard, Callable[[], None]]]] = {}
        self._count = itertools.count()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        os.register_at_fork(after_in_child=self._forget_thread)

    def _forget_thread(self) -> None:
        """A forked child has none of its parent's threads: its first watch starts one."""
        self._thread = None
        self._lock = threading.Lock()
        self._wake = threading.Event()

    def watch(self, timeout: float, cut: Callable[[], None]) -> Guard:
        """Call ``cut`` once ``timeout`` seconds pass, unless :meth:`release` comes first."""
        guard = Guard(time.monotonic() + timeout, timeout)
        guard.key = next(self._count)
        with self._lock:
            new = timeout not in self._queues
            self._queues.setdefault(timeout, OrderedDict())[guard.key] = (guard, cut)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="servekit-watchdog", daemon=True)
                self._thread.start()
        if new:  # the thread may be sleeping for a longer timeout than this one
            self._wake.set()
        return guard

    def release(self, guard: Guard) -> None:
        with self._lock:
            entries = self._queues.get(guard.timeout)
            if entries is not None:
                entries.pop(guard.key, None)

    def watched(self) -> int:
        """How many reads are under a deadline now (for tests)."""
        with self._lock:
            return sum(len(entries) for entries in self._queues.values())

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

    def _due(self) -> tuple[list[Callable[[], None]], float]:
        """Take the entries whose deadline passed; how long until the next one can be due."""
        now = time.monotonic()
        due: list[Callable[[], None]] = []
        wait = float("inf")
        with self._lock:
            for timeout, entries in self._queues.items():
                while entries:
                    guard, cut = next(iter(entries.values()))
                    if guard.deadline is not None and guard.deadline > now:
                        wait = min(wait, guard.deadline - now)
                        break
                    entries.popitem(last=False)
                    guard.fired = True
                    due.append(cut)
                else:  # nothing watched: an entry set from now on is due ``timeout`` later at the soonest
                    wait = min(wait, timeout)
        return due, wait

    def _run(self) -> None:
        while True:
            self._wake.clear()
            due, wait = self._due()
            for cut in due:
                try:
                    cut()
                except Exception:  # a socket already closed: nothing left to cut
                    log.debug("cutting a slow client failed", exc_info=True)
            if not due:
                self._wake.wait(None if wait == float("inf") else wait)


def shut_reading(sock: Any) -> None:
    """Make a blocked ``recv`` on ``sock`` return at once (the client is too slow)."""
    if sock is None:
        return
    with contextlib.suppress(OSError):
        # the plain socket's shutdown, also under TLS: SSLSocket's own drops its TLS state
        socket.socket.shutdown(sock, socket.SHUT_RD)


class ReadTimedOut(Exception):
    """A read handed to :class:`Readers` did not finish in time (it goes on in its thread)."""


class Readers:
    """Threads that read request bodies for requests that wait for them only until a deadline.

    Where the watchdog cannot cut a read (granian hands the app no socket), the
    read runs here and the request waits on a lock with a timeout.  This is the
    lightest hand-off between two threads there is in Python: one queue put,
    one lock; a thread is started only when none is idle, up to ``most``.
    """

    def __init__(self, most: int):
        self._jobs: queue.SimpleQueue[tuple[Any, int, list]] = queue.SimpleQueue()
        self._most = max(1, most)
        self._threads = 0
        self._idle = 0
        self._lock = threading.Lock()

    def read(self, stream: Any, size: int, timeout: float) -> bytes:
        """``stream.read(size)``; :class:`ReadTimedOut` when it takes longer than ``timeout`` seconds."""
        done = threading.Lock()
        done.acquire()
        job: list = [b"", None, done]
        with self._lock:
            if self._idle:
                self._idle -= 1
            elif self._threads < self._most:
                self._threads += 1
                threading.Thread(target=self._work, name="servekit-body", daemon=True).start()
        self._jobs.put((stream, size, job))
        if not done.acquire(timeout=max(0.0, timeout)):
            raise ReadTimedOut(f"body read took longer than {timeout:g}s")
        if job[1] is not None:
            raise job[1]
        return job[0]

    def _work(self) -> None:
        while True:
            stream, size, job = self._jobs.get()
            try:
                job[0] = stream.read(size)
            except BaseException as exc:  # handed to the waiting request, which raises it
                job[1] = exc
            with self._lock:
                self._idle += 1
            job[2].release()


#: The worker's one watchdog (a process has one set of threads).
WATCHDOG = Watchdog()
