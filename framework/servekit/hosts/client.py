"""The worker side of a model host: start it once per server, hand it requests, restart it.

Any HTTP worker (or the gRPC server in it) may be the first to need a host;
a file lock in the runtime folder makes exactly one of them start it, and the
others connect to its socket.  Connections are pooled per process; a call
takes one, writes its tensors into the connection's request slab, sends the
header, and waits for the answer (at most ``--request-timeout`` seconds).

A host that dies answers nothing: the calls waiting on it get ``503`` with a
clear message, and the worker that noticed starts a new host (the restart is
counted in ``servekit_host_restarts_total``) while new requests wait for it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from servekit import errors
from servekit.hosts import channel, runtime
from servekit.hosts.calls import Op
from servekit.observability import load, tracing
from servekit.types import LoadedVersion, ModelMetadata, ModelOutputs, Tensors

log = logging.getLogger("servekit.hosts")

#: The longest a host may take to load its model before the start is abandoned.
START_TIMEOUT = 600.0
#: What starts a host: ``launcher(command, stdin=..., env=..., close_fds=True)`` returns a
#: ``subprocess.Popen``, or an object that answers as one (``pid``, ``poll``, ``kill``,
#: ``returncode``). servekit's own suite forks the hosts of its test servers from a warm process
#: this way (tests/support/server_forks.py in its repository).
launcher: Callable[..., Any] = subprocess.Popen
_children: list[Any] = []
#: every live client of this process (reset in a forked child)
clients: weakref.WeakSet[HostClient] = weakref.WeakSet()


class Connection:
    """One socket to a host and this side's two slabs."""

    def __init__(self, path: str, host_pid: int, timeout: float | None = None):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.sock.settimeout(timeout)  # once: a timeout costs a poll() before every recv
        self.framer = channel.Framer(self.sock)
        self.prefix = f"{runtime.shm_prefix(host_pid)}w{os.getpid()}-"
        self.slab_in = channel.Slab.create(self.prefix, channel.SLAB_MIN)
        self.slab_out = channel.Slab.create(self.prefix, channel.SLAB_MIN)
        try:
            hello = {**Op.HELLO.header(), "pid": os.getpid(), "in": self.slab_in.name, "out": self.slab_out.name}
            channel.send(self.sock, hello)
            self.hello = self.framer.read()
        except BaseException:
            self.close()  # removes the names the host did not get to map
            raise

    def request(self, header: dict[str, Any], args: list[Any], kwargs: dict[str, Any]) -> None:
        size = channel.needed(args + list(kwargs.values()))
        if size > self.slab_in.size:
            new = channel.Slab.create(self.prefix, size)
            header["in"] = new.name
            self.slab_in.close()
            self.slab_in = new
        packer = channel.Packer(self.slab_in)
        header["args"] = [packer.pack(a) for a in args]
        header["kwargs"] = {k: packer.pack(v) for k, v in kwargs.items()}
        channel.send(self.sock, header)

    def reply(self) -> dict[str, Any]:
        reply = self.framer.read()
        if "out" in reply:  # the answer did not fit: the host made a bigger slab
            self.slab_out.close()
            self.slab_out = channel.Slab.attach(reply["out"])
        return reply

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        self.slab_in.close()
        self.slab_out.close()


class Replica:
    """One host process of a model version: its files, and this process's idle connections."""

    def __init__(self, client: HostClient, index: int):
        self.client = client
        self.index = index
        self.stem = client.folder / f"{client.key}-{index}"
        self.idle: list[Connection] = []
        self.lock = threading.Lock()

    @property
    def socket_path(self) -> str:
        return f"{self.stem}.sock"

    def pid(self) -> int:
        try:
            return int(Path(f"{self.stem}.pid").read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    def take(self) -> Connection:
        """An idle connection, or a new one.  One whose host has died since is not noticed
        here: sending on it fails at once (a Unix socket knows its peer is gone), and
        :meth:`HostClient._send` retries on a fresh one."""
        with self.lock:
            if self.idle:
                return self.idle.pop()
        return self.connect()

    def give(self, conn: Connection) -> None:
        with self.lock:
            self.idle.append(conn)

    def drop_idle(self) -> None:
        with self.lock:
            idle, self.idle = self.idle, []
        for conn in idle:
            conn.close()

    def connect(self) -> Connection:
        """A new connection, starting (or restarting) the host first when nobody answers."""
        timeout = self.client.timeout
        try:
            return Connection(self.socket_path, self.pid(), timeout)
        except TimeoutError:  # it accepted but did not greet in time: alive, busy with a long call
            raise errors.Timeout(
                f"the model host of {self.client.name!r} version {self.client.version} "
                f"did not answer within {timeout:g}s"
            ) from None
        except (OSError, channel.PeerGone):
            self.ensure()
            return Connection(self.socket_path, self.pid(), timeout)

    def ensure(self) -> None:
        """Under the folder's lock: if the host does not answer, start it (again)."""
        with _locked(Path(f"{self.stem}.lock")):
            if _answers(self.socket_path):
                return
            error = Path(f"{self.stem}.err")
            if error.is_file():
                raise errors.NotReady(error.read_text())
            old = self.pid()
            if old and runtime._alive(old):  # alive but silent: hung or half-dead
                os.kill(old, 9)
            if old:
                self._forget(old)
            self._spawn()

    def _forget(self, pid: int) -> None:
        from servekit.observability import host_metrics, metrics

        log.warning(
            "model host for %s version %s (pid %d) is gone; starting a new one",
            self.client.name,
            self.client.version,
            pid,
        )
        channel.sweep(runtime.shm_prefix(pid))
        metrics.mark_process_dead(pid)
        host_metrics.host_restarted(self.client.name, str(self.client.version), str(self.index))
        with contextlib.suppress(OSError):
            os.unlink(self.socket_path)

    def _spawn(self) -> None:
        spec = {**self.client.spec, "replica": self.index}
        spec_path = Path(f"{self.stem}.json")
        spec_path.write_text(json.dumps(spec))
        env = {**os.environ, runtime.ENV_IN_HOST: "1"}
        proc = launcher(
            [sys.executable, "-m", "servekit.hosts.host", str(spec_path)],
            stdin=subprocess.DEVNULL,
            env=env,
            close_fds=True,
        )
        _children.append(proc)
        _reap()
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                error = Path(f"{self.stem}.err")
                message = error.read_text() if error.is_file() else f"exit status {proc.returncode}"
                raise RuntimeError(f"the model host failed to start: {message}")
            if _answers(self.socket_path):
                return
            time.sleep(0.01)
        proc.kill()
        raise RuntimeError(f"the model host did not start within {START_TIMEOUT:g}s")


class HostClient:
    """What a worker keeps for one model version placed in host processes: its :class:`servekit.types.Executor`."""

    def __init__(self, spec: dict[str, Any], replicas: int):
        self.spec = spec
        self.name, self.version = spec["name"], spec["version"]
        self.folder = Path(spec["folder"])
        self.key = spec["key"]
        self.replicas = [Replica(self, i) for i in range(max(1, replicas))]
        self._turn = 0
        self.metadata = ModelMetadata()  # the host's, once start() has greeted it
        self.timeout = runtime.call_timeout()

    def start(self) -> None:
        """Make sure every replica runs (starting those nobody started) and read the metadata."""
        for replica in self.replicas:
            conn = replica.take()
            self.metadata = conn.hello["metadata"]
            replica.give(conn)

    def call(self, op: Op, *args: Any, **kwargs: Any) -> Any:
        """One call of kind ``op`` (its arguments as :class:`~servekit.hosts.calls.Op` lists them), answered."""
        replica = self._pick()
        message = op.header()
        if tracing.ON:  # the trace crosses into the host: its spans continue this one
            with tracing.client_span("servekit.host", {tracing.HOST_REPLICA: replica.index, "servekit.op": op.value}):
                message["trace"] = tracing.inject()
                return self._call(replica, message, list(args), kwargs)
        return self._call(replica, message, list(args), kwargs)

    def _call(self, replica: Replica, header: dict[str, Any], args: list[Any], kwargs: dict[str, Any]) -> Any:
        conn = self._send(replica, header, args, kwargs)
        try:
            reply = conn.reply()
        except TimeoutError:
            conn.close()  # its answer may still come: this connection is spoiled
            raise errors.Timeout(
                f"model {self.name!r} version {self.version} did not answer within {self.timeout:g}s"
            ) from None
        except (channel.PeerGone, OSError):
            conn.close()
            self._lost(replica)
            raise errors.NotReady(
                f"the model host of {self.name!r} version {self.version} exited while answering "
                "this request; it is being restarted, retry"
            ) from None
        if reply.get("stream"):
            return self._stream(replica, conn)
        try:
            # copied out of the connection's answer slab before another thread may reuse it
            return self._result(reply, conn)
        finally:
            replica.give(conn)

    # -- servekit.types.Executor: what the data plane asks of a version that runs here --------

    def predict(
        self,
        mv: LoadedVersion,
        inputs: Tensors,
        *,
        parameters: dict[str, Any],
        signature_name: str | None,
        output_names: list[str] | None,
    ) -> ModelOutputs:
        load.handing_over()  # the host counts it running at once: the worker's waiting must be written first
        return self.call(
            Op.PREDICT,
            inputs,
            arrival=time.monotonic(),  # for the host's queue time
            parameters=parameters,
            signature_name=signature_name,
            output_names=output_names,
        )

    def explain(
        self, mv: LoadedVersion, inputs: Tensors, *, parameters: dict[str, Any], signature_name: str | None
    ) -> ModelOutputs:
        return self.call(Op.EXPLAIN, inputs, parameters=parameters, signature_name=signature_name)

    def hook(self, mv: LoadedVersion, name: str, **kwargs: Any) -> Any:
        return self.call(Op.CALL, name, **kwargs)

    def tokenizer(self) -> Any:
        """A copy of the model's tokenizer (the ``tokenizer`` hook), ``None`` when it has none.

        One that cannot cross to the worker (a class only the model's folder
        defines) is ``None`` too, with a warning: chat then uses the plain format.
        """
        try:
            return self.call(Op.CALL, "tokenizer")
        except errors.NotImplementedByModel:
            return None
        except Exception as exc:
            log.warning("model %s: its tokenizer could not be copied from its model host: %s", self.name, exc)
            return None

    def _pick(self) -> Replica:
        if len(self.replicas) == 1:
            return self.replicas[0]
        self._turn = (self._turn + 1) % len(self.replicas)
        return self.replicas[self._turn]

    def _send(self, replica: Replica, header: dict[str, Any], args: list[Any], kwargs: dict[str, Any]) -> Connection:
        """Send on a pooled connection; one that turns out dead before the host read it is retried."""
        for attempt in range(3):
            conn = replica.take()
            try:
                conn.request(dict(header), args, kwargs)
                return conn
            except (OSError, channel.PeerGone):
                conn.close()
                replica.drop_idle()
                if attempt == 2:
                    raise errors.NotReady(f"the model host of {self.name!r} does not answer") from None
        raise AssertionError("unreachable")

    @staticmethod
    def _result(reply: dict[str, Any], conn: Connection) -> Any:
        if "error" in reply:
            kind, message = reply["error"]
            cls = getattr(errors, kind, None)
            if not (isinstance(cls, type) and issubclass(cls, errors.ServekitError)):
                cls = errors.ModelFailure
            raise cls(message)
        return channel.unpack(reply["result"], conn.slab_out, copy=True)

    def _stream(self, replica: Replica, conn: Connection) -> Iterator[Any]:
        done = False
        try:
            while True:
                message = conn.reply()
                if "item" in message:
                    yield message["item"]
                    continue
                done = "end" in message
                if "error" in message:
                    done = True
                    self._result(message, conn)
                return
        finally:
            if done:
                replica.give(conn)
            else:  # closed early or failed: the host is still sending on it
                conn.close()

    def _lost(self, replica: Replica) -> None:
        """The host died under a call: drop its connections and restart it in the background."""
        replica.drop_idle()
        threading.Thread(target=_quietly, args=(replica.ensure,), daemon=True).start()

    def close(self) -> None:
        """The version is unloaded here: tell the hosts, drop the connections."""
        for replica in self.replicas:
            with contextlib.suppress(Exception):
                # a connection of its own: never start a host only to say goodbye
                conn = Connection(replica.socket_path, replica.pid(), 5.0)
                channel.send(conn.sock, Op.DETACH.header())
                conn.reply()
                conn.close()
            replica.drop_idle()


def host_key(name: str, version: int, path: Path, fingerprint: float, device: str) -> str:
    text = f"{name}|{version}|{path.resolve()}|{fingerprint}|{device}"
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def _answers(path: str) -> bool:
    if not os.path.exists(path):
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _reap() -> None:
    for proc in list(_children):
        if proc.poll() is not None:
            _children.remove(proc)


def _quietly(fn: Any) -> None:
    try:
        fn()
    except Exception as exc:
        log.error("restarting a model host failed: %s", exc)


def _after_fork() -> None:
    """A forked worker must not share its parent's connections (``--preload``)."""
    for client in list(clients):
        for replica in client.replicas:
            replica.idle = []
            replica.lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)
