"""Every route table in one place: what stays open, what skips the queue, what speaks which protocol.

The API key (:mod:`servekit.server.auth`), the limits (:mod:`servekit.server.limits`), the
error renderer (:func:`servekit.errors.render`), the metric labels
(:mod:`servekit.observability.labels`) and the fast lane (:mod:`servekit.server.fastlane`)
all read these, so a route added here is treated the same by each of them.  Each
path is spelled once, as the blueprint that serves it mounts it; the tables below
are made of those names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

# -- where each protocol's routes live ------------------------------------------------------

V2_ROOT = "/v2"
#: V2's probes (``/v2/health/live``, ``/v2/health/ready``)
V2_HEALTH = "/v2/health"
#: Triton's model repository extension (load, unload, index)
V2_REPOSITORY = "/v2/repository/"
V2_MODELS = "/v2/models/"
#: TF Serving's REST API (KServe V1): ``/v1/models/NAME[...]``
V1_MODELS = "/v1/models/"
#: the request and prediction log's API (``servekit logs`` reads it)
LOGS = "/v1/logs/"
METRICS = "/metrics"
#: TF Serving's metrics path (its ``--monitoring_config_file``)
PROMETHEUS_METRICS = "/monitoring/prometheus/metrics"
GENERIC_PREDICT = "/predict"
GENERIC_EXPLAIN = "/explain"
#: Hugging Face text-embeddings-inference's routes (``/predict`` is GENERIC_PREDICT's, told apart by its body)
TEI_ROUTES = ("/embed", "/rerank", "/similarity", "/tokenize", "/decode", "/info", "/health")
#: vLLM's score, its Jina/Cohere-compatible rerank and its detokenize (its tokenize is TEI's route)
SCORE_ROUTES = ("/score", "/v1/score", "/v1/rerank", "/v2/rerank", "/detokenize")
#: the status page, the OpenAPI document and its viewer
PAGES = ("/", "/docs", "/openapi.json")

#: The OpenAI API is served under each of these prefixes ...
OPENAI_PREFIXES = ("/v1", "/openai/v1", "")
#: ... at each of these routes ...
OPENAI_ROUTES = ("/completions", "/chat/completions", "/responses", "/embeddings", "/models")
#: ... and everything under ``/openai/``, and OpenAI's model document bare at ``/models/NAME``.
OPENAI_ROOT = "/openai/"
OPENAI_MODEL = "/models/"

# -- what each part does with them ----------------------------------------------------------

#: Default of ``--open-paths``: what stays open when ``--api-key`` is set: the health
#: probes (V2's, and KServe V1's liveness at ``/``) and the metrics.
OPEN_PATHS = (V2_HEALTH + "/", METRICS, "/")

#: Paths that need the ``admin`` scope of an API key (:mod:`servekit.server.auth`): model
#: control (Triton's repository extension) and the request/prediction log.
ADMIN_PATHS = (V2_REPOSITORY, LOGS)

#: Paths that need the ``metrics`` scope (open by default, see :mod:`servekit.server.auth`).
METRICS_PATHS = (METRICS, PROMETHEUS_METRICS)

#: Never queued or timed out by the limits: orchestrators must reach them under load.
UNQUEUED_PATHS = (V2_HEALTH + "/", METRICS)

#: The inference routes the fast lane answers without Flask (``POST`` only), each
#: as Flask's rule matches it: ``<name>`` is one path segment, ``<path:target>`` any.
V2_INFER = re.compile(rf"^{re.escape(V2_MODELS)}(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer$")
V1_TARGET = re.compile(rf"^{re.escape(V1_MODELS)}(?P<target>.+)$")

#: The paths whose next segment names a model (V1's and V2's), for the metric labels.
MODEL_PREFIXES = (V1_MODELS, V2_MODELS)


@dataclass(frozen=True)
class Family:
    """The paths of one protocol (or one part of the server), under one metric label."""

    label: str
    #: exact paths
    paths: frozenset[str] = frozenset()
    #: and every path that starts with one of these
    prefixes: tuple[str, ...] = ()


#: Which protocol a path belongs to: the first family that holds it.  The probes (and
#: the retrieval routes, ``/v2/rerank`` among them) come before the rest of V2, and OpenAI's ``/v1/models`` (exact) before TF Serving's
#: ``/v1/models/NAME``; a path no family holds is ``other``.
PROTOCOLS = (
    Family("health", prefixes=(V2_HEALTH,)),
    Family("retrieval", frozenset(TEI_ROUTES + SCORE_ROUTES)),
    Family("v2", frozenset({V2_ROOT}), (V2_ROOT + "/",)),
    Family(
        "openai",
        frozenset(prefix + route for prefix in OPENAI_PREFIXES for route in OPENAI_ROUTES),
        (OPENAI_ROOT, OPENAI_MODEL),
    ),
    Family("v1", prefixes=(V1_MODELS,)),
    Family("logs", prefixes=(LOGS,)),
    Family("generic", frozenset({GENERIC_PREDICT, GENERIC_EXPLAIN})),
    Family("metrics", frozenset({METRICS}), (METRICS + "/",)),
    Family("ui", frozenset(PAGES)),
)


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
