"""Test servers forked from a warm process: ``servekit serve`` without paying its imports again.

Each pytest process starts hundreds of servers over a run (``servekit.testing.ServerProcess``).
A fresh ``python -m servekit serve`` of a scikit-learn model costs about 3.5 CPU-s before
it answers: the interpreter, Flask, gunicorn and servekit in the master (0.7), scikit-learn
with SciPy and pandas in the worker (2.2). On 2 CPUs the suite is bound by the CPU it burns,
so this module keeps one process per pytest process, the fork server, that has imported
them once; a server starts as a fork of it (about 0.5 CPU-s, ready in about half a second).

A server of a model that needs torch or TensorFlow would still import it in its worker
(4-7 CPU-s), so such a server forks from a second warm process, forked from the first, that has
also imported that framework (only imported: no operation has run, so no thread pool or
runtime exists yet that a fork would not carry). Which one a command needs is read from the
files of the model folders it names (:func:`kind_of`).

The model hosts those servers start (``placement: process``, ``servekit.hosts.client``) fork
the same way: a forked server's ``servekit.hosts.client.launcher`` asks the fork server for them.

The forked server is the real one: ``servekit.__main__`` runs with the command's arguments,
environment, working directory and output, as ``subprocess.Popen`` would give them, and
:class:`ForkedServer` answers as a ``Popen`` does (``pid``, ``poll``, ``wait``, signals,
``returncode``). A command this cannot reproduce exactly (another interpreter, another
program, an environment variable read at interpreter start or at a preloaded import that
differs) runs through ``subprocess.Popen``, as before. ``SERVEKIT_TEST_FORKS=0`` turns it off, for the
whole run or in one command's environment.
"""

from __future__ import annotations

import atexit
import functools
import itertools
import json
import os
import select
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, Any

ENV = "SERVEKIT_TEST_FORKS"

#: imported once by the fork server: what ``servekit serve`` of a scikit-learn model imports before it
#: answers, and what a model host imports before it loads its version
PRELOAD = (
    "servekit.cli.commands",
    "servekit.server.app",
    "servekit.server.gunicorn_app",
    "servekit.hosts.loop",  # with servekit.hosts.host's own imports (it runs as __main__, so not itself)
    "servekit.dataplane.executor",
    "gunicorn.app.base",
    "gunicorn.workers.gthread",
    "sklearn.base",
    "sklearn.linear_model",
    "joblib",
)

#: what the fork server of each other kind imports besides :data:`PRELOAD`: what a worker or a
#: host imports to load a model of that framework
FRAMEWORKS = {
    "torch": (
        "torch",
        "transformers",
        "transformers.models.auto.modeling_auto",
        "transformers.models.auto.tokenization_auto",
        "transformers.tokenization_utils_fast",
        # what loading the suite's tiny GPT-2, Llama and MiniLM imports (about 3 CPU-s)
        "transformers.modeling_utils",
        "transformers.generation.utils",
        "transformers.masking_utils",
        "transformers.modeling_layers",
        "transformers.models.gpt2.modeling_gpt2",
        "transformers.models.llama.modeling_llama",
        "transformers.models.bert.modeling_bert",
        "servekit_torch.loading",
        "servekit_huggingface.loader",
        "servekit_huggingface.causal",
        "servekit_huggingface.encoder",
        "servekit_huggingface.cross_encoder",
        "servekit_huggingface.scheduler",
    ),
    "tensorflow": ("tensorflow", "servekit_tensorflow.savedmodel"),
}

#: the files (names, or suffixes starting with a dot) that say a model folder needs one of them
_MARKS = {
    "tensorflow": ("saved_model.pb", "saved_model.pbtxt", ".tflite", ".keras", ".h5"),
    "torch": (".pt", ".pth", ".safetensors", "pytorch_model.bin", "tokenizer.json"),
}
#: what a ``model.py`` imports that says the same
_SOURCE_MARKS = {
    "tensorflow": ("import tensorflow", "from tensorflow"),
    "torch": ("import torch", "from torch", "transformers"),
}
#: the most files read from the folders a command names
_SCAN_LIMIT = 2000

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
#: those read when torch, transformers or TensorFlow start: a fork server of that kind is started
#: with the command's values (one per set of values)
READ_AT_FRAMEWORK_START = ("TF_", "KERAS_", "TORCH", "PYTORCH_", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "CUDA_")

_HEADER = struct.Struct("!I")
#: in a fork server: its environment before it imported anything (a preloaded library may add to it)
_start_env: dict[str, str] = {}


def _read_at_start(env: dict[str, str], prefixes: tuple[str, ...] = READ_AT_START) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(prefixes)}


def kind_of(paths: list[str]) -> str:
    """Which fork server a command naming ``paths`` forks from: ``torch``, ``tensorflow``, or ``base``
    when its model folders need neither (or both, or cannot be read)."""
    found: set[str] = set()
    seen = 0
    for given in paths:
        path = Path(given)
        if not path.exists():
            continue
        files = [path] if path.is_file() else path.rglob("*")
        for file in files:
            seen += 1
            if seen > _SCAN_LIMIT:
                return "base"
            name = file.name
            for kind, marks in _MARKS.items():
                if name in marks or any(mark.startswith(".") and name.endswith(mark) for mark in marks):
                    found.add(kind)
            if name.endswith(".py"):  # a model.py, or what it imports beside it
                try:
                    source = file.read_text(errors="replace")
                except OSError:
                    continue
                found.update(kind for kind, marks in _SOURCE_MARKS.items() if any(m in source for m in marks))
    return found.pop() if len(found) == 1 else "base"


def _read_line(channel: socket.socket) -> bytes:
    """One line from the fork server, a byte at a time (``pid N``, then ``exit CODE CPU_SECONDS``); empty at its end."""
    line = b""
    while not line.endswith(b"\n"):
        byte = channel.recv(1)
        if not byte:
            return b""
        line += byte
    return line


# -- the client, in the pytest process (and in a forked server, for its model hosts) ---------------


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
    they been this process's children (tests/support/cpu_report.py adds them). A model host forked
    for a server reports to that server, not here."""
    return _reaped.seconds


class ForkedServer:
    """A server (or model host) forked by the fork server, answering as ``subprocess.Popen`` does."""

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
    """This pytest process's fork server, started on first use (in a forked server: the one it came from)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.address = ""
        self.env: dict[str, str] = {}
        self.failed = False

    def start(self) -> bool:
        with self.lock:
            if self.address or self.failed:
                return not self.failed
            folder = tempfile.mkdtemp(prefix="servekit-forks-")
            address = os.path.join(folder, "fork-server.sock")
            self.env = dict(os.environ)
            log = open(os.path.join(folder, "fork-server.log"), "wb")  # noqa: SIM115
            self.proc = subprocess.Popen(
                [sys.executable, __file__, address],
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
            self.address = address
            atexit.register(self.stop)
            return True

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # the fork servers leave when their parent's pipe closes
            self.proc.wait(30)
        if self.proc is not None:
            shutil.rmtree(os.path.dirname(self.address), ignore_errors=True)

    def forkable(self, env: dict[str, str]) -> bool:
        """Whether a command with this environment can fork (``SERVEKIT_TEST_FORKS=0`` in it says no)."""
        return env.get(ENV, "1") != "0" and self.start() and _read_at_start(env) == _read_at_start(self.env)

    def fork(self, command: list[str], env: dict[str, str], outputs: list[int], kind: str) -> ForkedServer:
        """Run ``python -m MODULE ARGS`` (``command``) forked from the fork server of ``kind``."""
        framework_env = _read_at_start(env, READ_AT_FRAMEWORK_START)
        request = json.dumps(
            {"module": command[2], "argv": command[3:], "env": env, "cwd": os.getcwd(), "kind": [kind, framework_env]}
        ).encode()
        address = self.address
        for _ in range(2):  # the first fork server may name the one of this kind instead
            channel = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            channel.connect(address)
            socket.send_fds(channel, [_HEADER.pack(len(request)) + request], outputs)
            line = _read_line(channel)  # no further: the exit line may follow at once
            word, _, rest = line.decode().partition(" ")
            if word == "pid":
                return ForkedServer(command, int(rest), channel)
            channel.close()
            if word != "at":
                break
            address = rest.strip()
        raise RuntimeError(f"the fork server did not fork {command}: {line!r}")


_HANDLE = _ForkServerHandle()


def launch(command: list[str], *, stdout: IO[Any], stderr: int, env: dict[str, str]) -> Any:
    """``ServerProcess``'s launcher: a fork of a warm fork server where it can reproduce the
    command exactly, else ``subprocess.Popen``."""
    if command[:3] == [sys.executable, "-m", "servekit"] and stderr == subprocess.STDOUT and _HANDLE.forkable(env):
        paths = command[4 : next((i for i, a in enumerate(command) if i > 3 and a.startswith("-")), len(command))]
        kind = kind_of(paths) if command[3:4] == ["serve"] else "base"
        return _HANDLE.fork(command, env, [stdout.fileno(), stdout.fileno()], kind)
    return subprocess.Popen(command, stdout=stdout, stderr=stderr, env=env)


def launch_host(command: list[str], *, stdin: int, env: dict[str, str], close_fds: bool) -> Any:
    """``servekit.hosts.client``'s launcher: a model host forked like a server, its output this process's."""
    host = command[:3] == [sys.executable, "-m", "servekit.hosts.host"] and stdin == subprocess.DEVNULL
    if host and close_fds and _HANDLE.forkable(env):
        try:
            path = [json.loads(Path(command[3]).read_text())["path"]]
        except (OSError, ValueError, KeyError):
            path = []
        return _HANDLE.fork(command, env, [1, 2], kind_of(path))
    return subprocess.Popen(command, stdin=stdin, env=env, close_fds=close_fds)


# -- the fork servers ---------------------------------------------------------------------------------


def _receive(connection: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds, _, _ = socket.recv_fds(connection, 1 << 16, 2)
    (length,) = _HEADER.unpack(data[: _HEADER.size])
    payload = data[_HEADER.size :]
    while len(payload) < length:
        chunk = connection.recv(length - len(payload))
        if not chunk:
            raise ConnectionError("request cut short")
        payload += chunk
    return json.loads(payload), fds


class _Forked(Exception):
    """Raised in a forked child to leave the fork server's loop: what the child is to become."""

    def __init__(self, become: Any):
        self.become = become


def _preload(names: tuple[str, ...]) -> None:
    import importlib

    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # not installed here, or failing: a server that needs it imports it, and fails, as fresh
            pass


def _start_kind(base_address: str, kind: str, framework_env: dict[str, str], index: int) -> tuple[int, str]:
    """Fork a fork server of ``kind`` that imports that framework first, with these of the variables
    it reads as it starts; (its pid, its address)."""
    ready_read, ready_write = os.pipe()
    address = f"{base_address}.{index}"
    pid = os.fork()
    if pid == 0:
        os.close(ready_read)
        # the environment this fork server started with, with the command's values of those read here
        env = {k: v for k, v in _start_env.items() if not k.startswith(READ_AT_FRAMEWORK_START)}
        env.update(framework_env)
        os.environ.clear()
        os.environ.update(env)
        _start_env.clear()
        _start_env.update(env)
        raise _Forked(functools.partial(_serve_kind, base_address, address, kind, ready_write))
    os.close(ready_write)
    with os.fdopen(ready_read, "rb") as ready:
        ready.readline()  # empty if it died starting: its requests then fail
    return pid, address


def _serve_kind(base_address: str, address: str, kind: str, ready: int) -> None:
    _preload(FRAMEWORKS[kind])

    def say_ready() -> None:
        os.write(ready, b"ready\n")
        os.close(ready)

    _serve(base_address, address, kind, say_ready)


def _serve(base_address: str, address: str, kind: str, say_ready: Any) -> None:
    """Fork a server for each request; report each one's exit. Raises :class:`_Forked` in a forked child."""
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
    kinds: dict[str, tuple[int, str]] = {}  # the fork servers of other kinds this one started (pid, address)
    numbers = itertools.count(1)

    def in_child() -> None:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        watch.close()
        for sock in (listener, wake_read, wake_write, *channels.values()):
            sock.close()

    say_ready()
    while True:
        for key, _ in watch.select():
            if key.data == "parent":  # the pytest process closed its pipe: it is done, or gone
                # the fork servers of other kinds leave too: waited for, so that their servers' CPU
                # reaches this process's parent (and `time`), not init
                for kind_pid, _ in kinds.values():
                    os.waitpid(kind_pid, 0)
                return
            if key.data == "child":
                try:
                    while wake_read.recv(512):
                        pass
                except BlockingIOError:
                    pass
                _reap(channels, kinds)
                continue
            connection, _ = listener.accept()
            try:
                request, outputs = _receive(connection)
            except (OSError, ValueError):
                connection.close()
                continue
            wanted, framework_env = request["kind"]
            if kind == "base" and wanted in FRAMEWORKS:
                for fd in outputs:
                    os.close(fd)
                key = json.dumps([wanted, sorted(framework_env.items())])
                if key not in kinds:
                    try:
                        kinds[key] = _start_kind(base_address, wanted, framework_env, next(numbers))
                    except _Forked:
                        connection.close()
                        in_child()
                        raise
                connection.sendall(f"at {kinds[key][1]}\n".encode())
                connection.close()
                continue
            pid = os.fork()
            if pid == 0:
                in_child()
                raise _Forked(functools.partial(_become, request, outputs, base_address))
            for fd in outputs:
                os.close(fd)
            connection.sendall(f"pid {pid}\n".encode())
            channels[pid] = connection


def _reap(channels: dict[int, socket.socket], kinds: dict[str, tuple[int, str]]) -> None:
    """Wait for every child that exited: a server's exit status and CPU go to whoever started it, and a
    fork server of another kind that died is forgotten (the next request of its kind starts another)."""
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        for key in [key for key, (kind_pid, _) in kinds.items() if kind_pid == pid]:
            del kinds[key]
        channel = channels.pop(pid, None)
        if channel is not None:
            code, cpu = os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime
            try:
                channel.sendall(f"exit {code} {cpu:.3f}\n".encode())
            except OSError:
                pass  # nobody waits for this one any more
            channel.close()


def _become(request: dict[str, Any], outputs: list[int], base_address: str) -> None:
    """In the forked child: the command's environment, folder and output, then ``python -m MODULE``."""
    import random
    import runpy

    import numpy

    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(outputs[0], 1)
    os.dup2(outputs[-1], 2)
    os.closerange(3, 1024)  # nothing of the fork server's stays open, as Popen's close_fds
    tempfile.tempdir = None  # read TMPDIR again
    random.seed()
    numpy.random.seed()  # a fresh process's global generator, not the fork server's
    # the model hosts this server starts fork from the same fork servers
    _HANDLE.address, _HANDLE.env = base_address, dict(_start_env)
    from servekit.hosts import client

    client.launcher = launch_host
    sys.path[0] = os.getcwd()  # what `python -m` puts first
    sys.argv = [request["module"], *request["argv"]]
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


def main(address: str) -> None:
    _start_env.update(os.environ)
    _preload(PRELOAD)

    def say_ready() -> None:
        sys.stdout.write("ready\n")
        sys.stdout.flush()

    run: Any = functools.partial(_serve, address, address, "base", say_ready)
    while True:  # a fork server of another kind, forked from this one, forks servers in turn
        try:
            run()
            return
        except _Forked as forked:
            run = forked.become


if __name__ == "__main__":
    sys.path[0] = os.getcwd()  # not this folder: what `python -m` puts first (a fork puts its own)
    main(sys.argv[1])
