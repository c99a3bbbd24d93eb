"""The kinds of message a worker sends a model host, named once for both sides.

The worker's :mod:`.client` writes each kind and the host (:mod:`.host`, and
its batching :mod:`.loop`) dispatches on it, so neither side spells an op name
the other might spell differently, and a kind added on one side is a name the
other must handle.  On the socket the kind stays what it was, the string in
the header's ``"op"``: an enum member pickled would be twice the bytes and
three times the time of the string, on every request.
"""

from __future__ import annotations

import enum
from typing import Any


class Op(str, enum.Enum):
    """A message's kind: the header's ``"op"``; what the rest of the header holds for each."""

    #: a new connection's first message: the worker's ``pid`` and its two slabs (``in``, ``out``)
    HELLO = "hello"
    #: ``predict``: ``args`` [inputs]; ``kwargs`` parameters, signature_name, output_names, and
    #: ``arrival`` (when the request arrived in its worker: the host's queue time starts there)
    PREDICT = "predict"
    #: ``explain``: ``args`` [inputs]; ``kwargs`` parameters, signature_name
    EXPLAIN = "explain"
    #: any other hook: ``args`` [the hook's name]; ``kwargs`` the hook's own
    CALL = "call"
    #: the version is unloaded in this worker: the host stops counting it as attached
    DETACH = "detach"

    def header(self) -> dict[str, Any]:
        """A new message of this kind, its other fields to be added."""
        return {"op": self.value}  # the plain string: see the module's docstring

    @classmethod
    def of(cls, message: dict[str, Any]) -> Op | None:
        """A received message's kind; ``None`` for a kind this side does not know."""
        return _BY_NAME.get(message.get("op"))


_BY_NAME: dict[Any, Op] = {op.value: op for op in Op}
