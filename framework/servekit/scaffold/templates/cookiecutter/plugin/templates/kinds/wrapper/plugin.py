"""{{ cookiecutter.plugin_name }}: {{ cookiecutter.description }}

The worked hook is ``predict`` as a *wrapper*: it runs around every model's
predict, whichever plugin or ``model.py`` answers it, and counts calls and
failures per model class.  ``register_routes`` shows the counts at
``GET /-/{{ cookiecutter.entry_point }}``.  Counts are per gunicorn worker process.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from flask import Flask, jsonify

import servekit

_lock = threading.Lock()
predictions: Counter[str] = Counter()
failures: Counter[str] = Counter()


@servekit.hookimpl(wrapper=True)
def predict(name: str) -> Any:
    """Called around each predict of the model served as ``name``; ``yield`` runs the
    inner implementations and returns their result."""
    try:
        result = yield
    except Exception:
        with _lock:
            failures[name] += 1
        raise
    with _lock:
        predictions[name] += 1
    return result


@servekit.hookimpl
def register_routes(app: Flask) -> None:
    def counts():
        with _lock:
            return jsonify({"predictions": dict(predictions), "failures": dict(failures)})

    app.add_url_rule("/-/{{ cookiecutter.entry_point }}", "{{ cookiecutter.entry_point }}_counts", counts)
