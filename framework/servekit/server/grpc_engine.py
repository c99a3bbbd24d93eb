"""Each worker's gRPC server, started and stopped with the worker by the HTTP engines.

Needs the ``grpc`` extra (``grpcio``, ``protobuf``), never TensorFlow.  Importing
this module does not import ``grpc``; :func:`start_in_worker` does, through
:mod:`servekit.server.grpc_server`, which assembles the services of
:mod:`servekit.protocols.grpc`.

Only a missing ``grpcio``/``protobuf`` turns gRPC off (with a warning, HTTP
still served).  Any other failure to start a requested gRPC port is the
worker's error: it stops with it, rather than answer ready over HTTP while
every gRPC client gets "connection refused".
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("servekit.grpc")

#: gunicorn's ``Arbiter.WORKER_BOOT_ERROR``: a worker exiting with it stops the whole server
#: (instead of being started again and again).
WORKER_BOOT_ERROR = 3

#: The distributions the gRPC server imports, by the module that tells they are installed.
REQUIRED = {"grpc": "grpcio", "google.protobuf": "protobuf"}


def missing_libraries() -> list[str]:
    """The ``grpc`` extra's distributions that are not installed (found without importing them)."""
    from servekit.hooks.manager import not_found

    return [REQUIRED[module] for module in not_found(REQUIRED)]


def start_in_worker(worker: Any, settings: Any) -> None:
    """Start this worker's gRPC server; without grpcio installed, warn and serve HTTP only.

    Readiness stays 503 in this worker until its gRPC server is up (with
    ``--grpc-after-load`` that is after the first load).
    """
    missing = missing_libraries()
    if missing:
        log.warning(
            "gRPC is off: %s not installed (install servekit[grpc], or pass --grpc-port 0)", " and ".join(missing)
        )
        return
    dataplane = worker.wsgi.extensions["servekit"]
    port = settings.grpc_port
    dataplane.readiness_gates.append(
        lambda: None if getattr(worker, "servekit_grpc", None) is not None else f"the gRPC port {port} is not open yet"
    )
    try:
        from servekit.server.grpc_server import start_in_worker as start
    except Exception as exc:  # grpcio is there, so this is a real fault: say which, and stop
        log.error("gRPC port %d cannot open: %s: %s", port, type(exc).__name__, exc, exc_info=exc)
        raise SystemExit(WORKER_BOOT_ERROR) from None
    start(worker, settings)


def stop_in_worker(worker: Any) -> None:
    if getattr(worker, "servekit_grpc", None) is not None:
        from servekit.server.grpc_server import stop_in_worker as stop

        stop(worker)
