"""What the gRPC servicers share: error mapping and joining a streamed prediction.

Servicer methods raise :class:`servekit.errors.ServekitError` like every other
protocol does; :func:`rpc` and :func:`streaming_rpc` turn it into the status
code the error class names (``.grpc_code``) with its message, and anything else
into ``INTERNAL`` without a stack trace reaching the client.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import grpc
import numpy as np

from ...errors import ModelFailure, ServekitError

log = logging.getLogger("servekit.grpc")


def status_code(exc: ServekitError) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, exc.grpc_code, grpc.StatusCode.INTERNAL)


def _abort(context: grpc.ServicerContext, exc: BaseException, method: str) -> None:
    if isinstance(exc, ServekitError):
        context.abort(status_code(exc), exc.message)
    log.exception("unhandled error in %s", method, exc_info=exc)
    context.abort(grpc.StatusCode.INTERNAL, f"internal server error ({type(exc).__name__})")


def rpc(method: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a unary-response servicer method with the error mapping."""

    @functools.wraps(method)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except Exception as exc:  # noqa: BLE001 - every error becomes a status; context.abort raises
            _abort(context, exc, method.__qualname__)

    return wrapper


def streaming_rpc(method: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    """Wrap a response-streaming servicer method: responses already sent stay sent."""

    @functools.wraps(method)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            yield from method(self, request, context)
        except Exception as exc:  # noqa: BLE001 - every error becomes a status; context.abort raises
            _abort(context, exc, method.__qualname__)

    return wrapper


def join_items(items: Iterable[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """A streaming model's items as one answer: each output concatenated along its first axis.

    Used where the protocol has room for one response only (unary ``Predict`` and
    ``ModelInfer``, or ``return_single_response``).  Scalar items are stacked.
    Every item must carry the same outputs.
    """
    parts: dict[str, list[np.ndarray]] = {}
    names: list[str] | None = None
    for item in items:
        if names is None:
            names = list(item)
            parts = {n: [] for n in names}
        elif sorted(item) != sorted(names):
            raise ModelFailure(
                f"a streamed item has outputs {sorted(item)}, the first had {sorted(names)}; cannot join them"
            )
        for n in names:
            parts[n].append(np.atleast_1d(item[n]))
    if names is None:
        raise ModelFailure("the model's stream produced no items")
    try:
        return {n: np.concatenate(chunks, axis=0) for n, chunks in parts.items()}
    except ValueError as exc:
        raise ModelFailure(
            f"cannot join the model's streamed items along their first axis: {exc}"
        ) from None
