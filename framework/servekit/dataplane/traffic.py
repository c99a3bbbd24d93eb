"""Traffic control: a request's place in its model's queue, canary splits and shadow traffic.

- **The queue** (``queue:`` of ``servekit.yaml``, Triton's ``dynamic_batching``
  priorities and queue policy): each request carries a :class:`Ticket` (its
  priority level, its timeout, and how to tell that its client went away), set
  by the protocol that received it (the ``Servekit-Priority`` and
  ``Servekit-Timeout-Ms`` headers, V2's ``priority`` and ``timeout``
  parameters, a gRPC call's cancellation).  The version's gate
  (:class:`servekit.dataplane.call_gate.PriorityGate`) reads it.
- **Canary splits** (``traffic:``): :func:`route` picks the target of a request
  that names no version, by weight, the same one for the same sticky key.
- **Shadow traffic** (``shadow:``): the data plane hands a copy of a request to
  its :class:`ShadowRunner`; on a server that is a process per worker at idle CPU
  priority (:mod:`servekit.hosts.shadow_pipe`, :mod:`servekit.hosts.shadow`), so a
  copy costs the serving worker a pickle and a pipe write, never a wait.  The
  candidate's answer is logged beside the served one (:func:`shadow_record`, with
  :func:`difference`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import random
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from servekit.errors import BadRequest, ServekitError, Timeout
from servekit.types import PredictionLog, RequestLog

log = logging.getLogger("servekit.traffic")

#: the headers a plain HTTP client sets its request's place in the queue with
PRIORITY_HEADER = "Servekit-Priority"
TIMEOUT_HEADER = "Servekit-Timeout-Ms"


class QueueFull(ServekitError):
    """The version's queue holds ``max_queue_size`` requests (Triton answers UNAVAILABLE)."""

    status = 503


class QueueTimeout(Timeout):
    """The request's queue timeout passed before its turn (``timeout_action: reject``)."""


class ClientGone(ServekitError):
    """The client went away while its request waited; nobody reads this answer."""

    status = 499


# -- the request's ticket ---------------------------------------------------------------------


@dataclass
class Ticket:
    #: the level the request asked for (1 first); ``None``: the model's default
    priority: int | None = None
    #: milliseconds the request may wait in the queue; ``None``: the model's default
    timeout_ms: float | None = None
    #: whether the client went away (a closed connection, a cancelled gRPC call)
    cancelled: Callable[[], bool] | None = None
    #: a request header's value by name (``api_key``: the request's API key), for a sticky split
    lookup: Callable[[str], str | None] | None = None
    arrival: float = field(default_factory=time.monotonic)
    #: where each field came from, for error messages
    source: str = "request"
    #: the model it was sent to has a queue for its priority and timeout (checked once)
    checked: bool = False
    #: a split model's name and the target that answers it (for the per-target metrics)
    routed: tuple[str, str] | None = None
    #: the model name and its ``shadow:`` when a copy of this request may go to a candidate
    shadow: tuple[str, Any] | None = None

    def place_in(self, config: Any) -> tuple[int, float, Any]:
        """The request's level, deadline (``time.monotonic``) and policy in a queue of ``config``."""
        levels = max(1, config.priority_levels)
        default = config.default_priority_level or (levels + 1) // 2
        level = default if not self.priority else self.priority
        if level > levels:
            raise BadRequest(
                f"{self.source} 'priority' is {self.priority}; this model has priority levels 1 to {levels} "
                "(1 first, 0 or none: the default)"
            )
        policy = config.policy(level)
        timeout = policy.default_timeout_ms
        if self.timeout_ms:
            if not policy.allow_timeout_override:
                raise BadRequest(
                    f"{self.source} 'timeout' cannot be set for this model: its queue policy does not allow "
                    "a request's own timeout (allow_timeout_override: false)"
                )
            timeout = self.timeout_ms
        deadline = self.arrival + timeout / 1000.0 if timeout else float("inf")
        return level, deadline, policy


_ticket: ContextVar[Ticket | None] = ContextVar("servekit_ticket", default=None)


def current() -> Ticket:
    """The current request's ticket (a default one outside a request)."""
    return _ticket.get() or Ticket()


def pending() -> Ticket | None:
    """The ticket set for this thread's request, ``None`` when none was."""
    return _ticket.get()


@contextlib.contextmanager
def serving(ticket: Ticket) -> Iterator[Ticket]:
    """The ticket of a request served inside the block (a gRPC call: its thread serves others after)."""
    token = _ticket.set(ticket)
    try:
        yield ticket
    finally:
        _ticket.reset(token)


def start(ticket: Ticket | None) -> None:
    """Set (or, with ``None``, clear) the ticket of the request this thread now serves."""
    _ticket.set(ticket)


def asked(priority: Any, timeout_us: Any, source: str) -> None:
    """The V2 ``priority`` and ``timeout`` (microseconds) parameters of the current request, checked."""
    ticket = current()
    if priority not in (None, False, 0, ""):
        if isinstance(priority, bool) or not isinstance(priority, int) or priority < 0:
            raise BadRequest(f"{source} 'priority' must be a whole number from 0, found {priority!r}")
        ticket.priority = priority
    if timeout_us not in (None, False, 0, ""):
        if isinstance(timeout_us, bool) or not isinstance(timeout_us, int) or timeout_us < 0:
            raise BadRequest(f"{source} 'timeout' must be microseconds, a whole number from 0, found {timeout_us!r}")
        ticket.timeout_ms = timeout_us / 1000.0
    ticket.source = source
    _ticket.set(ticket)


def from_environ(environ: dict[str, Any]) -> Ticket:
    """A plain HTTP request's ticket: the ``Servekit-Priority`` and ``Servekit-Timeout-Ms`` headers,
    its connection (to tell a client that went away) and its headers (a split's sticky key)."""
    ticket = Ticket(cancelled=_closed(environ.get("gunicorn.socket")), source="header")
    priority, timeout = environ.get("HTTP_SERVEKIT_PRIORITY"), environ.get("HTTP_SERVEKIT_TIMEOUT_MS")
    if priority is not None:
        if not priority.strip().isdigit():
            raise BadRequest(f"header {PRIORITY_HEADER!r} must be a whole number from 0 (1 first), found {priority!r}")
        ticket.priority = int(priority)
    if timeout is not None:
        try:
            ticket.timeout_ms = float(timeout)
        except ValueError:
            ticket.timeout_ms = -1.0
        if not 0 <= ticket.timeout_ms < float("inf"):
            raise BadRequest(f"header {TIMEOUT_HEADER!r} must be milliseconds from 0, found {timeout!r}")
    ticket.lookup = lambda name: _header(environ, name)
    return ticket


def _header(environ: dict[str, Any], name: str) -> str | None:
    if name == "api_key":
        value = environ.get("HTTP_AUTHORIZATION") or ""
        return value.split(" ", 1)[-1] or None
    return environ.get("HTTP_" + name.upper().replace("-", "_"))


def _closed(sock: Any) -> Callable[[], bool] | None:
    """Whether the peer of a connection has closed it (a read would find its end)."""
    if sock is None:
        return None

    def closed() -> bool:
        try:
            return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    return closed


# -- counters -----------------------------------------------------------------------------------


def count_cancelled(model: str, reason: str) -> None:
    """A queued request dropped without being computed (``servekit_queue_cancelled_total``)."""
    from servekit.observability import metrics

    metrics.metrics().queue_cancelled.labels(model, reason).inc()


def queued(model: str, delta: int) -> None:
    from servekit.observability import metrics

    metrics.metrics().queue_pending.labels(model).inc(delta)


def count_dropped(model: str) -> None:
    """A shadow copy that was not run (``servekit_shadow_dropped_total``)."""
    from servekit.observability import metrics

    metrics.metrics().shadow_dropped.labels(model).inc()


def observe_routed(model: str, target: str, seconds: float) -> None:
    """One request of a split model answered by ``target`` (``servekit_traffic_*``)."""
    from servekit.observability import metrics

    m = metrics.metrics()
    m.traffic_requests.labels(model, target).inc()
    m.traffic_latency.labels(model, target).observe(seconds)


# -- canary splits ------------------------------------------------------------------------------


def route(config: Any, ticket: Ticket, draw: Callable[[], float] = random.random) -> int | str:
    """The target of one request: by weight, the same target for the same sticky value."""
    total = sum(weight for _, weight in config.weights)
    sticky = ticket.lookup(config.sticky) if config.sticky and ticket.lookup is not None else None
    if sticky:
        digest = hashlib.blake2b(sticky.encode("utf-8", "replace"), digest_size=8).digest()
        point = int.from_bytes(digest, "big") / 2.0**64 * total
    else:
        point = draw() * total
    for target, weight in config.weights:
        if point < weight:
            return target
        point -= weight
    return next(target for target, weight in reversed(config.weights) if weight > 0)


# -- shadow traffic -----------------------------------------------------------------------------


def difference(served: Any, shadow: Any) -> float | None:
    """The largest absolute difference between two answers' matching numeric outputs.

    ``None`` when they cannot be compared (other names, shapes or non-numbers); an
    answer that differs in a string is 1.0.
    """
    if not isinstance(served, dict) or not isinstance(shadow, dict) or set(served) != set(shadow):
        return None
    largest = 0.0
    for name, value in served.items():
        a, b = np.asarray(value), np.asarray(shadow[name])
        if a.shape != b.shape:
            return None
        if a.dtype.kind in "biuf" and b.dtype.kind in "biuf":
            if a.size:
                largest = max(largest, float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))))
        elif not np.array_equal(a, b):
            largest = max(largest, 1.0)
    return largest


def _plain(outputs: Any) -> Any:
    if isinstance(outputs, dict):
        return {str(k): _plain(v) for k, v in outputs.items()}
    if isinstance(outputs, np.ndarray):
        return (
            outputs.tolist() if outputs.dtype.kind != "S" else [x.decode("utf-8", "replace") for x in outputs.ravel()]
        )
    return outputs


class ShadowRunner(Protocol):
    """Where the data plane hands its shadow copies (``DataPlane.shadows``).

    The server installs :class:`servekit.hosts.shadow_pipe.ShadowProcess`: a process
    per worker, at idle CPU priority, runs the copies and logs the answers.
    """

    def submit(self, target: Any, request: Any, served: Any, served_log_id: str, model: str, path: str) -> None:
        """Hand one copy over (``request``: the inputs and the keyword arguments of its ``predict``);
        never waits: a copy that cannot be taken now is dropped and counted."""

    def wait_idle(self, timeout: float = 60.0) -> bool:
        """Until every copy handed in so far is logged and in the store (tests, a clean shutdown)."""

    def close(self) -> None:
        """No more copies: let the copies handed in finish, then stop."""


class NoShadows:
    """A data plane no server set up: nothing runs copies, so each one is dropped and counted."""

    def submit(self, target: Any, request: Any, served: Any, served_log_id: str, model: str, path: str) -> None:
        count_dropped(model)

    def wait_idle(self, timeout: float = 60.0) -> bool:
        return True

    def close(self) -> None:
        pass


def shadow_record(
    *,
    served_log_id: str,
    served: Any,
    answer: Any,
    status: int,
    difference: float | None,
    model: str,
    version: str,
    path: str,
    duration_ms: float,
) -> RequestLog:
    """The request log's record of one shadow answer, beside the served request it copies.

    ``protocol`` ``shadow``, ``requestId`` the served request's ``requestLogId``,
    and a response (and its one prediction) holding ``shadow_of``, ``served``,
    ``shadow`` and ``difference``.
    """
    import orjson

    body = orjson.dumps(
        {"shadow_of": served_log_id, "served": _plain(served), "shadow": _plain(answer), "difference": difference},
        option=orjson.OPT_SERIALIZE_NUMPY,
        default=str,
    ).decode()
    record = RequestLog(
        request_log_id=uuid.uuid4().hex,
        request_id=served_log_id,
        created=time.time(),
        method="SHADOW",
        path=path,
        protocol="shadow",
        model=model,
        status=status,
        duration_ms=duration_ms,
        request_body="",
        response_body=body,
        version=version,
        trace_id="",
    )
    record.predictions = [PredictionLog(uuid.uuid4().hex, 0, body)]
    return record
