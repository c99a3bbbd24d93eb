"""Which protocol and which served model a request path belongs to, without Flask.

Used for metric labels and request logs, also for requests the limits answer
before Flask runs.  The paths are not spelled here: the route table
(:data:`servekit.routes.PROTOCOLS`, :data:`servekit.routes.MODEL_PREFIXES`) says
which protocol holds a path, so a route added there gets its label with nothing
to change here.  Only names of served models are returned, so random names from
clients never become label values.
"""

from __future__ import annotations

from collections.abc import Container
from contextvars import ContextVar
from typing import Any

from servekit.routes import MODEL_PREFIXES, PROTOCOLS

#: The version that answers the current request, set when the data plane resolves it
#: (the request log stores it; ``None`` until one is resolved).
answering_version: ContextVar[Any] = ContextVar("servekit_answering_version", default=None)

#: Protocols whose POST requests are inference requests (logged with their predictions).
INFERENCE = frozenset({"v1", "v2", "openai", "generic"})

#: The label of a path no route family holds.
OTHER = "other"


#: The route table flattened, as every request reads it (no method call per family).
_FAMILIES = tuple((family.paths, family.prefixes, family.label) for family in PROTOCOLS)


def protocol_of(path: str) -> str:
    """The label of the first route family that holds ``path`` (:data:`servekit.routes.PROTOCOLS`)."""
    for paths, prefixes, label in _FAMILIES:
        if path in paths or path.startswith(prefixes):
            return label
    return OTHER


def model_of(path: str, served: Container[str]) -> str:
    """The served model a V1/V2 path names, else ``""``."""
    for prefix in MODEL_PREFIXES:
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
