"""Response bodies that run a callback once when the server is done with them.

WSGI middleware (the request limits, the metrics) must learn when a response
has really ended: after its last byte for a plain answer, or when the client
went away mid-stream.  Servers call ``close()``; some test clients only read to
the end; either way the callback runs exactly once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator

from servekit.streams import close


class Once:
    """A callable that runs ``fn`` on its first call only, from any thread."""

    def __init__(self, fn: Callable[[], None]):
        self._fn: Callable[[], None] | None = fn
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            fn, self._fn = self._fn, None
        if fn is not None:
            fn()


class ClosingBody:
    """Wraps a response iterable; its end or ``close()`` calls ``on_close`` (make it a :class:`Once`)."""

    def __init__(self, body: Iterable[bytes], on_close: Callable[[], None]):
        self._body = body
        self._on_close = on_close

    def __iter__(self) -> Iterator[bytes]:
        yield from self._body
        self._on_close()

    def close(self) -> None:
        try:
            close(self._body)
        finally:
            self._on_close()
