"""Every route table in one place: what stays open, what skips the queue, what speaks OpenAI.

The API key (:mod:`servekit.server.auth`), the limits (:mod:`servekit.server.limits`), the
error renderer (:func:`servekit.errors.render`), the metric labels and the fast
lane (:mod:`servekit.server.fastlane`) all read these, so a route added here is
treated the same by each of them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

#: Default of ``--open-paths``: what stays open when ``--api-key`` is set: the health
#: probes (V2's, and KServe V1's liveness at ``/``) and the metrics.
OPEN_PATHS = ("/v2/health/", "/metrics", "/")

#: Paths that need the ``admin`` scope of an API key (:mod:`servekit.server.auth`): model
#: control (Triton's repository extension) and the request/prediction log.
ADMIN_PATHS = ("/v2/repository/", "/v1/logs/")

#: Paths that need the ``metrics`` scope (open by default, see :mod:`servekit.server.auth`).
METRICS_PATHS = ("/metrics", "/monitoring/prometheus/metrics")

#: Never queued or timed out by the limits: orchestrators must reach them under load.
UNQUEUED_PATHS = ("/v2/health/", "/metrics")

#: The OpenAI API is served under each of these prefixes ...
OPENAI_PREFIXES = ("/v1", "/openai/v1", "")
#: ... at each of these routes.
OPENAI_ROUTES = ("/completions", "/chat/completions", "/embeddings", "/models")

#: The inference routes the fast lane answers without Flask (``POST`` only), each
#: as Flask's rule matches it: ``<name>`` is one path segment, ``<path:target>`` any.
V2_INFER = re.compile(r"^/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer$")
V1_TARGET = re.compile(r"^/v1/models/(?P<target>.+)$")
GENERIC_PREDICT = "/predict"


def is_open_path(path: str, open_paths: Iterable[str] = OPEN_PATHS) -> bool:
    """``/x/`` opens everything under it, ``/x`` that path and below, ``/`` only the root."""
    for entry in open_paths:
        if entry == "/":
            if path == "/":
                return True
        elif entry.endswith("/"):
            if path.startswith(entry):
                return True
        elif path == entry or path.startswith(entry + "/"):
            return True
    return False


def is_openai_path(path: str) -> bool:
    """Whether ``path`` is one of the OpenAI routes (whose errors take OpenAI's shape)."""
    return any(path.startswith(prefix) and path[len(prefix) :] in OPENAI_ROUTES for prefix in OPENAI_PREFIXES)
