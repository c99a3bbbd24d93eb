"""Test servers forked from a warm process: ``servekit serve`` without paying its imports again.

Each pytest process starts hundreds of servers over a run (``servekit.testing.ServerProcess``).
A fresh ``python -m servekit serve`` of a scikit-learn model costs about 3.5 CPU-s before
it answers: the interpreter, Flask, gunicorn and servekit in the master (0.7), scikit-learn
with SciPy and pandas in the worker (2.2). On 2 CPUs the suite is bound by the CPU it burns,
so this module keeps one process per pytest process, the fork server, that has imported
them once; a server starts as a fork of it (about 0.5 CPU-s, ready in about half a second).

Only what a fresh process would also import before it serves is loaded ahead: servekit's
command line and HTTP server, Flask, gunicorn, NumPy and scikit-learn (which gunicorn's
preload already loads before its fork). TensorFlow, torch and gRPC are not: they start
threads or a runtime at import that a fork does not carry, so a server that needs them
imports them itself, as it would fresh.

The forked server is the real one: ``servekit.__main__`` runs with the command's arguments,
environment, working directory and output, as ``subprocess.Popen`` would give them, and
:class:`ForkedServer` answers as a ``Popen`` does (``pid``, ``poll``, ``wait``, signals,
``returncode``). A command this cannot reproduce exactly (another interpreter, another
program, an environment variable read at interpreter start or at a preloaded import that
differs) runs through ``subprocess.Popen``, as before. ``SERVEKIT_TEST_FORKS=0`` turns it off.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from typing import IO, Any

ENV = "SERVEKIT_TEST_FORKS"

#: imported once by the fork server: what ``servekit serve`` of a scikit-learn model imports before it answers
PRELOAD = (
    "servekit.cli.commands",
    "servekit.server.app",
    "servekit.server.gunicorn_app",
    "gunicorn.app.base",
    "gunicorn.workers.gthread",
    "sklearn.base",
    "sklearn.linear_model",
    "joblib",
)

#: environment variables read when the interpreter or a preloaded library starts: a command whose
#: value differs from the fork server's cannot be forked from it
READ_AT_START = (
    "PYTHON",
    "LD_",
    "LC_",
    "LANG",
    "OMP_",
    "MKL_",
    "OPENBLAS_",
    "GOTO",
    "KMP_",
    "SKLEARN_",
    "SCIPY_",
    "NUMPY_",
    "JOBLIB_",
    "MALLOC",
)

_HEADER = struct.Struct("!I")


def _read_at_start(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(READ_AT_START)}


# -- the client, in the pytest process ------------------------------------------------------------


class _Reaped:
    """The CPU seconds of the forked servers this process has seen exit (theirs and their workers')."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seconds = 0.0

    def add(self, seconds: float) -> None:
        with self.lock:
            self.seconds += seconds


_reaped = _Reaped()


def reaped_cpu() -> float:
    """CPU seconds of the forked servers waited for so far: what ``RUSAGE_CHILDREN`` would count had
    they been this process's children (tests/support/cpu_report.py adds them)."""
    return _reaped.seconds


def _read_line(channel: socket.socket) -> bytes:
    """One line from the fork server, a byte at a time (``pid N``, then ``exit CODE CPU_SECONDS``); empty at its end."""
    line = b""
    while not line.endswith(b"\n"):
        byte = channel.recv(1)
        if not byte:
            return b""
        line += byte
    return line


class ForkedServer:
    """A server forked by the fork server, answering as ``subprocess.Popen`` does."""

    def __init__(self, args: list[str], pid: int, channel: socket.socket):
        self.args = args
        self.pid = pid
        self.returncode: int | None = None
        self._channel = channel
        self._lock = threading.Lock()

    def _read_exit(self, timeout: float | None) -> None:
        with self._lock:
            if self.returncode is not None:
                return
            waiting = select.poll()
            waiting.register(self._channel, select.POLLIN)
            if not waiting.poll(None if timeout is None else timeout * 1000):
                return
            line = _read_line(self._channel)
            if not line:
                raise RuntimeError(f"the fork server went away before server {self.pid} exited")
            _, code, cpu = line.split()
            self.returncode = int(code)
            self._channel.close()
            _reaped.add(float(cpu))

    def poll(self) -> int | None:
        self._read_exit(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._read_exit(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _ForkServerHandle:
    """This pytest process's fork server, started on first use."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.address = ""
        self.env: dict[str, str] = {}
        self.failed = False

    def start(self) -> bool:
        with self.lock:
            if self.proc is not None or self.failed:
                return not self.failed
            folder = tempfile.mkdtemp(prefix="servekit-forks-")
            self.address = os.path.join(folder, "fork-server.sock")
            self.env = dict(os.environ)
            log = open(os.path.join(folder, "fork-server.log"), "wb")  # noqa: SIM115
            self.proc = subprocess.Popen(
                [sys.executable, __file__, self.address],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=self.env,
            )
            log.close()
            assert self.proc.stdout is not None
            if self.proc.stdout.readline().strip() != b"ready":
                self.failed = True
                self.proc.wait()
                print(f"the test servers' fork server did not start ({log.name}); servers start fresh", file=sys.stderr)
                return False
            atexit.register(self.stop)
            return True

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # the fork server leaves when its parent's pipe closes
            self.proc.wait(30)

    def fork(self, command: list[str], env: dict[str, str], output: IO[Any]) -> ForkedServer:
        channel = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        channel.connect(self.address)
        request = json.dumps({"argv": command[3:], "env": env, "cwd": os.getcwd()}).encode()
        socket.send_fds(channel, [_HEADER.pack(len(request)) + request], [output.fileno()])
        line = _read_line(channel)  # no further: the exit line may follow at once
        if not line:
            channel.close()
            raise RuntimeError("the fork server closed the connection before it forked")
        return ForkedServer(command, int(line.split()[1]), channel)


_HANDLE = _ForkServerHandle()


def launch(command: list[str], *, stdout: IO[Any], stderr: int, env: dict[str, str]) -> Any:
    """``ServerProcess``'s launcher: a fork of the warm fork server where it can reproduce the
    command exactly, else ``subprocess.Popen``."""
    forkable = (
        command[:3] == [sys.executable, "-m", "servekit"]
        and stderr == subprocess.STDOUT
        and os.environ.get(ENV, "1") != "0"
        and _HANDLE.start()
        and _read_at_start(env) == _read_at_start(_HANDLE.env)
    )
    if forkable:
        return _HANDLE.fork(command, env, stdout)
    return subprocess.Popen(command, stdout=stdout, stderr=stderr, env=env)


# -- the fork server --------------------------------------------------------------------------------


def _receive(connection: socket.socket) -> tuple[dict[str, Any], int]:
    data, fds, _, _ = socket.recv_fds(connection, 1 << 16, 1)
    (length,) = _HEADER.unpack(data[: _HEADER.size])
    payload = data[_HEADER.size :]
    while len(payload) < length:
        chunk = connection.recv(length - len(payload))
        if not chunk:
            raise ConnectionError("request cut short")
        payload += chunk
    return json.loads(payload), fds[0]


def _serve(address: str) -> tuple[dict[str, Any], int] | None:
    """Fork a server for each request; report each one's exit. Returns only in a forked child."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(64)
    wake_read, wake_write = socket.socketpair()
    wake_read.setblocking(False)
    wake_write.setblocking(False)
    signal.set_wakeup_fd(wake_write.fileno())
    signal.signal(signal.SIGCHLD, lambda *_: None)
    watch = selectors.DefaultSelector()
    watch.register(listener, selectors.EVENT_READ, "request")
    watch.register(wake_read, selectors.EVENT_READ, "child")
    watch.register(sys.stdin, selectors.EVENT_READ, "parent")
    channels: dict[int, socket.socket] = {}
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        for key, _ in watch.select():
            if key.data == "parent":
                return None  # the pytest process closed its pipe: it is done, or gone
            if key.data == "child":
                try:
                    while wake_read.recv(512):
                        pass
                except BlockingIOError:
                    pass
                while True:
                    try:
                        pid, status, usage = os.wait4(-1, os.WNOHANG)
                    except ChildProcessError:
                        break
                    if pid == 0:
                        break
                    channel = channels.pop(pid, None)
                    if channel is not None:
                        code, cpu = os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime
                        try:
                            channel.sendall(f"exit {code} {cpu:.3f}\n".encode())
                        except OSError:
                            pass  # nobody waits for this one any more
                        channel.close()
                continue
            connection, _ = listener.accept()
            try:
                request, output = _receive(connection)
            except (OSError, ValueError):
                connection.close()
                continue
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                watch.close()
                for sock in (listener, wake_read, wake_write, connection, *channels.values()):
                    sock.close()
                return request, output
            os.close(output)
            connection.sendall(f"pid {pid}\n".encode())
            channels[pid] = connection


def _become_server(request: dict[str, Any], output: int) -> None:
    """In the forked child: the command's environment, folder and output, then ``servekit.__main__``."""
    import random
    import runpy

    import numpy

    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.closerange(3, 1024)  # nothing of the fork server's stays open, as Popen's close_fds
    tempfile.tempdir = None  # read TMPDIR again
    random.seed()
    numpy.random.seed()  # a fresh process's global generator, not the fork server's
    sys.path[0] = os.getcwd()  # what `python -m` puts first
    sys.argv = ["servekit", *request["argv"]]
    runpy.run_module("servekit", run_name="__main__", alter_sys=True)


def main(address: str) -> None:
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # not installed in this environment: a server that needs it imports it, as fresh
    forked = _serve(address)
    if forked is not None:
        _become_server(*forked)


if __name__ == "__main__":
    sys.path[0] = os.getcwd()  # not this folder: what `python -m` puts first (a fork puts its own)
    main(sys.argv[1])
