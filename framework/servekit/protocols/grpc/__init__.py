"""gRPC: TF Serving's ``PredictionService``/``ModelService`` and V2's ``GRPCInferenceService``.

Needs the ``grpc`` extra (``grpcio``, ``protobuf``), never TensorFlow: the
messages are servekit's own (``protos/``), wire-compatible with the public APIs.
Importing this package does not import ``grpc``; :func:`start_in_worker` does.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("servekit.grpc")


def start_in_worker(worker: Any, settings: Any) -> None:
    """Start this gunicorn worker's gRPC server; without grpcio installed, warn and serve HTTP only."""
    try:
        from .server import start_in_worker as start
    except ImportError as exc:
        log.warning("gRPC is off: %s (install servekit[grpc], or pass --grpc-port 0)", exc)
        return
    start(worker, settings)


def stop_in_worker(worker: Any) -> None:
    if getattr(worker, "servekit_grpc", None) is not None:
        from .server import stop_in_worker as stop

        stop(worker)
