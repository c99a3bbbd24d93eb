"""The model host process: one model version, its batcher and hooks, behind a Unix socket.

Started by :mod:`servekit.hosts.client` as ``python -m servekit.hosts.host SPEC``.
It loads the version exactly as a worker would (plugins, ``model.py``, the
version's ``servekit.yaml``), then serves every HTTP worker and gRPC server of
the server through a :class:`~servekit.dataplane.executor.LocalExecutor`, as a
worker runs a version loaded in it (this is the other side of the workers'
:class:`~servekit.hosts.client.HostClient`), so the adaptive batcher sees the
requests of all of them and the hooks run here.

A worker holds a connection for one call at a time.  A version that batches
is served by one event loop (:mod:`.loop`): it reads every connection's
requests and runs those that wait together in shared calls, the way a Triton
model instance takes its dynamic batches; any other version gets one thread
per connection, so its calls run side by side as in a worker's threads.
The host exits when the server's owner process is gone (``kill -9`` of the
server), when the workers that use it have detached (the version was
unloaded), or after SIGTERM once no worker is left (the HTTP side drains first).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servekit.control import long_lived
from servekit.hooks.specs import hookimpl
from servekit.hosts import channel, runtime
from servekit.hosts.calls import Op
from servekit.observability import tracing

if TYPE_CHECKING:  # imported when the host loads its version, after its watcher started
    from servekit.dataplane.executor import LocalExecutor

log = logging.getLogger("servekit.hosts")

#: After SIGTERM, the longest a host waits for its workers to finish.
TERM_LIMIT = 120.0


class Host:
    #: runs the workers' calls on the version (set by :meth:`load`)
    executor: LocalExecutor

    def __init__(self, spec: dict[str, Any]):
        self.spec = spec
        self.label = f"{spec['name']} version {spec['version']} (replica {spec['replica']})"
        #: worker pids using this host: added on a connection's hello, removed on detach or death
        #: (not when a connection closes: a worker drops a spoiled connection and makes another)
        self.attached: set[int] = set()
        self.ever_attached = False
        self.in_flight = 0
        self.terminating_since: float | None = None
        self.lock = threading.Lock()
        self.slab_prefix = runtime.shm_prefix(os.getpid()) + "h"
        self.mv: Any = None
        self.gauges: Any = None

    # -- start ---------------------------------------------------------------

    def load(self) -> None:
        from servekit.dataplane.executor import LocalExecutor
        from servekit.dataplane.repository import ModelRepository
        from servekit.hooks import manager as plugins
        from servekit.observability import host_metrics, load, metrics
        from servekit.types import BatchingConfig

        load.serving_in_host()  # the worker that handed a request over counts its arrival
        spec = self.spec
        pm = plugins.build_manager(spec["plugins"])
        pm.register(metrics.BatchSizePlugin(None), name="servekit.metrics")  # type: ignore[arg-type]
        pm.register(_HostRows(self), name="servekit.hosts")
        repo = ModelRepository(
            {spec["name"]: Path(spec["base_path"])},
            pm,
            poll_interval=0,
            batching=BatchingConfig(*spec["batching"]),
        )
        self.mv = repo.load_one(
            spec["name"], spec["version"], Path(spec["path"]), spec["fingerprint"], spec.get("config") or {}
        )
        if not self.mv.ready:
            raise RuntimeError(self.mv.error or "the model did not load")
        self.executor = LocalExecutor()  # the calls go to it directly: no data plane in between
        tracing.configure()  # the OTEL_* variables the server was started with
        self.gauges = host_metrics.host_metrics(spec["name"], str(spec["version"]), str(spec["replica"]))
        long_lived.settle()  # the host holds this one model for its whole life

    def serve(self, sock_path: str) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        tmp = sock_path + ".new"
        if os.path.exists(tmp):
            os.unlink(tmp)
        listener.bind(tmp)
        listener.listen(1024)
        os.rename(tmp, sock_path)  # the socket appears only once it accepts
        from servekit.dataplane import batching

        batcher = batching.batcher_for(self.mv)
        log.info(
            "model host for %s serving (pid %d, %s)",
            self.label,
            os.getpid(),
            "batching loop" if batcher else "a thread per connection",
        )
        if batcher is not None:
            from servekit.hosts.loop import Loop

            Loop(self, listener).run()
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    # -- one connection ------------------------------------------------------------

    def _connection(self, conn: socket.socket) -> None:
        pid = 0
        slabs: dict[str, channel.Slab] = {}
        try:
            framer = channel.Framer(conn)
            hello = framer.read()
            if Op.of(hello) is not Op.HELLO:
                return
            pid, slabs = self.greet(conn, hello)
            while True:
                request = framer.read()
                if Op.of(request) is Op.DETACH:
                    self.detach(pid)
                    channel.send(conn, {"ok": True})
                    continue
                self.answer(conn, request, slabs)
        except (channel.PeerGone, OSError, EOFError):
            pass
        finally:
            for slab in slabs.values():
                slab.close()
            conn.close()

    def greet(self, conn: socket.socket, hello: dict[str, Any]) -> tuple[int, dict[str, channel.Slab]]:
        """A worker's first message: map its slabs, count it attached, send the metadata."""
        pid = int(hello["pid"])
        slabs = {"in": channel.Slab.attach(hello["in"]), "out": channel.Slab.attach(hello["out"])}
        self._attach(pid)
        channel.send(conn, {"ok": True, "pid": os.getpid(), "metadata": self.mv.metadata})
        return pid, slabs

    @staticmethod
    def take_slab(request: dict[str, Any], slabs: dict[str, channel.Slab]) -> None:
        if "in" in request:  # the worker needed a bigger request slab
            slabs["in"].close()
            slabs["in"] = channel.Slab.attach(request["in"])

    def answer(self, conn: socket.socket, request: dict[str, Any], slabs: dict[str, channel.Slab]) -> None:
        if tracing.ON and request.get("trace"):
            with tracing.continued(request["trace"], "servekit.host.serve", self.span_attributes()):
                self._answer(conn, request, slabs)
            return
        self._answer(conn, request, slabs)

    def span_attributes(self) -> dict[str, Any]:
        """What a host's span says about where it ran."""
        return {
            tracing.HOST_PID: os.getpid(),
            tracing.HOST_REPLICA: int(self.spec["replica"]),
            tracing.MODEL: self.spec["name"],
            tracing.VERSION: str(self.spec["version"]),
        }

    def _answer(self, conn: socket.socket, request: dict[str, Any], slabs: dict[str, channel.Slab]) -> None:
        self.take_slab(request, slabs)
        self.busy(+1)
        try:
            result = self._run(request, slabs["in"])
        except BaseException as exc:  # every failure goes back to the worker's thread
            channel.send(conn, {"error": channel.error_of(exc)})
            return
        finally:
            self.busy(-1)
        self.reply(conn, result, slabs)

    def reply(self, conn: socket.socket, result: Any, slabs: dict[str, channel.Slab]) -> None:
        """Send a result: its arrays into the answer slab, a stream item by item."""
        if hasattr(result, "__next__") and hasattr(result, "close"):
            self._stream(conn, result)
            return
        reply: dict[str, Any] = {}
        size = channel.needed([result])
        if size > slabs["out"].size:
            slabs["out"].close()
            slabs["out"] = channel.Slab.create(self.slab_prefix, size)
            reply["out"] = slabs["out"].name  # the worker maps it and removes the name
        reply["result"] = channel.Packer(slabs["out"]).pack(result)
        channel.send(conn, reply)

    def _run(self, request: dict[str, Any], slab: channel.Slab) -> Any:
        """One call on the version, by its kind (:class:`~servekit.hosts.calls.Op`)."""
        op = Op.of(request)
        args, kwargs = channel.arguments(request, slab)
        if op is Op.PREDICT:
            from servekit.observability import load

            with load.arrived_at(kwargs.pop("arrival", None)):  # its queue time counts from its worker
                return self.executor.predict(self.mv, *args, **kwargs)
        if op is Op.EXPLAIN:
            return self.executor.explain(self.mv, *args, **kwargs)
        if op is Op.CALL:
            return self.executor.call_hook(self.mv, *args, **kwargs)
        from servekit.errors import BadRequest

        raise BadRequest(f"model host: unknown operation {request.get('op')!r}")

    @staticmethod
    def _stream(conn: socket.socket, items: Any) -> None:
        """A streaming answer: items cross pickled in the header, one message each."""
        try:
            channel.send(conn, {"stream": True})
            for item in items:
                channel.send(conn, {"item": item})
            channel.send(conn, {"end": True})
        except (channel.PeerGone, OSError):
            raise
        except BaseException as exc:
            channel.send(conn, {"error": channel.error_of(exc)})
        finally:
            items.close()

    # -- bookkeeping ---------------------------------------------------------------

    def _attach(self, pid: int) -> None:
        with self.lock:
            self.attached.add(pid)
            self.ever_attached = True

    def detach(self, pid: int) -> None:
        with self.lock:
            self.attached.discard(pid)

    def busy(self, delta: int) -> None:
        with self.lock:
            self.in_flight += delta
        if self.gauges is not None:
            self.gauges.queue.inc(delta)

    def on_sigterm(self, signum: int, frame: Any) -> None:
        if self.terminating_since is None:
            self.terminating_since = time.monotonic()
            log.info("model host for %s: SIGTERM, serving until its workers are gone", self.label)

    def _watch(self) -> None:
        """Exit when the server is gone, the version unloaded, or SIGTERM and no worker left."""
        owner = runtime.owner_pid()
        while True:
            time.sleep(0.2)
            if not runtime._alive(owner):
                self.exit(owner_gone=True)
            with self.lock:
                self.attached -= {p for p in self.attached if p != owner and not runtime._alive(p)}
                workers = [p for p in self.attached if p != owner]
                idle = self.in_flight == 0
            if self.ever_attached and not self.attached and idle:
                self.exit()
            if (
                self.terminating_since is not None
                and idle
                and (not workers or time.monotonic() - self.terminating_since > TERM_LIMIT)
            ):
                self.exit()

    def exit(self, owner_gone: bool = False) -> None:
        folder = Path(self.spec["folder"])
        stem = folder / f"{self.spec['key']}-{self.spec['replica']}"
        for suffix in (".sock", ".pid"):
            try:
                Path(f"{stem}{suffix}").unlink()
            except OSError:
                pass
        channel.sweep(runtime.shm_prefix(os.getpid()))
        if owner_gone:  # nobody else will clean up after the server
            channel.sweep(runtime.shm_prefix())
            _remove_if_last(folder)
        tracing.shutdown()  # os._exit runs no atexit: export the spans still queued
        logging.shutdown()
        os._exit(0)


class _HostRows:
    """Rows per ``predict`` call, on the host's own batch-size histogram."""

    def __init__(self, host: Host):
        self.host = host

    @hookimpl(wrapper=True)
    def predict(self, inputs: Any):
        from servekit.observability.metrics import _rows

        result = yield
        if result is not None and self.host.gauges is not None:
            self.host.gauges.batch.observe(_rows(inputs))
        return result


def _remove_if_last(folder: Path) -> None:
    others = [p for p in runtime.host_pids(folder) if p != os.getpid() and runtime._alive(p)]
    if not others:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    os.environ[runtime.ENV_IN_HOST] = "1"
    logging.basicConfig(
        level=spec.get("log_level", "INFO").upper(),
        format="[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s",
    )
    host = Host(spec)
    signal.signal(signal.SIGTERM, host.on_sigterm)
    signal.signal(signal.SIGINT, host.on_sigterm)
    stem = Path(spec["folder"]) / f"{spec['key']}-{spec['replica']}"
    Path(f"{stem}.pid").write_text(str(os.getpid()))
    # the watcher runs while loading too: a host dies with the server even then
    threading.Thread(target=host._watch, name="servekit-host-watch", daemon=True).start()
    try:
        host.load()
    except BaseException as exc:  # the worker that started us reads this and reports it
        Path(f"{stem}.err").write_text(channel.error_of(exc)[1] if not isinstance(exc, RuntimeError) else str(exc))
        Path(f"{stem}.pid").unlink(missing_ok=True)
        return 3
    host.serve(f"{stem}.sock")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
