"""How an RPC reaches its servicer: handlers prepared once per method, and a lean thread pool.

gRPC's threaded server runs every RPC in its ``thread_pool``, and a server
interceptor runs on every call.  Both cost more than they need to:

- :class:`MethodTable` collects what the generated ``add_*_to_server``
  functions register, so the parsing that refuses a malformed message as
  ``INVALID_ARGUMENT`` (:mod:`.decoding`) wraps each method's handler once,
  when the server is built, instead of in an interceptor on every call; the
  server then finds each handler by its registered name.  Only the API key
  check (:mod:`servekit.server.auth`) stays an interceptor: it reads each call's
  metadata;
- :class:`LeanPool` is the ``thread_pool``: ``ThreadPoolExecutor.submit`` makes a
  ``Future`` with its own ``Condition`` (a lock and a waiter list) for each call,
  which gRPC only ever asks to run a callback once the call is done; here a call
  is a queue entry and a slot object, picked up by the next idle thread;
- :class:`UnaryReceive`: a unary call reaches the pool with its request message
  already read, so the pool's thread wakes once per call, not twice.
"""

from __future__ import annotations

import inspect
import logging
import queue
import threading
from collections.abc import Callable, Iterable
from concurrent import futures
from typing import Any

import grpc
from grpc import _server as grpc_server  # the threaded server's internals: see UnaryReceive
from grpc._cython import cygrpc

from servekit.protocols.grpc.decoding import DecodeInterceptor

log = logging.getLogger("servekit.grpc")


class MethodTable:
    """What ``add_*Servicer_to_server`` registers, by service: method name -> handler."""

    def __init__(self) -> None:
        self.services: dict[str, dict[str, grpc.RpcMethodHandler]] = {}

    def add_generic_rpc_handlers(self, handlers: Iterable[Any]) -> None:
        pass  # generated code (grpcio-tools >= 1.63) also registers every handler by name, below

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.services.setdefault(service, {}).update(handlers)

    def decoded(self) -> dict[str, dict[str, grpc.RpcMethodHandler]]:
        """Each handler wrapped by :class:`DecodeInterceptor`, once."""
        decode = DecodeInterceptor()

        def wrapped(service: str, name: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
            return decode.intercept_service(lambda _details: handler, _Details(f"/{service}/{name}"))

        return {
            service: {name: wrapped(service, name, handler) for name, handler in handlers.items()}
            for service, handlers in self.services.items()
        }

    def add_to(self, server: grpc.Server) -> None:
        """Register every method, parsing wrapped, on ``server``."""
        for service, handlers in self.decoded().items():
            server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
            server.add_registered_method_handlers(service, handlers)


class _Details:
    """The method name :class:`DecodeInterceptor` reads when the handlers are built."""

    __slots__ = ("method", "invocation_metadata")

    def __init__(self, method: str):
        self.method = method
        self.invocation_metadata = ()


class _Call:
    """One submitted call: what gRPC's server needs of its future (``add_done_callback``)."""

    __slots__ = ("function", "args", "kwargs", "callbacks", "done", "lock")

    def __init__(self, function: Callable[..., Any], args: tuple, kwargs: dict):
        self.function, self.args, self.kwargs = function, args, kwargs
        self.callbacks: list[Callable[[Any], Any]] = []
        self.done = False
        self.lock = threading.Lock()

    def add_done_callback(self, callback: Callable[[Any], Any]) -> None:
        with self.lock:
            if not self.done:
                self.callbacks.append(callback)
                return
        callback(self)

    def run(self) -> None:
        try:
            self.function(*self.args, **self.kwargs)
        except Exception:  # gRPC's call functions catch their own; keep the thread whatever
            log.exception("gRPC call failed outside its handler")
        finally:
            with self.lock:
                self.done = True
                callbacks, self.callbacks = self.callbacks, []
            for callback in callbacks:
                callback(self)

    def cancel(self) -> bool:
        return False

    def result(self, timeout: float | None = None) -> None:
        return None


class LeanPool(futures.ThreadPoolExecutor):
    """``max_workers`` threads taking calls from one queue; threads start as calls first need them.

    A ``ThreadPoolExecutor`` by type (what ``grpc.server`` expects), with ``submit`` and
    ``shutdown`` of its own.
    """

    def __init__(self, max_workers: int, thread_name_prefix: str = "servekit-grpc"):
        super().__init__(max_workers=1)  # the base's own machinery stays unused
        self.size = max_workers
        self.prefix = thread_name_prefix
        self.calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self.workers: list[threading.Thread] = []
        self.idle = 0
        self.lock = threading.Lock()
        self.closed = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        if self.closed:
            raise RuntimeError("cannot schedule new calls after shutdown")
        if UnaryReceive.applies(args):
            return UnaryReceive(self, fn, args, kwargs).call
        call = _Call(fn, args, kwargs)
        self.dispatch(call)
        return call

    def dispatch(self, call: _Call) -> None:
        """Hand ``call`` to an idle thread (starting one while the pool has room)."""
        with self.lock:
            if self.idle:
                self.idle -= 1
            elif len(self.workers) < self.size:
                thread = threading.Thread(target=self._work, name=f"{self.prefix}_{len(self.workers)}", daemon=True)
                self.workers.append(thread)
                thread.start()
        self.calls.put(call)

    def _work(self) -> None:
        calls = self.calls
        while True:
            call = calls.get()
            if call is None:
                return
            call.run()
            with self.lock:
                self.idle += 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self.lock:
            self.closed = True
            workers = list(self.workers)
        for _ in workers:
            self.calls.put(None)
        if wait:
            for thread in workers:
                thread.join()
        super().shutdown(wait=wait)


def _knows_unary_internals() -> bool:
    """Whether this grpcio's threaded server has the internals :class:`UnaryReceive` relies on, as 1.85 has them."""
    try:
        run = inspect.signature(grpc_server._unary_response_in_pool).parameters
        receive = inspect.signature(grpc_server._receive_message).parameters
        for name in ("_is_rpc_state_active", "_abort", "_CLOSED", "_EMPTY_FLAGS", "_RECEIVE_MESSAGE_TOKEN"):
            getattr(grpc_server, name)
    except (AttributeError, TypeError, ValueError):
        return False
    expected = ["rpc_event", "state", "behavior", "argument_thunk", "request_deserializer", "response_serializer"]
    return list(run) == expected and list(receive) == ["state", "call", "request_deserializer"]


class UnaryReceive:
    """A unary-request call whose message is read on gRPC's polling thread before the pool gets the call.

    The threaded server hands a unary call to the pool at once, and the pool's
    thread then asks for the request message and waits on the call's
    ``Condition`` until the polling thread has it: two wake-ups of the pool's
    thread and two passes of the GIL between the threads for each call.  Here
    the polling thread asks for the message itself (the same batch operation
    and callback the server uses) and hands the call to the pool from that
    callback: the pool's thread wakes once, with the message there.  The call
    then runs gRPC's own function, given the message by :meth:`request`.

    It relies on grpcio's private ``grpc._server`` functions; a grpcio where
    they differ (:func:`_knows_unary_internals`) keeps gRPC's own path.
    """

    ENABLED = _knows_unary_internals()

    __slots__ = ("pool", "rpc_event", "state", "call", "receive")

    @classmethod
    def applies(cls, args: tuple) -> bool:
        """``args`` (after ``context.run``) are those of the threaded server's unary-request call."""
        return cls.ENABLED and len(args) == 7 and args[0] is grpc_server._unary_response_in_pool

    def __init__(self, pool: LeanPool, fn: Callable[..., Any], args: tuple, kwargs: dict):
        self.pool = pool
        self.rpc_event, self.state = args[1], args[2]
        # gRPC's argument thunk (which would ask for the message in the pool) gives way to self.request
        self.call = _Call(fn, (*args[:4], self.request, *args[5:]), kwargs)
        state = self.state
        with state.condition:
            if not grpc_server._is_rpc_state_active(state):  # cancelled already: the call returns at once
                pool.dispatch(self.call)
                return
            self.receive = grpc_server._receive_message(state, self.rpc_event.call, args[5])
            self.rpc_event.call.start_server_batch(
                (cygrpc.ReceiveMessageOperation(grpc_server._EMPTY_FLAGS),), self.received
            )
            state.due.add(grpc_server._RECEIVE_MESSAGE_TOKEN)

    def received(self, event: Any) -> Any:
        """The message's batch completed (on the polling thread): record it as gRPC does, then queue the call."""
        try:
            return self.receive(event)
        finally:
            self.pool.dispatch(self.call)

    def request(self) -> Any:
        """The request message, or ``None`` (with the call ended) when the client sent none or went away."""
        state = self.state
        with state.condition:
            if state.request is not None:
                request, state.request = state.request, None
                return request
            if state.client is grpc_server._CLOSED:  # the client half-closed without a message
                details = f'"{self.rpc_event.call_details.method}" requires exactly one request message.'
                grpc_server._abort(state, self.rpc_event.call, cygrpc.StatusCode.unimplemented, details.encode())
            return None
