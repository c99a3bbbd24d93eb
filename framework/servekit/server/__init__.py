"""The HTTP server: the Flask app factory and the gunicorn application.

The package imports nothing itself: a plugin that asks :mod:`servekit.server.cpus`
how many CPUs a worker has (a model host, ``servekit build``'s timing of a start)
does not load Flask and the data plane with it.  ``create_app`` is read from
:mod:`servekit.server.app` on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from servekit.server.app import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from servekit.server.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
