"""Building and running the gRPC server beside the HTTP app.

One ``grpc.Server`` per gunicorn worker, started after the fork (gRPC's core
does not survive a fork) from gunicorn's ``post_worker_init`` hook, over the
worker's own :class:`DataPlane`, so both protocols serve the same loaded
models.  Every worker binds ``--grpc-port`` with ``SO_REUSEPORT``; the kernel
spreads connections between them as it does for HTTP.

``--grpc-max-message-size`` caps messages both ways (``RESOURCE_EXHAUSTED``
above it).  With API keys (:mod:`servekit.server.auth`) every RPC except ``ServerLive`` and
``ServerReady`` needs the metadata ``authorization: Bearer KEY`` of a key with
the RPC's scope (``admin`` for model control and config reload, ``infer`` else).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import stat
import threading
from typing import Any

import grpc

from servekit.dataplane.data_plane import DataPlane
from servekit.errors import ServekitError
from servekit.observability import generation_metrics, tracing
from servekit.protocols.grpc import dispatch, shared_memory, tf_serving, v2
from servekit.protocols.grpc.tracing import TracingInterceptor
from servekit.server import quotas, tls
from servekit.server.auth import ApiKey, Quota
from servekit.server.settings import Settings, channel_arguments

log = logging.getLogger("servekit.grpc")

#: gunicorn's ``Arbiter.WORKER_BOOT_ERROR``: a worker exiting with it stops the server.
WORKER_BOOT_ERROR = 3

#: Health RPCs that stay open when an API key is set (as ``/v2/health/*`` over HTTP).
OPEN_METHODS = frozenset(
    {
        "/inference.GRPCInferenceService/ServerLive",
        "/inference.GRPCInferenceService/ServerReady",
    }
)

#: RPCs that need the ``admin`` scope of an API key (:mod:`servekit.server.auth`).
ADMIN_METHODS = frozenset(
    {
        "/inference.GRPCInferenceService/RepositoryIndex",
        "/inference.GRPCInferenceService/RepositoryModelLoad",
        "/inference.GRPCInferenceService/RepositoryModelUnload",
        "/tensorflow.serving.ModelService/HandleReloadConfigRequest",
    }
)


def server_options(settings: Settings) -> list[tuple[str, Any]]:
    size = settings.grpc_max_message_size
    return [
        ("grpc.max_receive_message_length", size),
        ("grpc.max_send_message_length", size),
        # several gunicorn workers bind the same port
        ("grpc.so_reuseport", 1),
        # TF Serving's --grpc_channel_arguments (servekit.cli.tfserving), after ours so they win
        *channel_arguments(settings.grpc_channel_arguments),
    ]


def add_services(server: Any, dataplane: DataPlane, settings: Settings, control: Any) -> None:
    """TF Serving's and V2's services, on a ``grpc.Server`` or a :class:`dispatch.MethodTable`."""
    tf_serving.add_to_server(
        server,
        dataplane,
        tensor_content=settings.grpc_tensor_content,
        control=control,
        model_control_mode=settings.model_control_mode,
    )
    v2.add_to_server(server, dataplane, model_control_mode=settings.model_control_mode, control=control)
    shared_memory.add_to_server(server, dataplane, control)


def build_server(dataplane: DataPlane, settings: Settings, control: Any = None) -> tuple[grpc.Server, int]:
    """A started ``grpc.Server`` on ``settings.host:settings.grpc_port``; returns it and its port.

    ``control`` is the app's :class:`servekit.control.ControlPlane` (model load, unload and
    TF Serving's config reload); without one those RPCs answer ``UNAVAILABLE``.

    :raises RuntimeError: the port cannot be bound.
    """
    keys = ApiKey.from_settings(settings)
    # Parsing is wrapped once per method (dispatch.MethodTable); only the key check reads each call.
    table = dispatch.MethodTable()
    add_services(table, dataplane, settings, control)
    interceptors: list[grpc.ServerInterceptor] = [ApiKeyInterceptor(keys)] if keys is not None else []
    if tracing.configure():  # outermost: the span covers the key check and decoding too
        interceptors.insert(0, TracingInterceptor())
    server = grpc.server(
        dispatch.LeanPool(max(2, settings.grpc_threads or settings.threads)),
        options=server_options(settings),
        interceptors=interceptors,
    )
    table.add_to(server)
    host = settings.host
    address = f"[{host}]:{settings.grpc_port}" if ":" in host else f"{host}:{settings.grpc_port}"
    files = tls.files_of(settings, "grpc")
    try:
        port = (
            server.add_secure_port(address, tls.grpc_credentials(files)) if files else server.add_insecure_port(address)
        )
    except RuntimeError:
        port = 0
    if not port:
        server.stop(None)
        raise RuntimeError(
            f"cannot bind gRPC to {address}: port {settings.grpc_port} is in use or not allowed "
            "(another server holds it?); choose a free port with --grpc-port"
        )
    _bind_unix_socket(server, settings.grpc_socket_path)
    server.start()
    return server, port


def _bind_unix_socket(server: grpc.Server, path: str) -> None:
    """TF Serving's ``--grpc_socket_path``: also listen on a Unix socket (the last worker's).

    Workers start at the same time, and gRPC's remove-then-bind of the path is
    not atomic: two workers interleaving it fail with "address in use".  A lock
    on the socket's folder makes each worker's remove-and-bind whole.
    """
    if not path:
        return
    folder = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.stat(path).st_mode):
                os.unlink(path)  # the previous worker's: the last one to start answers on the path
        try:
            bound = server.add_insecure_port(f"unix:{path}")
        except RuntimeError:  # gRPC's own, naming no flag
            bound = 0
    finally:
        os.close(folder)  # releases the lock
    if not bound:
        raise RuntimeError(
            f"cannot bind gRPC to the Unix socket {path} (--grpc-socket-path): a file that is not a socket is in the way, or the folder is not writable"
        )


def method_scope(method: str) -> str:
    """The API key scope an RPC needs: model control and config reload are ``admin``."""
    return "admin" if method in ADMIN_METHODS else "infer"


class ApiKeyInterceptor(grpc.ServerInterceptor):
    """Refuse RPCs without ``authorization: Bearer KEY`` (UNAUTHENTICATED) or with a key lacking
    the RPC's scope (PERMISSION_DENIED); health RPCs excepted."""

    def __init__(self, keys: ApiKey | str):
        self.keys = keys if isinstance(keys, ApiKey) else ApiKey(keys)
        self._quotas: quotas.Quotas | None = None  # made on the first call of a bounded key

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler_call_details.method in OPEN_METHODS:
            return handler
        given = dict(handler_call_details.invocation_metadata or ()).get("authorization", "")
        try:
            self.keys.require(
                method_scope(handler_call_details.method), str(given), "send metadata 'authorization: Bearer <key>'"
            )
        except ServekitError as refused:
            return _refusal(handler, getattr(grpc.StatusCode, refused.grpc_code), refused.message)
        quota = self.keys.quota_of(str(given))
        if quota is None:
            return handler
        if self._quotas is None:
            self._quotas = quotas.Quotas()
        return _bounded(handler, self._quotas, quota)


def _bounded(handler: grpc.RpcMethodHandler, counts: quotas.Quotas, quota: Quota) -> grpc.RpcMethodHandler:
    """``handler`` held by a key's quota: admitted or refused ``RESOURCE_EXHAUSTED``; its place freed at its end."""

    def admit(context: grpc.ServicerContext) -> tuple[int, list[int]]:
        row, exhausted, standing = counts.admit(quota)
        if row is None:
            error, seconds = quotas.refusal(quota, exhausted, standing)
            context.set_trailing_metadata((("retry-after", str(seconds)),))
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, error.message)
            raise AssertionError("unreachable: abort raises")
        quotas.admitted(quota)
        return row, generation_metrics.count_tokens()

    def whole(behavior: Any) -> Any:
        def call(request: Any, context: grpc.ServicerContext) -> Any:
            row, charged = admit(context)
            try:
                return behavior(request, context)
            finally:
                quotas.charge(counts, quota, row, charged)

        return call

    def streamed(behavior: Any) -> Any:
        def call(request: Any, context: grpc.ServicerContext) -> Any:
            row, charged = admit(context)
            try:
                yield from behavior(request, context)
            finally:
                quotas.charge(counts, quota, row, charged)

        return call

    kwargs = {"request_deserializer": handler.request_deserializer, "response_serializer": handler.response_serializer}
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(streamed(handler.stream_stream), **kwargs)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(whole(handler.stream_unary), **kwargs)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(streamed(handler.unary_stream), **kwargs)
    return grpc.unary_unary_rpc_method_handler(whole(handler.unary_unary), **kwargs)


def _refusal(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    def deny(request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(code, message)

    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny, **kwargs)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny, **kwargs)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny, **kwargs)
    return grpc.unary_unary_rpc_method_handler(deny, **kwargs)


# -- gunicorn hooks ------------------------------------------------------------------------


def start_in_worker(worker: Any, settings: Settings) -> None:
    """gunicorn ``post_worker_init``: serve gRPC from this worker's data plane.

    With ``--grpc-after-load`` the port opens once the worker's first load is
    done (in a thread, so the worker's HTTP side boots meanwhile), as
    tensorflow_model_server opens its ports only after loading: a client that
    waits for the port never finds a model still LOADING.  With
    ``--ports-after-load`` gunicorn's worker has waited for that load already
    (:func:`servekit.server.gunicorn_app.wait_first_load`): the port opens now,
    before the HTTP listeners.
    """
    after_load = settings.grpc_after_load or settings.ports_after_load
    if after_load and not worker.wsgi.extensions["servekit"].wait_ready(0):
        threading.Thread(
            target=_start_after_load, args=(worker, settings), name="servekit-grpc-start", daemon=True
        ).start()
        return
    _start(worker, settings)


def _start_after_load(worker: Any, settings: Settings) -> None:
    worker.wsgi.extensions["servekit"].wait_ready()
    try:
        _start(worker, settings)
    except SystemExit as exc:
        os._exit(int(exc.code or WORKER_BOOT_ERROR))


def _start(worker: Any, settings: Settings) -> None:
    app = worker.wsgi
    try:
        server, port = build_server(app.extensions["servekit"], settings, app.extensions.get("servekit.control"))
    except RuntimeError as exc:
        # A server without its gRPC port is broken, not degraded: stop, in one line.
        # gunicorn halts the whole server when a worker exits with this status
        # instead of starting it again and again.
        log.error("%s", exc)
        raise SystemExit(WORKER_BOOT_ERROR) from None
    worker.servekit_grpc = server
    log.info("gRPC listening on %s:%d (worker %d)", settings.host, port, worker.pid)


def stop_in_worker(worker: Any, grace: float = 5.0) -> None:
    """gunicorn ``worker_exit``: let running RPCs finish, up to ``grace`` seconds."""
    server = getattr(worker, "servekit_grpc", None)
    if server is not None:
        server.stop(grace).wait(grace + 1)
