"""gunicorn settings for a servekit image: ``exec gunicorn -c gunicorn.conf.py servekit.server.wsgi:app``.

The choices ``servekit serve`` makes (``servekit.server.gunicorn_app``), read from the
same ``SERVEKIT_*`` variables through ``servekit.settings.resolve()``, so one set of
variables configures the container whichever way it starts.  ``GUNICORN_CMD_ARGS``
still overrides anything here.
"""

from servekit.settings import resolve

_settings = resolve()

bind = [f"{_settings.host}:{_settings.http_port}"]
workers = _settings.workers
# gthread: slow requests and SSE streams hold a thread, not a whole process.
worker_class = "gthread"
threads = _settings.threads
# gunicorn's timeout kills a silent worker; requests have their own limit.
timeout = max(120, int(_settings.request_timeout * 2))
graceful_timeout = 30
keepalive = 5
accesslog = None
errorlog = "-"
loglevel = _settings.log_level
preload_app = _settings.preload
proc_name = "servekit"


def post_worker_init(worker):
    """Each worker polls the model folders itself (also with preload) and serves gRPC beside HTTP."""
    worker.wsgi.extensions["servekit"].repository.start()
    if _settings.grpc_port:
        from servekit.protocols import grpc

        grpc.start_in_worker(worker, _settings)


def worker_exit(server, worker):
    from servekit.protocols import grpc

    grpc.stop_in_worker(worker)
