"""Running the app under granian: Rust HTTP in front of the same WSGI app (``--server granian``).

granian parses HTTP and manages connections in Rust and calls the WSGI app from
a pool of Python threads per worker process (``--threads``), so the Python
work per request is servekit's own.  Everything gunicorn gives servekit is
here too:

- workers fork from this process after the models load once (``--preload``),
  or load their own models after the fork;
- gRPC beside HTTP: one gRPC server per worker over the worker's data plane,
  started after the fork and stopped, with its in-flight RPCs, when the worker ends;
- SIGTERM drains: every worker turns readiness to 503 at once (SIGUSR1 from
  this process), keeps serving for ``--shutdown-delay`` seconds, then granian
  stops accepting and lets in-flight requests finish within ``--drain-seconds``;
- Prometheus metrics from every worker meet in the multiprocess folder
  :func:`servekit.server.gunicorn_app.prepare_server` sets up.

granian is an optional dependency (``pip install servekit[granian]``).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from servekit.observability import logging as log_setup
from servekit.observability import metrics
from servekit.server import tls
from servekit.server.gunicorn_app import prepare_server
from servekit.server.settings import Settings, worker_count

if TYPE_CHECKING:
    from servekit.control import ConfigFolders

log = logging.getLogger("servekit.server")

#: Connections one worker accepts at once (granian's backpressure); requests are bounded by limits.py.
CONNECTIONS_PER_WORKER = 1024

#: Sent by the main process to each worker at SIGTERM: readiness 503, keep serving.
DRAIN_SIGNAL = signal.SIGUSR1


def run(settings: Settings, config_folders: ConfigFolders | None = None) -> None:
    """Serve until SIGTERM under granian (``config_folders``: see :func:`servekit.control.start_owner`)."""
    try:
        from granian.constants import Interfaces
        from granian.server import MPServer
    except ImportError:
        raise SystemExit("servekit: --server granian needs granian: pip install 'servekit[granian]'") from None
    cleanup = prepare_server(settings, config_folders)
    try:
        server = _server_class(MPServer)(
            "servekit.server.wsgi:app",  # a label only: the app comes from the loader below
            address=settings.host,
            port=settings.http_port,
            interface=Interfaces.WSGI,
            websockets=False,  # WSGI has none
            respawn_failed_workers=True,  # a worker that dies is replaced, as gunicorn does
            workers=worker_count(settings),
            blocking_threads=settings.threads,
            # granian's backpressure bounds the connections a worker accepts, not its requests:
            # at --threads, keep-alive clients past that number held every slot and a new
            # connection (a readiness probe, a control call) waited in the backlog for good.
            # servekit's limits layer bounds the requests (--max-inflight, --max-queue).
            backpressure=max(settings.threads, CONNECTIONS_PER_WORKER),
            workers_kill_timeout=max(1, round(settings.drain_seconds)),
            log_level=settings.log_level if settings.log_level != "critical" else "error",
            **_security_options(settings),
        )
        server.servekit_settings = settings
        logging.getLogger("_granian").addFilter(_threads_notice)
        files = tls.files_of(settings, "http")
        if files is not None:  # granian's workers read the files when they start: respawn them
            tls.watch_files(files, server.signal_handler_reload)
        preloaded = _preload(settings)
        server.serve(
            spawn_target=_spawn_target(),
            target_loader=lambda _target: _worker_app(settings, preloaded),
            wrap_loader=True,
        )
    finally:
        cleanup()


def _security_options(settings: Settings) -> dict[str, Any]:
    """TLS (:mod:`servekit.server.tls`) and the header limits and read timeout of granian's HTTP/1."""
    from granian.http import HTTP1Settings

    files = tls.files_of(settings, "http")
    options: dict[str, Any] = tls.granian_options(files) if files else {}
    header_ms = int(settings.header_timeout * 1000) if settings.header_timeout > 0 else 30_000
    # granian's read buffer bounds the request line and headers together (431 past it)
    options["http1_settings"] = HTTP1Settings(
        header_read_timeout=header_ms, max_buffer_size=max(8192, settings.max_header_size * 8)
    )
    return options


def _threads_notice(record: logging.LogRecord) -> bool:
    """Drop granian's start-up warning that the WSGI thread pool is large for the cores.

    servekit sizes ``--threads`` (16) so that long SSE streams leave threads for
    ordinary calls.
    """
    return "Python threads" not in record.getMessage()


def _preload(settings: Settings) -> Any:
    """With ``--preload``, the app and its models load here once; workers share them copy-on-write."""
    if not settings.preload:
        return None
    from servekit.server.app import create_app

    log_setup.configure(settings.log_format, settings.log_level)
    app = create_app(settings, start=False)
    app.extensions["servekit.control"].load_now()
    return app


def _worker_app(settings: Settings, preloaded: Any) -> Any:
    """In each worker after the fork: the app, its polling, gRPC beside it, and the drain signal."""
    from servekit.server.app import create_app

    log_setup.configure(settings.log_format, settings.log_level)
    if preloaded is not None:
        app = preloaded
        app.extensions["servekit.control"].start()
    else:
        app = create_app(settings)
    dataplane = app.extensions["servekit"]

    def on_drain(signum: int, frame: Any) -> None:
        if not dataplane.draining:
            dataplane.draining = True
            log.info("SIGTERM: readiness is 503 in worker %d; in-flight requests finish", os.getpid())

    signal.signal(DRAIN_SIGNAL, on_drain)
    if settings.grpc_port:
        from servekit.server import grpc_engine as grpc

        _WORKER.wsgi, _WORKER.pid = app, os.getpid()
        grpc.start_in_worker(_WORKER, settings)
    return app


#: What the gRPC hooks expect of a worker (gunicorn's have ``wsgi`` and ``pid``).
_WORKER = SimpleNamespace(wsgi=None, pid=0, servekit_grpc=None)


def _spawn_target() -> Any:
    """granian's WSGI worker, followed by stopping this worker's gRPC server and its metrics."""
    from granian.server.mp import MPServer, WorkerProcess

    serve_wsgi = MPServer._spawn_wsgi_worker.__wrapped__

    @WorkerProcess.wrap_target
    def serve(*args: Any, **kwargs: Any) -> None:
        _wake_main_thread()
        try:
            serve_wsgi(*args, **kwargs)
        finally:
            from servekit.observability import statistics
            from servekit.server import grpc_engine as grpc

            grpc.stop_in_worker(_WORKER)
            statistics.flush()
            metrics.flush()
            metrics.mark_process_dead(os.getpid())

    return serve


#: Sent to the worker's own main thread, a few times a second, so it runs pending signal handlers.
WAKE_SIGNAL = signal.SIGUSR2
_WAKE_SECONDS = 0.25


def _wake_main_thread() -> None:
    """Let the worker's main thread notice SIGTERM whichever thread the kernel gave it to.

    granian's worker waits for its shutdown in the main thread, blocked on a lock;
    Python runs signal handlers only in the main thread, and the kernel may deliver
    a process's SIGTERM to any thread that does not block it — servekit's polling,
    statistics and request threads included.  The handler then waits until the main
    thread next wakes, which it never does: the worker hangs until it is killed.  A
    no-op signal sent to the main thread itself interrupts its wait, and the pending
    handlers run.
    """
    main = threading.get_ident()  # called from the worker's main thread, before granian serves
    signal.signal(WAKE_SIGNAL, lambda signum, frame: None)

    def wake() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, DRAIN_SIGNAL, WAKE_SIGNAL})
        while True:
            time.sleep(_WAKE_SECONDS)
            signal.pthread_kill(main, WAKE_SIGNAL)

    threading.Thread(target=wake, name="servekit-signal-wake", daemon=True).start()


def _server_class(base: type) -> type:
    class ServekitGranian(base):  # type: ignore[misc, valid-type, unused-ignore]  # older mypy refuses a variable base
        """granian's server with servekit's SIGTERM: readiness 503 first, stop accepting later."""

        servekit_settings: Settings
        _draining = False

        def signal_handler_interrupt(self, *args: Any, **kwargs: Any) -> None:
            if self._draining:
                return
            self._draining = True
            for worker in getattr(self, "wrks", []):
                pid = worker.inner.pid
                if pid:
                    try:
                        os.kill(pid, DRAIN_SIGNAL)
                    except ProcessLookupError:
                        pass
            delay = self.servekit_settings.shutdown_delay
            log.info(
                "SIGTERM: readiness is 503; accepting for %gs more, then %gs for in-flight requests",
                delay,
                self.servekit_settings.drain_seconds,
            )
            stop = super().signal_handler_interrupt
            if delay > 0:
                timer = threading.Timer(delay, stop)
                timer.daemon = True
                timer.start()
            else:
                stop()

    return ServekitGranian
