"""The WSGI app a container runs directly: ``gunicorn -c gunicorn.conf.py servekit.server.wsgi:app``.

Settings come from the environment only (``SERVEKIT_*``, TF Serving's
``MODEL_NAME``/``MODEL_BASE_PATH``, or a file named by ``SERVEKIT_CONFIG``), so an
image is configured without changing its command.  Models load in each worker
after the fork, or once in the master with ``SERVEKIT_PRELOAD=1``; the gunicorn
config's ``post_worker_init`` then starts every worker's polling.
"""

from __future__ import annotations

from servekit.observability import logging as log_setup
from servekit.server.app import create_app
from servekit.server.settings import resolve

settings = resolve()
if not settings.paths:
    raise RuntimeError("no model path: set SERVEKIT_PATHS (comma-separated) or MODEL_BASE_PATH")
log_setup.configure(settings.log_format, settings.log_level)
app = create_app(settings, start=not settings.preload)
if settings.preload:
    app.extensions["servekit.control"].load_now()
