"""Running the app under gunicorn, configured from :class:`Settings`.

Worker class ``gthread``: each worker process runs a pool of threads, so slow
requests and long SSE streams occupy a thread, not a whole process, and numpy,
scikit-learn, torch and TensorFlow release the GIL in their kernels.  gevent
would need monkey-patching that does not mix with torch/TensorFlow threads.
Each worker loads its own models after the fork unless ``--preload`` is set.
"""

from __future__ import annotations

import logging
from typing import Any

from gunicorn.app.base import BaseApplication

from ..settings import Settings


class ServekitApplication(BaseApplication):
    def __init__(self, settings: Settings, extra: dict[str, Any] | None = None):
        self.settings = settings
        self.extra = extra or {}
        self._dataplane = None
        super().__init__()

    def load_config(self) -> None:
        s = self.settings
        options = {
            "bind": [f"{s.host}:{s.http_port}"],
            "workers": s.workers,
            "worker_class": "gthread",
            "threads": s.threads,
            # gunicorn's timeout kills a silent worker; requests have their own limit
            "timeout": max(120, int(s.request_timeout * 2)),
            "graceful_timeout": 30,
            "keepalive": 5,
            "accesslog": None,
            "errorlog": "-",
            "loglevel": s.log_level,
            "preload_app": s.preload,
            "proc_name": "servekit",
            "post_fork": self._post_fork,
            "post_worker_init": self._post_worker_init,
            "worker_exit": self._worker_exit,
            **self.extra,
        }
        for key, value in options.items():
            self.cfg.set(key, value)

    def load(self):
        from .app import create_app

        logging.basicConfig(
            level=self.settings.log_level.upper(),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        app = create_app(self.settings, start=not self.settings.preload)
        if self.settings.preload:
            # Load once in the master; workers share the pages copy-on-write and
            # each starts its own polling thread after the fork.
            self._dataplane = app.extensions["servekit"]
            self._dataplane.repository.load_now()
        return app

    def _post_fork(self, server, worker) -> None:
        if self._dataplane is not None:
            self._dataplane.repository.start()

    def _post_worker_init(self, worker) -> None:
        # gRPC beside HTTP: one server per worker, after the fork, over the worker's app
        if self.settings.grpc_port:
            from ..protocols import grpc

            grpc.start_in_worker(worker, self.settings)

    def _worker_exit(self, server, worker) -> None:
        from ..protocols import grpc

        grpc.stop_in_worker(worker)


def run(settings: Settings) -> None:
    ServekitApplication(settings).run()
