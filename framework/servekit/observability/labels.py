"""Which protocol and which served model a request path belongs to, without Flask.

Used for metric labels and request logs, also for requests the limits answer
before Flask runs.  Only names of served models are returned, so random names
from clients never become label values.
"""

from __future__ import annotations

from collections.abc import Container
from contextvars import ContextVar
from typing import Any

from servekit.routes import OPENAI_ROUTES

#: The version that answers the current request, set when the data plane resolves it
#: (the request log stores it; ``None`` until one is resolved).
answering_version: ContextVar[Any] = ContextVar("servekit_answering_version", default=None)

#: The OpenAI routes under ``/v1`` and bare (``/openai/...`` is told by its prefix).
OPENAI_PATHS = frozenset(prefix + route for prefix in ("/v1", "") for route in OPENAI_ROUTES)

#: Protocols whose POST requests are inference requests (logged with their predictions).
INFERENCE = frozenset({"v1", "v2", "openai", "generic"})


def protocol_of(path: str) -> str:
    if path.startswith("/v2/health"):
        return "health"
    if path == "/v2" or path.startswith("/v2/"):
        return "v2"
    if path in OPENAI_PATHS or path.startswith(("/openai/", "/models/")):
        return "openai"
    if path.startswith("/v1/models/"):
        return "v1"
    if path.startswith("/v1/logs/"):
        return "logs"
    if path in ("/predict", "/explain"):
        return "generic"
    if path == "/metrics" or path.startswith("/metrics/"):
        return "metrics"
    if path in ("/", "/docs", "/openapi.json"):
        return "ui"
    return "other"


def model_of(path: str, served: Container[str]) -> str:
    """The served model a V1/V2 path names, else ``""``."""
    for prefix in ("/v1/models/", "/v2/models/"):
        if path.startswith(prefix):
            rest = path[len(prefix) :]
            end = len(rest)
            for sep in ("/", ":"):
                i = rest.find(sep)
                if i != -1:
                    end = min(end, i)
            name = rest[:end]
            return name if name in served else ""
    return ""
