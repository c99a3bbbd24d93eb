"""``--server gunicorn|granian``: the HTTP engine that serves the one WSGI app.

Both run the same app (:func:`servekit.server.app.create_app`, with its fast
lane, limits and observability layers), gRPC beside HTTP in every worker, the
same SIGTERM drain and the same metrics folder; they differ in who parses HTTP.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from servekit.server.cpus import WORKERS_ENV
from servekit.server.settings import Settings, worker_count

if TYPE_CHECKING:
    from servekit.control import ConfigFolders

#: Artifacts whose loading starts no threads and no device context: safe to load before fork.
FORK_SAFE_ARTIFACTS = frozenset({"model.joblib", "model.pkl", "model.skops"})


def run(settings: Settings, config_folders: ConfigFolders | None = None) -> None:
    """Serve under the ``--server`` engine; ``config_folders`` goes to the control plane's owner
    (where a TF Serving config reload's models are served from: :func:`servekit.control.start_owner`)."""
    settings.preload = resolve_preload(settings)
    # framework plugins size their thread pools by it (servekit.server.cpus.cpus_per_worker)
    os.environ[WORKERS_ENV] = str(worker_count(settings))
    if settings.server == "granian":
        from servekit.server.granian_app import run as run_granian

        run_granian(settings, config_folders)
    else:
        from servekit.server.gunicorn_app import run as run_gunicorn

        run_gunicorn(settings, config_folders)


def resolve_preload(settings: Settings) -> bool:
    """``--preload`` as given, else auto: preload when it saves memory and is safe.

    Several workers share one copy of the models when they load before the fork.
    That is safe for scikit-learn artifacts; TensorFlow's runtime and CUDA do not
    survive a fork, torch's OpenMP pool may hang a child, and a ``model.py`` may
    import any of them, so those load in each worker.
    """
    if settings.preload is not None:
        return settings.preload
    if worker_count(settings) < 2:
        return False
    from servekit.dataplane.repository import discover

    folders = discover(settings.model_paths, settings.model_name)
    return all(_fork_safe(path) for path in folders.values())


def _fork_safe(model_folder: Path) -> bool:
    files = [p for p in model_folder.rglob("*") if p.is_file() and not p.name.startswith(".")]
    artifacts = {p.name for p in files} - {"servekit.yaml", "servekit.yml"}
    return bool(artifacts) and artifacts <= FORK_SAFE_ARTIFACTS
