"""How an RPC reaches its servicer: handlers prepared once per method, and a lean thread pool.

gRPC's threaded server runs every RPC in its ``thread_pool``, and a server
interceptor runs on every call.  Both cost more than they need to:

- :class:`MethodTable` collects what the generated ``add_*_to_server``
  functions register, so the parsing that refuses a malformed message as
  ``INVALID_ARGUMENT`` (:mod:`.decoding`) wraps each method's handler once,
  when the server is built, instead of in an interceptor on every call; the
  server then finds each handler by its registered name.  Only the API key
  check (:mod:`servekit.auth`) stays an interceptor: it reads each call's
  metadata;
- :class:`LeanPool` is the ``thread_pool``: ``ThreadPoolExecutor.submit`` makes a
  ``Future`` with its own ``Condition`` (a lock and a waiter list) for each call,
  which gRPC only ever asks to run a callback once the call is done; here a call
  is a queue entry and a slot object, picked up by the next idle thread.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterable
from concurrent import futures
from typing import Any

import grpc

from .decoding import DecodeInterceptor

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
        call = _Call(fn, args, kwargs)
        with self.lock:
            if self.idle:
                self.idle -= 1
            elif len(self.workers) < self.size:
                thread = threading.Thread(target=self._work, name=f"{self.prefix}_{len(self.workers)}", daemon=True)
                self.workers.append(thread)
                thread.start()
        self.calls.put(call)
        return call

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
