"""What the gRPC servicers share: error mapping and joining a streamed prediction.

Servicer methods raise :class:`servekit.errors.ServekitError` like every other
protocol does; :func:`rpc` and :func:`streaming_rpc` turn it into the status
code the error class names (``.grpc_code``) with its message, and anything else
into ``INTERNAL`` without a stack trace reaching the client.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from servekit.errors import NotReady, ServekitError

log = logging.getLogger("servekit.grpc")


def status_code(exc: ServekitError) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, exc.grpc_code, grpc.StatusCode.INTERNAL)


def _abort(context: grpc.ServicerContext, exc: BaseException, method: str) -> None:
    if isinstance(exc, ServekitError):
        context.abort(status_code(exc), exc.message)
    log.exception("unhandled error in %s", method, exc_info=exc)
    context.abort(grpc.StatusCode.INTERNAL, f"internal server error ({type(exc).__name__})")


def control_of(servicer: Any) -> Any:
    """The servicer's control plane, or ``UNAVAILABLE`` for a server built without one."""
    if servicer.control is None:
        raise NotReady("model control is not available: this gRPC server runs without the app's control plane")
    return servicer.control


def rpc(method: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a unary-response servicer method with the error mapping."""

    @functools.wraps(method)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except Exception as exc:  # every error becomes a status; context.abort raises
            _abort(context, exc, method.__qualname__)

    return wrapper


def streaming_rpc(method: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    """Wrap a response-streaming servicer method: responses already sent stay sent."""

    @functools.wraps(method)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            yield from method(self, request, context)
        except Exception as exc:  # every error becomes a status; context.abort raises
            _abort(context, exc, method.__qualname__)

    return wrapper
