"""Running the app under gunicorn, configured from :class:`Settings`.

Worker class ``gthread``: each worker process runs a pool of threads, so slow
requests and long SSE streams occupy a thread, not a whole process, and numpy,
scikit-learn, torch and TensorFlow release the GIL in their kernels.  gevent
would need monkey-patching that does not mix with torch/TensorFlow threads.
Each worker loads its own models after the fork unless ``--preload`` is set.
With ``--ports-after-load`` (``servekit tfserving`` sets it) a worker binds its
HTTP and gRPC ports only once its first load is over, as tensorflow_model_server
opens its ports after loading: no client reaches a worker whose models are
still LOADING (see :func:`hold_listeners`).

SIGTERM drains (docs/operations.md): each worker turns readiness to 503 at once,
keeps accepting for ``--shutdown-delay`` seconds (so load balancers stop sending
first), then stops accepting and lets in-flight requests and streams finish
within ``--drain-seconds``; the master waits that long before it kills.
Metrics from every worker meet in one multiprocess folder (observability/metrics.py).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gunicorn.app.base import BaseApplication
from gunicorn.errors import HaltServer

from servekit import hosts
from servekit.dataplane import shared_store
from servekit.observability import logging as log_setup
from servekit.observability import metrics
from servekit.server import gunicorn_errors

# The app's code (Flask, the protocols, the data plane) is imported here, in the master, before it
# forks: each worker starts with it (imported after the fork, every worker imported it again before
# its first answer), and the modules' pages are shared.
from servekit.server.app import create_app
from servekit.server.settings import Settings, worker_count

if TYPE_CHECKING:
    from servekit.control import ConfigFolders

log = logging.getLogger("servekit.server")


class ServekitApplication(BaseApplication):
    def __init__(self, settings: Settings, extra: dict[str, Any] | None = None):
        self.settings = settings
        self.extra = extra or {}
        self._control = None
        super().__init__()

    def load_config(self) -> None:
        s = self.settings
        options = {
            "bind": [f"{s.host}:{s.http_port}"],
            "workers": worker_count(s),
            "worker_class": "gthread",
            "threads": s.threads,
            # gunicorn's timeout kills a silent worker; requests have their own limit
            "timeout": max(120, int(s.request_timeout * 2)),
            "graceful_timeout": math.ceil(s.shutdown_delay + s.drain_seconds),
            "keepalive": 5,
            # each worker binds its own SO_REUSEPORT listener, so the kernel spreads new
            # connections over the workers; one shared listener let the first worker to
            # wake take every connection of a burst and keep it (keep-alive), leaving the
            # others idle (bench: 1,700 instead of 5,000 req/s at 8 connections)
            "reuse_port": True,
            # gunicorn's control socket lives at one path per user ($HOME/.gunicorn): two
            # servers would share it, and a read-only container home cannot hold it
            "control_socket_disable": True,
            "accesslog": None,
            "errorlog": "-",
            "loglevel": s.log_level,
            "preload_app": s.preload,
            "proc_name": "servekit",
            "post_fork": self._post_fork,
            "post_worker_init": self._post_worker_init,
            "worker_exit": self._worker_exit,
            "child_exit": self._child_exit,
            # request line and headers (docs/security.md): gunicorn answers 400/431 past them
            "limit_request_line": s.max_header_size,
            "limit_request_field_size": s.max_header_size,
            "limit_request_fields": s.max_headers,
            **security_options(s),
            **self.extra,
        }
        logger_class = log_setup.gunicorn_logger_class(s.log_format)
        if logger_class:
            options.setdefault("logger_class", logger_class)
        for key, value in options.items():
            self.cfg.set(key, value)

    def load(self):
        log_setup.configure(self.settings.log_format, self.settings.log_level)
        app = create_app(self.settings, start=not self.settings.preload)
        if self.settings.preload:
            # Load once in the master; workers share the pages copy-on-write and
            # each follows the control plane after the fork.
            self._control = app.extensions["servekit.control"]
            self._control.load_now()
        return app

    def _post_fork(self, server, worker) -> None:
        if self.settings.ports_after_load:
            hold_listeners(worker)
        if self._control is not None:
            self._control.start()

    def _post_worker_init(self, worker) -> None:
        gunicorn_errors.install()
        install_drain(worker, self.settings)
        if self.settings.ports_after_load:
            wait_first_load(worker)
        # gRPC beside HTTP: one server per worker, after the fork, over the worker's app
        if self.settings.grpc_port:
            from servekit.server import grpc_engine as grpc

            grpc.start_in_worker(worker, self.settings)
        if self.settings.ports_after_load:
            bind_held_listeners(worker)

    def _worker_exit(self, server, worker) -> None:
        from servekit.observability import statistics
        from servekit.server import grpc_engine as grpc

        grpc.stop_in_worker(worker)
        statistics.flush()
        metrics.flush()

    def _child_exit(self, server, worker) -> None:
        metrics.mark_process_dead(worker.pid)


def security_options(settings: Settings) -> dict[str, Any]:
    """TLS (:mod:`servekit.server.tls`) and the worker that times out slow headers (:mod:`.slow_clients`)."""
    from servekit.server import tls

    files = tls.files_of(settings, "http")
    options: dict[str, Any] = tls.gunicorn_options(files) if files else {}
    if settings.header_timeout > 0:
        from servekit.server import slow_clients

        slow_clients.HEADER_TIMEOUT = settings.header_timeout  # the workers fork from here
        slow_clients.BODY_TIMEOUT = settings.body_timeout if settings.body_timeout > 0 else 3600.0
        options["worker_class"] = "servekit.server.slow_clients.HeaderTimeoutWorker"
    return options


def hold_listeners(worker: Any) -> None:
    """``--ports-after-load``, right after the fork: close the HTTP listeners gunicorn just bound for this worker.

    With ``reuse_port`` every worker binds its own listeners before anything
    else runs in it, and the kernel hands new connections to any of them: a
    connection given to a worker still loading would wait in its backlog, and a
    client would find the port open before any model is. :func:`bind_held_listeners`
    binds them again once the worker's first load is over.  Without
    ``reuse_port`` (one listener shared from the master) the worker keeps it and
    only starts accepting after its load.
    """
    import socket

    from gunicorn import sock

    if not (worker.cfg.reuse_port and hasattr(socket, "SO_REUSEPORT")) or not worker.sockets:
        return
    sock.close_sockets(worker.sockets, unlink=False)
    worker.sockets = []
    worker.servekit_listeners_held = True


def wait_first_load(worker: Any) -> None:
    """``--ports-after-load``: wait in the worker's main thread for its first load, telling gunicorn it lives.

    gunicorn's heartbeat (``worker.notify``) keeps a long load from looking like
    a hung worker; SIGTERM meanwhile ends the worker (it has taken no request).
    """
    dataplane = worker.wsgi.extensions["servekit"]
    while not dataplane.wait_ready(1.0):
        worker.notify()
        if not worker.alive or dataplane.draining:
            raise SystemExit(0)


def bind_held_listeners(worker: Any) -> None:
    """Bind the HTTP listeners :func:`hold_listeners` closed; the worker accepts on them as it starts."""
    if not getattr(worker, "servekit_listeners_held", False):
        return
    from gunicorn import sock, util

    worker.sockets = sock.create_sockets(worker.cfg, worker.log)
    for listener in worker.sockets:
        util.close_on_exec(listener)
    worker.wait_fds = [*worker.sockets, worker.PIPE[0]]
    worker.servekit_listeners_held = False
    log.info("HTTP listening on %s after the first load (worker %d)", ", ".join(map(str, worker.sockets)), worker.pid)


def install_drain(worker: Any, settings: Settings) -> None:
    """Replace the worker's SIGTERM handler: readiness 503 first, stop accepting later.

    gunicorn's own handler stops accepting at once; ours marks the data plane
    draining (``/v2/health/ready`` answers 503) and hands over to gunicorn's
    after ``shutdown_delay`` seconds.  gunicorn then finishes every open
    connection within ``graceful_timeout`` (``drain_seconds``) and exits.
    """
    dataplane = worker.wsgi.extensions["servekit"]

    def on_sigterm(signum: int, frame: Any) -> None:
        if dataplane.draining:
            return
        dataplane.draining = True
        log.info(
            "SIGTERM: readiness is 503; accepting for %gs more, then %gs for in-flight requests",
            settings.shutdown_delay,
            settings.drain_seconds,
        )
        if settings.shutdown_delay > 0:
            timer = threading.Timer(settings.shutdown_delay, worker.handle_exit, (signum, frame))
            timer.daemon = True
            timer.start()
        else:
            worker.handle_exit(signum, frame)

    signal.signal(signal.SIGTERM, on_sigterm)


def prepare_server(settings: Settings, config_folders: ConfigFolders | None = None) -> Callable[[], None]:
    """Set up what every worker shares, in the master before it forks; returns the cleanup.

    The Prometheus multiprocess folder (before anything imports
    prometheus_client), the control plane's owner and, for ``--request-log-url sqlite``,
    a SQLite request log in a temporary folder shared by the workers.  A gunicorn config
    file of a container calls this at its top too (``SERVEKIT_REQUEST_LOG_URL`` carries
    the choice to ``servekit.server.wsgi``).  ``config_folders`` goes to the owner (see
    :func:`servekit.control.start_owner`).
    """
    metrics.prepare_multiprocess_dir()
    shared_store.prepare()  # the response cache and the quotas every worker shares
    log_setup.configure(settings.log_format, settings.log_level)  # this process's own lines: the control plane's
    # model hosts (servekit.hosts): one runtime folder for every worker; stopped after them
    hosts.prepare_server(settings.request_timeout, settings.placement)
    # the control plane's owner: one model set for every worker (servekit.control)
    close_control = start_control(settings, config_folders)
    own_logs = None
    if (settings.request_log_url or "").lower() == "sqlite":
        own_logs = tempfile.mkdtemp(prefix="servekit-logs-")
        settings.request_log_url = "sqlite:///" + os.path.join(own_logs, "requests.db")
        os.environ["SERVEKIT_REQUEST_LOG_URL"] = settings.request_log_url

    owner = os.getpid()

    def cleanup() -> None:
        # gunicorn forks its workers deep inside ``run``: a worker leaves by SystemExit through
        # the same ``finally`` and must not remove what its siblings and the next workers still
        # use (the metrics folder, the control socket, the request log)
        if os.getpid() != owner:
            return
        close_control()
        hosts.cleanup()
        metrics.remove_multiprocess_dir()
        shared_store.remove()
        if own_logs:
            shutil.rmtree(own_logs, ignore_errors=True)

    return cleanup


def start_control(settings: Settings, config_folders: ConfigFolders | None = None) -> Callable[[], None]:
    """The owner of the model set, in this process (it forks the workers and outlives them)."""
    from servekit.control import start_owner
    from servekit.folders.layout import discover, repository_roots
    from servekit.storage import prepare_paths
    from servekit.types import BatchingConfig

    prepare_paths(settings.paths)  # the owner fills the cache of s3://, gs://, https:// paths
    return start_owner(
        discover(settings.model_paths, settings.model_name),
        roots=repository_roots(settings.model_paths),
        batching=BatchingConfig(settings.max_batch_size, settings.max_batch_time_ms),
        explicit=settings.model_control_mode == "explicit",
        poll_interval=settings.poll_interval,
        memory_budget=settings.model_memory_budget,
        config_folders=config_folders,
    )


def run(settings: Settings, config_folders: ConfigFolders | None = None) -> None:
    """Serve until SIGTERM; the shared folders live as long as the server."""
    cleanup = prepare_server(settings, config_folders)
    try:
        ServekitApplication(settings).run()
    except HaltServer as exc:
        # gunicorn raises this out of its own halt when a second worker fails to boot while
        # the first one's failure stops the server: the same stop, without the traceback
        log.error("stopped: %s", exc.reason)
        raise SystemExit(exc.exit_status) from None
    finally:
        cleanup()
