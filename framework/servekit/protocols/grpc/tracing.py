"""A server span per RPC, continuing the caller's W3C ``traceparent`` from the gRPC metadata.

Installed only while traces are on (:mod:`servekit.observability.tracing`); a
streamed answer's span ends with its last message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc

from servekit.observability import tracing


class TracingInterceptor(grpc.ServerInterceptor):
    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None:
            return handler
        return _traced(handler, details.method, details.invocation_metadata or ())


def _traced(handler: grpc.RpcMethodHandler, method: str, metadata: Any) -> grpc.RpcMethodHandler:
    carrier = {key: value for key, value in metadata if key in ("traceparent", "tracestate", "baggage")}
    service, _, name = method.lstrip("/").rpartition("/")
    attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}

    def start() -> tracing.ServerSpan:
        return tracing.ServerSpan(method.lstrip("/"), carrier, dict(attributes))

    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(_streamed(handler.stream_stream, start), **kwargs)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(_unary(handler.stream_unary, start), **kwargs)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(_streamed(handler.unary_stream, start), **kwargs)
    return grpc.unary_unary_rpc_method_handler(_unary(handler.unary_unary, start), **kwargs)


def _unary(behavior: Callable, start: Callable[[], tracing.ServerSpan]) -> Callable:
    def call(request: Any, context: grpc.ServicerContext) -> Any:
        span = start()
        error = None
        try:
            with span.current():
                return behavior(request, context)
        except BaseException as exc:
            error = exc
            raise
        finally:
            _finish(span, context, error)

    return call


def _streamed(behavior: Callable, start: Callable[[], tracing.ServerSpan]) -> Callable:
    def call(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        span = start()
        error = None
        try:
            with span.current():
                answers = iter(behavior(request, context))
            while True:
                with span.current():  # each answer is made under the RPC's span
                    try:
                        answer = next(answers)
                    except StopIteration:
                        return
                yield answer
        except BaseException as exc:
            error = exc
            raise
        finally:
            _finish(span, context, error)  # the stream's end, or the client gone

    return call


def _finish(span: tracing.ServerSpan, context: grpc.ServicerContext, error: BaseException | None) -> None:
    code = context.code() if hasattr(context, "code") else None
    failed = error is not None or (code is not None and code != grpc.StatusCode.OK)
    span.end(
        error=(str(error) if error is not None else str(code)) if failed else None,
        attributes={"rpc.grpc.status_code": code.value[0] if code is not None else (2 if error else 0)},
    )
