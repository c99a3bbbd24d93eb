"""Requests that do not parse: ``INVALID_ARGUMENT`` with a clear message, not gRPC's ``INTERNAL``.

gRPC Python answers a request its deserializer cannot parse with ``INTERNAL``
("Exception deserializing request!"), which reads as a server fault.  This
interceptor takes the parsing over: each handler receives the raw bytes, parses
them itself, and a message that is not a valid protobuf of the method's request
type is refused as the client's error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc

from servekit.errors import BadRequest


class DecodeInterceptor(grpc.ServerInterceptor):
    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None or handler.request_deserializer is None:
            return handler
        return _decoding(handler, handler.request_deserializer, details.method)


def _decoding(handler: grpc.RpcMethodHandler, parse: Callable[[bytes], Any], method: str) -> grpc.RpcMethodHandler:
    def decode(raw: bytes) -> Any:
        try:
            return parse(raw)
        except Exception:  # protobuf's DecodeError, or anything a custom deserializer raises
            raise BadRequest(f"the request is not a valid message for {method}") from None

    def unary(raw: bytes, context: grpc.ServicerContext) -> Any:
        try:
            request = decode(raw)
        except BadRequest as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.message)
        return behavior(request, context)

    def streamed(raws: Iterator[bytes], context: grpc.ServicerContext) -> Any:
        # raised inside the servicer's loop: its error mapping (common.py) answers INVALID_ARGUMENT
        return behavior((decode(raw) for raw in raws), context)

    kwargs = {"request_deserializer": None, "response_serializer": handler.response_serializer}
    if handler.request_streaming:
        if handler.response_streaming:
            behavior = handler.stream_stream
            return grpc.stream_stream_rpc_method_handler(streamed, **kwargs)
        behavior = handler.stream_unary
        return grpc.stream_unary_rpc_method_handler(streamed, **kwargs)
    if handler.response_streaming:
        behavior = handler.unary_stream
        return grpc.unary_stream_rpc_method_handler(unary, **kwargs)
    behavior = handler.unary_unary
    return grpc.unary_unary_rpc_method_handler(unary, **kwargs)
