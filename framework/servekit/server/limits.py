"""Request limits as WSGI middleware: body size, compressed bodies, timeouts, backpressure.

Everything here answers before Flask sees the request, raising the same error
classes as every other layer and rendered by the same :func:`servekit.errors.render`
(``{"error": message}``, or OpenAI's error object on OpenAI routes):

- a body larger than ``--max-request-size`` is a 413 as soon as its
  ``Content-Length`` is read (nothing is buffered first), and a chunked body
  (no length) is a 413 as soon as the bytes read pass the limit: every body is
  read here, 64 KiB at a time, so no layer behind ever holds more than the limit;
- the body must arrive within ``--body-timeout`` seconds (408 otherwise,
  :mod:`servekit.server.watchdog`), so a client trickling bytes cannot hold a thread;
- ``Content-Encoding: gzip`` and ``deflate`` bodies are inflated here, and the *inflated* size is
  capped by the same limit (413), so a small zip bomb cannot fill memory;
- each worker runs at most ``--max-inflight`` requests at once and keeps at most
  ``--max-queue`` more waiting for a slot: above that a request is answered 429
  at once, and one that waited its whole timeout for a slot gets 503;
- a request that is not answered within ``--request-timeout`` seconds gets 504.
  A Python thread cannot be killed, so the model call that overran keeps its
  slot until it returns: runaway calls turn into 429/503 backpressure instead of
  an unbounded pile of threads.

Health probes and ``/metrics`` bypass the queue and the timeout, so an
overloaded worker still reports itself.
"""

from __future__ import annotations

import io
import logging
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from http import HTTPStatus
from typing import Any

from servekit.codecs import json as jsonc
from servekit.errors import (
    BadRequest,
    NotReady,
    PayloadTooLarge,
    RequestTimeout,
    ServekitError,
    Timeout,
    TooManyRequests,
    UnsupportedMediaType,
    render,
)
from servekit.observability import load
from servekit.observability.wsgi_body import ClosingBody, Once
from servekit.routes import UNQUEUED_PATHS
from servekit.server.watchdog import WATCHDOG, Guard, Readers, ReadTimedOut, shut_reading

log = logging.getLogger("servekit.limits")

WSGIApp = Callable[[dict, Callable], Iterable[bytes]]

_ENCODINGS = {"gzip": "gzip", "x-gzip": "gzip", "deflate": "deflate"}
_READ_CHUNK = 64 * 1024
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


#: Extra headers per error: a client should retry later, or stop sending a huge body.
_RETRY_LATER = [("Retry-After", "1")]


def error_response(start_response: Callable, exc: ServekitError, path: str, headers: list | None = None) -> list[bytes]:
    body = jsonc.dumps(render(exc, path))
    status = f"{exc.status} {HTTPStatus(exc.status).phrase}"
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body))), *(headers or [])])
    return [body]


def _headers_for(exc: ServekitError) -> list[tuple[str, str]]:
    if isinstance(exc, (PayloadTooLarge, RequestTimeout)):
        return [("Connection", "close")]  # do not read the rest of a huge body
    if isinstance(exc, (TooManyRequests, NotReady)):
        return list(_RETRY_LATER)
    return []


class LimitsMiddleware:
    """Wraps a WSGI app with the limits above; one instance per worker process."""

    def __init__(
        self,
        app: WSGIApp,
        *,
        max_request_size: int,
        request_timeout: float,
        max_inflight: int,
        max_queue: int,
        body_timeout: float = 0.0,
    ):
        self.app = app
        self.body_timeout = body_timeout
        self.watchdog = WATCHDOG
        self.max_request_size = max_request_size
        self.request_timeout = request_timeout
        self.max_inflight = max(1, max_inflight)
        self.max_queue = max(0, max_queue)
        self._slots = threading.BoundedSemaphore(self.max_inflight)
        self._waiting = 0
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._readers: Readers | None = None  # body reads under a deadline (granian)
        self.running = 0  # requests holding a slot, for tests and the status page

    # -- entry ----------------------------------------------------------------

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        try:
            self._check_size(environ)
            encoding = environ.get("HTTP_CONTENT_ENCODING", "").strip().lower()
            if encoding in _ENCODINGS:
                self._inflate(environ, _ENCODINGS[encoding])
            elif encoding not in ("", "identity"):
                raise UnsupportedMediaType(
                    f"Content-Encoding {encoding!r} is not supported; send gzip, deflate or an unencoded body"
                )
            else:
                self._buffer(environ)
            if environ.get("PATH_INFO", "").startswith(UNQUEUED_PATHS):
                return self.app(environ, start_response)
            deadline = time.monotonic() + self.request_timeout if self.request_timeout > 0 else None
            self._admit(deadline)
        except ServekitError as rejected:
            environ["servekit.rejected"] = rejected.status
            if isinstance(rejected, (PayloadTooLarge, RequestTimeout)):
                # gunicorn drops a Connection header from the app and would read the rest
                # of the body to reach the next request: end its reading instead
                shut_reading(environ.get("gunicorn.socket"))
            return error_response(start_response, rejected, environ.get("PATH_INFO", ""), _headers_for(rejected))
        return self._run(environ, start_response, deadline)

    # -- body size and encoding -----------------------------------------------------

    def _check_size(self, environ: dict) -> None:
        length = environ.get("CONTENT_LENGTH") or ""
        if not length:
            return
        try:
            size = int(length)
        except ValueError:
            raise BadRequest(f"Content-Length must be an integer, found {length!r}") from None
        if size > self.max_request_size:
            raise PayloadTooLarge(f"request body too large: {size} bytes; the limit is {self.max_request_size} bytes")

    def _inflate(self, environ: dict, encoding: str) -> None:
        """Replace a gzip or deflate body with its inflated bytes, never holding more than the limit."""
        inflater = _Inflater(self.max_request_size, encoding)
        for chunk in self._chunks(environ, "compressed request body"):
            inflater.feed(chunk)
        body = inflater.result()
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        environ.pop("HTTP_CONTENT_ENCODING", None)
        environ["servekit.content_encoding"] = encoding
        environ["wsgi.input_terminated"] = True

    def _buffer(self, environ: dict) -> None:
        """Read the body here, however it is framed, and stop at the limit (413).

        A body with a ``Content-Length`` was checked above; a chunked one (no
        length) is read 64 KiB at a time and refused as soon as it passes the
        limit, so nothing larger than the limit is ever held.  The whole body then
        waits in memory for the app, which reads it from there.
        """
        length = environ.get("CONTENT_LENGTH") or ""
        if length == "0" or (not length and not _chunked(environ)):
            return
        body = b"".join(self._chunks(environ, "request body"))
        if length and len(body) < int(length):
            raise BadRequest(f"request body ended after {len(body)} of its {length} bytes (Content-Length)")
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        environ["wsgi.input_terminated"] = True

    def _chunks(self, environ: dict, what: str) -> Iterator[bytes]:
        """The raw body, chunk by chunk; :class:`PayloadTooLarge` once it passes the limit.

        The read runs under the body timeout (``--body-timeout``): a client that
        trickles its body is cut off (408) instead of holding a thread.
        """
        limit = self.max_request_size
        stream = environ["wsgi.input"]
        length = environ.get("CONTENT_LENGTH")
        remaining = int(length) if length else None
        read = 0
        with self.watchdog.guard(environ, self.body_timeout) as guard:
            while remaining is None or remaining > 0:
                chunk = self._read(stream, _READ_CHUNK if remaining is None else min(_READ_CHUNK, remaining), guard)
                if not chunk:
                    break
                read += len(chunk)
                if remaining is not None:
                    remaining -= len(chunk)
                if read > limit:
                    raise PayloadTooLarge(f"{what} larger than the limit of {limit} bytes")
                guard.check()
                yield chunk

    def _read(self, stream: Any, size: int, guard: Guard) -> bytes:
        """One read of the body, given up at the deadline when the watchdog cannot cut it."""
        if guard.deadline is None or guard.cuts:
            return stream.read(size)
        if self._readers is None:
            with self._lock:
                if self._readers is None:
                    self._readers = Readers(self.max_inflight)
        try:
            return self._readers.read(stream, size, guard.deadline - time.monotonic())
        except ReadTimedOut:
            guard.fired = True
            raise RequestTimeout(f"request body not received within {guard.timeout:g}s (--body-timeout)") from None

    # -- admission --------------------------------------------------------------------

    def _admit(self, deadline: float | None) -> None:
        if self._slots.acquire(blocking=False):
            return
        with self._lock:
            if self._waiting >= self.max_queue:
                raise TooManyRequests(
                    f"server busy: {self.max_inflight} requests running and {self._waiting} waiting; retry later"
                )
            self._waiting += 1
        load.waiting_for_slot(1)  # the replica's concurrency, which an autoscaler targets
        try:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._slots.acquire(timeout=timeout):
                raise NotReady(f"server busy: no free slot within {self.request_timeout:g}s; retry later")
        finally:
            with self._lock:
                self._waiting -= 1
            load.waiting_for_slot(-1)

    # -- running ------------------------------------------------------------------------

    def _run(self, environ: dict, start_response: Callable, deadline: float | None) -> Iterable[bytes]:
        with self._lock:
            self.running += 1
        release = Once(self._release)
        if deadline is None:
            try:
                return ClosingBody(self.app(environ, start_response), release)
            except BaseException:
                release()
                raise
        future = self._executor().submit(_call_app, self.app, environ)
        try:
            status, headers, body = future.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            environ["servekit.timed_out"] = True
            future.add_done_callback(lambda f: _close_late(f, release))
            log.warning(
                "request %s %s passed its %gs timeout",
                environ.get("REQUEST_METHOD"),
                environ.get("PATH_INFO"),
                self.request_timeout,
            )
            timeout = Timeout(f"request not answered within {self.request_timeout:g}s (--request-timeout)")
            return error_response(start_response, timeout, environ.get("PATH_INFO", ""))
        except BaseException:
            release()
            raise
        start_response(status, headers)
        return ClosingBody(body, release)

    def _release(self) -> None:
        with self._lock:
            self.running -= 1
        self._slots.release()

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.max_inflight, thread_name_prefix="servekit-request")
        return self._pool


def _chunked(environ: dict) -> bool:
    """A body framed by ``Transfer-Encoding`` (chunked) rather than by its length."""
    if "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
        return True
    return environ.get("REQUEST_METHOD") in _BODY_METHODS and bool(environ.get("wsgi.input_terminated"))


class _Inflater:
    """Inflates a gzip body (concatenated members are one stream, RFC 1952 2.2) or a
    deflate (zlib, RFC 1950) body, up to a cap."""

    def __init__(self, limit: int, encoding: str = "gzip"):
        self.limit = limit
        self.encoding = encoding
        self._wbits = zlib.MAX_WBITS if encoding == "deflate" else 16 + zlib.MAX_WBITS
        self.out = io.BytesIO()
        self._inflater = zlib.decompressobj(self._wbits)

    def feed(self, data: bytes) -> None:
        while data:
            if self._inflater.eof:
                if self.encoding == "deflate":
                    raise BadRequest("request body has data after its deflate stream")
                self._inflater = zlib.decompressobj(self._wbits)
            try:
                piece = self._inflater.decompress(data, self.limit + 1 - self.out.tell())
            except zlib.error:
                raise BadRequest(
                    f"request body is not valid {self.encoding} data (Content-Encoding: {self.encoding})"
                ) from None
            self.out.write(piece)
            if self.out.tell() > self.limit:
                raise PayloadTooLarge(f"request body inflates to more than the limit of {self.limit} bytes")
            data = self._inflater.unused_data if self._inflater.eof else self._inflater.unconsumed_tail

    def result(self) -> bytes:
        if not self._inflater.eof:
            raise BadRequest(f"request body is not complete {self.encoding} data (Content-Encoding: {self.encoding})")
        return self.out.getvalue()


def _call_app(app: WSGIApp, environ: dict) -> tuple[str, list, Iterable[bytes]]:
    """Run the app in a pool thread; the response starts in the server's own thread."""
    captured: dict[str, Any] = {}
    written: list[bytes] = []

    def start_response(status: str, headers: list, exc_info: Any = None):
        captured["status"], captured["headers"] = status, headers
        return written.append  # the legacy write() callable

    body = app(environ, start_response)
    if written:
        body = _Chain(written, body)
    return captured["status"], captured["headers"], body


def _close_late(future: Any, release: Callable[[], None]) -> None:
    """After a timeout, the abandoned call finished: free its resources and its slot."""
    try:
        if future.exception() is None:
            body = future.result()[2]
            close = getattr(body, "close", None)
            if close is not None:
                close()
    except Exception:
        log.exception("closing a timed-out response failed")
    finally:
        release()


class _Chain:
    def __init__(self, head: list[bytes], body: Iterable[bytes]):
        self._head, self._body = head, body

    def __iter__(self) -> Iterator[bytes]:
        yield from self._head
        yield from self._body

    def close(self) -> None:
        close = getattr(self._body, "close", None)
        if close is not None:
            close()


def install(app: Any, settings: Any) -> LimitsMiddleware:
    """Wrap ``app.wsgi_app`` (a Flask app) with the limits from ``settings``."""
    middleware = LimitsMiddleware(
        app.wsgi_app,
        max_request_size=settings.max_request_size,
        request_timeout=settings.request_timeout,
        max_inflight=settings.max_inflight or settings.threads,
        max_queue=settings.max_queue,
        body_timeout=settings.body_timeout,
    )
    app.wsgi_app = middleware
    app.extensions["servekit.limits"] = middleware
    return middleware
