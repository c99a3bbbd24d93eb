"""The worker side of shadow traffic: each copy is one frame on a pipe to the worker's shadow process.

A worker that serves a model with ``shadow:`` hands each copy (the candidate's
settings, the request's inputs and arguments, the served answer and its
``requestLogId``) to :class:`ShadowProcess`, the data plane's
:class:`~servekit.dataplane.traffic.ShadowRunner` on a server.  The copy runs in
a process of the worker's own (:mod:`servekit.hosts.shadow`), started on the first
copy, at idle CPU priority: the candidate's compute, the difference and the
request log's record all happen there, on CPU time the serving processes leave.

What a copy costs the request's thread is one append to a queue: no lock and no
system call.  A writer thread per worker gathers the copies handed in for
:data:`BATCH_S`, pickles them (protocol 5) and writes them in one ``write(2)``.
The pipe is made as large as the system allows (up to :data:`PIPE_BYTES`,
``/proc/sys/fs/pipe-max-size``)
and its write end never blocks: a frame that does not fit in the room left
(:class:`PipeRoom`) is not written, and the copy is dropped and counted in
``servekit_shadow_dropped_total{model}``.  A frame is written whole or not at
all; a write the kernel cut short (it never should) retires that pipe, whose
process reads what came before it, drops the cut frame at the pipe's end and
exits, and the next copy starts a new process.

A frame is a 4-byte little-endian length and a pickle of a tuple:

- ``("copy", KEY, SPEC or None, INPUTS, KWARGS, SERVED, SERVED_LOG_ID, MODEL, PATH, SUBMITTED)``:
  ``SPEC`` (name, version, folder, fingerprint, settings, batching: what a model
  host loads a version from) goes with a candidate's first copy to a process,
  and later copies name it by ``KEY`` alone; ``SUBMITTED`` is ``time.monotonic()``
  when the worker handed the copy in (how long it may wait for a pause);
- ``("sync", TOKEN)``: the process writes ``TOKEN`` (8 bytes) back on a second
  pipe once every copy before it is logged and in the store (:meth:`ShadowProcess.wait_idle`).

The process ends when its pipe does: the worker closes it on a clean exit (and
waits for the copies handed in), and a worker that dies, however it dies,
closes it with its other descriptors.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import copyreg
import fcntl
import hashlib
import io
import json
import logging
import mmap
import os
import pickle
import select
import struct
import subprocess
import sys
import termios
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from servekit.dataplane import traffic
from servekit.observability import load

log = logging.getLogger("servekit.hosts")

#: the shadow process's command, before its two descriptors and its settings
COMMAND = [sys.executable, "-m", "servekit.hosts.shadow"]
#: the largest pipe asked for (the kernel's ``pipe-max-size`` may allow less)
PIPE_BYTES = 1 << 20
#: the pipe's size where the system cannot say (a non-Linux pipe)
DEFAULT_PIPE_BYTES = 16 * 1024
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
#: after a shadow process failed or was retired, the next one starts no sooner than this
RESTART_PAUSE_S = 5.0
#: on a clean exit, how long the worker waits for its shadow process to run the copies handed in
CLOSE_GRACE_S = 10.0
_LENGTH = struct.Struct("<I")
#: how long the shadow process naps while its pipe is empty (copies wait that much longer)
NAP_S = 0.02
#: what the shadow process answers a ``sync`` frame with
TOKEN = struct.Struct("<Q")
#: the writer thread gathers the copies handed in for this long, then pickles and writes them at once
BATCH_S = 0.05
#: the most copies in one write
BATCH_MAX = 256


def rebuild_array(data: bytes, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """An array :func:`encode` sent as its bytes (writable, as the request's own was)."""
    return np.frombuffer(bytearray(data), dtype).reshape(shape)


def _reduce_array(array: np.ndarray) -> Any:
    """An array as its bytes, dtype and shape: a third of numpy's own pickle's cost on small arrays."""
    if array.dtype.hasobject or array.dtype.fields is not None:
        return array.__reduce_ex__(5)
    return rebuild_array, (array.tobytes(), array.dtype.str, array.shape)


class _Pickler(pickle.Pickler):
    dispatch_table = {**copyreg.dispatch_table, np.ndarray: _reduce_array}


def encode(message: tuple[Any, ...]) -> bytes:
    """One frame: the length, then the pickle (protocol 5)."""
    out = io.BytesIO()
    out.write(b"\0" * _LENGTH.size)
    _Pickler(out, protocol=5).dump(message)
    frame = out.getbuffer()
    _LENGTH.pack_into(frame, 0, len(frame) - _LENGTH.size)
    del frame
    return out.getvalue()


def decode(body: bytes) -> tuple[Any, ...]:
    return pickle.loads(body)


class FrameReader:
    """The shadow process's side of the pipe: one frame at a time, read only when it is wanted,
    so that the copies waiting stay in the pipe, where the worker sees how full it is."""

    def __init__(self, fd: int, alive: Callable[[], bool] = lambda: True, poll_s: float = 1.0):
        self.fd, self.alive, self.poll_s = fd, alive, poll_s
        self._poll = select.poll()  # not select(): a worker's descriptors (kept here) may pass 1024
        self._poll.register(fd, select.POLLIN)

    def read(self) -> bytes | None:
        """The next frame's pickle (:func:`decode` it); ``None`` at the pipe's end (a frame cut
        by it is dropped) or once ``alive`` says the worker is gone."""
        head = self._exactly(_LENGTH.size)
        if head is None:
            return None
        return self._exactly(_LENGTH.unpack(head)[0])

    def _exactly(self, size: int) -> bytes | None:
        parts, left = [], size
        while left:
            if not self._wait():
                return None
            data = os.read(self.fd, left)
            if not data:
                return None
            parts.append(data)
            left -= len(data)
        return b"".join(parts)

    def _wait(self) -> bool:
        """Until the pipe holds bytes (or says it ended).  While it is empty the reader naps
        (:data:`NAP_S`) rather than waits on it: a process waiting on a pipe is woken by every
        write, and that wake-up is the serving worker's CPU, once per copy."""
        naps = 0
        while True:
            ready = self._poll.poll(0)
            if ready:
                return True
            if naps * NAP_S >= self.poll_s:
                naps = 0
                if not self.alive():
                    return False
            time.sleep(NAP_S)
            naps += 1


def pipe_capacity(fd: int, wanted: int = PIPE_BYTES) -> int:
    """Make the pipe of ``fd`` as large as allowed, up to ``wanted``; the size it has."""
    if not hasattr(fcntl, "F_SETPIPE_SZ"):
        return DEFAULT_PIPE_BYTES
    try:
        wanted = min(wanted, int(Path("/proc/sys/fs/pipe-max-size").read_text()))
    except (OSError, ValueError):
        pass
    with contextlib.suppress(OSError):  # past the user's pipe-user-pages-soft: the default size
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, wanted)
    return pipe_size(fd)


def pipe_size(fd: int) -> int:
    """The size of the pipe of ``fd`` (either end)."""
    if not hasattr(fcntl, "F_GETPIPE_SZ"):
        return DEFAULT_PIPE_BYTES
    return int(fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ))


def unread(fd: int) -> int:
    """Bytes written to the pipe of ``fd`` and not read yet (``FIONREAD``; either end)."""
    return int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"), sys.byteorder, signed=True)


class PipeRoom:
    """Whether a write fits in a pipe now, followed from its only writer.

    The kernel keeps a pipe's bytes in page-sized buffers, at most capacity / page
    of them: a write first fills the last buffer if its remainder (the length
    modulo a page) fits there, then takes new buffers, and a buffer is freed once
    all its bytes are read.  So a pipe of small frames holds fewer bytes than its
    capacity, and "capacity minus what is unread" overstates the room.  This
    follows the buffers as the writer filled them and, from ``FIONREAD``, which
    of them the reader has emptied: the room it reports is never more than the
    kernel's (a read that happens meanwhile only makes more).
    """

    def __init__(self, capacity: int, page: int = PAGE):
        self.capacity = capacity
        self.page = page
        self.slots = max(1, capacity // page)
        self.written = 0
        #: the buffers the reader has not emptied: [stream offset of the end, bytes in the buffer]
        self.buffers: collections.deque[list[int]] = collections.deque()

    def _forget_read(self, unread_bytes: int) -> None:
        read = self.written - unread_bytes
        while self.buffers and self.buffers[0][0] <= read:
            self.buffers.popleft()

    def _new_buffers(self, size: int) -> tuple[int, int]:
        """How many buffers a write of ``size`` takes, and how many of its bytes go into the last one."""
        rest = size % self.page
        if rest and self.buffers and self.buffers[-1][1] + rest <= self.page:
            return (size - rest) // self.page, rest
        return -(-size // self.page), 0

    def fits(self, size: int, unread_bytes: int | None = None) -> bool:
        """Whether a write of ``size`` fits; with ``unread_bytes`` (``FIONREAD``) the buffers read
        since are forgotten first, without it nothing is taken as read (never more room than there is)."""
        if unread_bytes is not None:
            self._forget_read(unread_bytes)
        return len(self.buffers) + self._new_buffers(size)[0] <= self.slots

    def wrote(self, size: int) -> None:
        """A write of ``size`` bytes went in whole (after :meth:`fits` said it would)."""
        _, merged = self._new_buffers(size)
        end = self.written
        if merged:
            self.buffers[-1][0] += merged
            self.buffers[-1][1] += merged
            end += merged
        left = size - merged
        while left:
            part = min(self.page, left)
            end += part
            self.buffers.append([end, part])
            left -= part
        self.written += size


def _tensor_bytes(value: Any) -> int:
    """The bytes of an array, or of the arrays of a dict (a request's tensors, an answer)."""
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, dict):
        return sum(v.nbytes for v in value.values() if isinstance(v, np.ndarray))
    return 0


def _shared_board() -> tuple[int, mmap.mmap] | None:
    """8 bytes of memory the shadow process maps too (a memfd): the worker's concurrency, so that
    copies run while the worker answers no request (:func:`servekit.observability.load.share_concurrency`)."""
    if not hasattr(os, "memfd_create"):
        return None
    try:
        fd = os.memfd_create("servekit-shadow-board", os.MFD_CLOEXEC)  # the process gets it through pass_fds
        os.ftruncate(fd, mmap.PAGESIZE)
        return fd, mmap.mmap(fd, 8)
    except OSError:
        return None


def idle_priority(pid: int = 0) -> str:
    """Put a process (0: this thread, and the threads it starts) at ``SCHED_IDLE``: it gets a CPU
    only when nothing else wants it.  Where that is refused, the lowest nice value; which one."""
    try:
        os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
        return "SCHED_IDLE"
    except (AttributeError, OSError):
        pass
    with contextlib.suppress(OSError):
        if pid == 0:
            os.nice(19 - os.nice(0))
        else:
            os.setpriority(os.PRIO_PROCESS, pid, 19)
    return "nice 19"


class _Child:
    """One shadow process and the pipes to it; its process starts in the background."""

    def __init__(self, frames: int, answers: int, capacity: int, lock: threading.Lock):
        self.frames, self.answers = frames, answers
        #: the worker's concurrency, shared with the process (``None`` where no memfd can be made)
        self.board: mmap.mmap | None = None
        self.room = PipeRoom(capacity)
        self.lock = lock  # the worker's writer lock
        self.proc: subprocess.Popen | None = None
        self.started = threading.Event()
        self.retired = False
        #: the candidates whose settings this process was sent
        self.sent: set[str] = set()
        self.synced = 0
        self._finish_lock = threading.Lock()

    @classmethod
    def start(cls, config: dict[str, Any], lock: threading.Lock) -> _Child:
        frames_r, frames_w = os.pipe()  # both close on exec: only the shadow process gets its ends
        answers_r, answers_w = os.pipe()
        capacity = pipe_capacity(frames_w)
        os.set_blocking(frames_w, False)
        child = cls(frames_w, answers_r, capacity, lock)
        board = _shared_board()
        if board is not None:
            board_fd, child.board = board
            load.share_concurrency(child.board)
        else:
            board_fd = -1
        threading.Thread(
            target=child._spawn,
            args=(config, frames_r, answers_w, board_fd),
            name="servekit-shadow-start",
            daemon=True,
        ).start()
        return child

    def _spawn(self, config: dict[str, Any], frames_r: int, answers_w: int, board_fd: int) -> None:
        """Start the process (copies meanwhile wait in the pipe); a failure closes its end, so the
        worker's next write finds the pipe broken."""
        passed = (frames_r, answers_w) + ((board_fd,) if board_fd >= 0 else ())
        try:
            self.proc = subprocess.Popen(
                [*COMMAND, str(frames_r), str(answers_w), json.dumps(config), str(board_fd)],
                stdin=subprocess.DEVNULL,
                pass_fds=passed,
                close_fds=True,
            )
            log.info("shadow process started (pid %d) for worker %d", self.proc.pid, os.getpid())
        except Exception:
            log.exception("the shadow process could not be started; copies are dropped")
        finally:
            for fd in passed:
                os.close(fd)
            self.started.set()

    def write(self, frame: bytes) -> bool:
        """Write one frame whole, without waiting; ``False``: not written."""
        return self.write_many([frame])[0]

    def write_many(self, frames: list[bytes]) -> list[bool]:
        """Write the frames that fit, each whole, in one ``write(2)``, without waiting; which were."""
        with self.lock:
            if self.retired:
                return [False] * len(frames)
            taken: list[bool] = []
            size = 0
            asked = False  # the kernel is asked what was read (an ioctl) once at most
            for frame in frames:
                fits = self.room.fits(size + len(frame))
                if not fits and not asked:
                    asked = True
                    fits = self.room.fits(size + len(frame), unread(self.frames))
                taken.append(fits)
                size += len(frame) if fits else 0
            if not size:
                return taken
            blob = b"".join(frame for frame, fits in zip(frames, taken) if fits)
            try:
                written = os.write(self.frames, blob)
            except BlockingIOError:
                return [False] * len(frames)  # less room than followed: nothing was written
            except OSError:  # the process is gone (EPIPE)
                self._retire()
                return [False] * len(frames)
            if written < len(blob):  # a cut frame: the reader drops it at the pipe's end
                self._retire()
                whole, end = [], 0  # the whole frames before it are read and logged
                for frame, fits in zip(frames, taken):
                    end += len(frame) if fits else 0
                    whole.append(fits and end <= written)
                return whole
            self.room.wrote(written)
            return taken

    def gone(self) -> bool:
        """Whether its process has exited (or never started)."""
        if not self.started.is_set():
            return False
        return self.proc is None or self.proc.poll() is not None

    def retire(self) -> None:
        with self.lock:
            self._retire()

    def _retire(self) -> None:
        if not self.retired:
            self.retired = True
            os.close(self.frames)  # its process reads to the end, then exits

    def wait_synced(self, token: int, deadline: float) -> bool:
        """Read the process's answers until ``token`` came back (or the process ended)."""
        while self.synced < token:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            poll = select.poll()  # not select(): a busy worker's descriptors pass 1024
            poll.register(self.answers, select.POLLIN)
            if not poll.poll(left * 1000):
                return False
            data = os.read(self.answers, 4096)
            if not data:
                return True  # the process ended: it logs nothing more
            for (value,) in TOKEN.iter_unpack(data[: len(data) - len(data) % TOKEN.size]):
                self.synced = max(self.synced, value)
        return True

    def finish(self, deadline: float) -> None:
        """After :meth:`retire`: wait for the process to run what it was sent, then reap it."""
        with self._finish_lock:
            if self.answers < 0:
                return  # finished already
            self.started.wait(max(0.0, deadline - time.monotonic()))
            if self.proc is not None:
                try:
                    self.proc.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log.warning("shadow process %d did not finish its copies in time; stopped", self.proc.pid)
                    self.proc.kill()
                    self.proc.wait()
            os.close(self.answers)
            self.answers = -1


class ShadowProcess:
    """The data plane's shadow runner on a server: one shadow process per worker (see the module).

    ``pm`` gives the ``--plugin`` entries the process loads candidates with;
    ``store`` is the built-in request log (:class:`~servekit.observability.log_store.SqlRequestLog`),
    which the process writes to through its own spool, beside any other
    ``log_request`` plugin it loads.
    """

    def __init__(self, pm: Any, batching: Any, store: Any = None):
        from servekit.hosts import plugin_specs

        self.config = {
            "plugins": plugin_specs(pm),
            "store": [store.url, str(store.spool.folder)] if store is not None else None,
            "log_level": logging.getLevelName(logging.getLogger().level),
        }
        self.batching = [batching.max_batch_size, batching.max_batch_time_ms]
        self._specs: dict[int, tuple[weakref.ref[Any], str, dict[str, Any]]] = {}
        self._reset()

    def _reset(self) -> None:
        """This process's own state (a forked worker does not share its parent's process)."""
        self._pid = os.getpid()
        self._lock = threading.Lock()  # the one writer lock of this worker
        self._start_lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._child: _Child | None = None
        self._retired: list[_Child] = []
        self._next_start = 0.0
        self._token = 0
        self._exit_hook = False
        self.closed = False
        #: copies dropped by this worker (also in ``servekit_shadow_dropped_total``)
        self.dropped = 0
        self._told: set[str] = set()  # what was said once: a model's copies too large, or not pickled
        #: copies handed in and not yet pickled and written (by the writer thread, or :meth:`flush`)
        self._queue: collections.deque[tuple[Any, ...]] = collections.deque()
        self._wake = threading.Event()
        self._flush_lock = threading.Lock()
        self._writer: threading.Thread | None = None

    # -- the request's side ----------------------------------------------------------------------

    def submit(self, target: Any, request: Any, served: Any, served_log_id: str, model: str, path: str) -> None:
        """Queue a copy; the writer thread pickles and writes the queued ones every :data:`BATCH_S`.

        The request's thread takes no lock and makes no system call: a ``write(2)`` per copy let
        the GIL go, and with a few requests in the worker the writing thread waited up to a switch
        interval to get it back while the others waited on the writer lock it held (the served
        p50 5-21 % higher in bench/shadow.py)."""
        child = self._current()
        inputs, kwargs = request
        if child is not None and _tensor_bytes(inputs) + _tensor_bytes(served) > child.room.capacity:
            self._too_large(model, child.room.capacity)
        elif child is not None:
            self._queue.append((target, inputs, kwargs, served, served_log_id, model, path, time.monotonic()))
            if self._writer is None:
                self._start_writer()
            if not self._wake.is_set():
                self._wake.set()
            return
        self._drop(model)

    def _drop(self, model: str) -> None:
        self.dropped += 1
        traffic.count_dropped(model)

    def _start_writer(self) -> None:
        with self._start_lock:
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_loop, name="servekit-shadow-writer", daemon=True)
                self._writer.start()

    def _write_loop(self) -> None:
        while True:
            self._wake.wait()
            time.sleep(BATCH_S)  # gather a batch: one write, one wait for the GIL, per batch
            self._wake.clear()
            try:
                self.flush()
            except Exception:
                log.exception("shadow copies could not be handed to the shadow process")

    def flush(self) -> None:
        """Pickle and write every queued copy now (dropping those that do not fit)."""
        with self._flush_lock:
            while self._queue:
                batch: list[tuple[Any, ...]] = []
                while self._queue and len(batch) < BATCH_MAX:
                    batch.append(self._queue.popleft())
                self._write_batch(batch)

    def _write_batch(self, batch: list[tuple[Any, ...]]) -> None:
        child = self._current()
        if child is None:
            for entry in batch:
                self._drop(entry[5])
            return
        frames, models, keys = [], [], []
        for target, inputs, kwargs, served, served_log_id, model, path, submitted in batch:
            key, spec = self._spec(target)
            try:
                # the settings go with each copy of a candidate until one of them was written
                frame = encode(
                    (
                        "copy",
                        key,
                        None if key in child.sent else spec,
                        inputs,
                        kwargs,
                        served,
                        served_log_id,
                        model,
                        path,
                        submitted,
                    )
                )
            except Exception as exc:  # an input that cannot be pickled
                if f"{model}|pickle" not in self._told:
                    self._told.add(f"{model}|pickle")
                    log.warning(
                        "model %s: a shadow copy could not be pickled (%s); such copies are dropped", model, exc
                    )
                self._drop(model)
                continue
            frames.append(frame)
            models.append(model)
            keys.append(key)
        failed = False
        for written, model, key in zip(child.write_many(frames), models, keys):
            if written:
                child.sent.add(key)
            else:
                failed = True
                self._drop(model)
        if failed and child.gone():
            child.retire()  # its process ended: the next copy starts another

    def _too_large(self, model: str, capacity: int) -> None:
        """A copy that could never fit is dropped before it is pickled; said once per model."""
        if model not in self._told:
            self._told.add(model)
            log.warning(
                "model %s: a shadow copy larger than the pipe to the shadow process (%d bytes) is dropped; "
                "copies that large never run",
                model,
                capacity,
            )

    def _current(self) -> _Child | None:
        """The shadow process's pipe, started now if there is none; ``None`` while none may start."""
        if self._pid != os.getpid():
            self._reset()
        child = self._child
        if child is not None and not child.retired:
            return child
        with self._start_lock:
            child = self._child
            if child is not None and not child.retired:
                return child
            if self.closed or time.monotonic() < self._next_start:
                return None
            if child is not None:
                self._retired.append(child)
                threading.Thread(target=child.finish, args=(time.monotonic() + 60.0,), daemon=True).start()
            self._next_start = time.monotonic() + RESTART_PAUSE_S
            self._child = _Child.start(self.config, self._lock)
            if not self._exit_hook:
                atexit.register(_close_at_exit, weakref.ref(self))
                self._exit_hook = True
            return self._child

    def _spec(self, mv: Any) -> tuple[str, dict[str, Any]]:
        """The candidate's key and what the shadow process loads it from (made once per loaded version)."""
        entry = self._specs.get(id(mv))
        if entry is not None and entry[0]() is mv:
            return entry[1], entry[2]
        from servekit.control.plan import config_key
        from servekit.hosts import load_spec

        spec = {**load_spec(mv), "batching": self.batching}
        text = f"{mv.name}|{mv.version}|{mv.path}|{mv.fingerprint}|{config_key(mv.raw_config)}"
        key = hashlib.sha1(text.encode()).hexdigest()[:16]
        if len(self._specs) > 64:  # versions unloaded since
            self._specs = {k: v for k, v in self._specs.items() if v[0]() is not None}
        self._specs[id(mv)] = (weakref.ref(mv), key, spec)
        return key, spec

    # -- tests and shutdown -------------------------------------------------------------------------

    def wait_idle(self, timeout: float = 60.0) -> bool:
        """Until every copy handed in so far is logged and in the store; whether that happened in time."""
        deadline = time.monotonic() + timeout
        self.flush()  # the copies queued before this call go first
        with self._sync_lock:
            for old in list(self._retired):
                old.finish(deadline)
                self._retired.remove(old)
            child = self._child
            if child is None or self._pid != os.getpid():
                return True
            self._token += 1
            token = self._token
            frame = encode(("sync", token))
            while not child.write(frame):  # unlike a copy, this one waits for room
                if child.retired or child.gone():
                    return True  # nothing more will be logged there
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.005)
            return child.wait_synced(token, deadline)

    def close(self, grace: float = CLOSE_GRACE_S) -> None:
        """No more copies: the shadow process runs those it has, then ends (stopped after ``grace`` s)."""
        if self._pid != os.getpid():
            return
        self.flush()
        with self._start_lock:
            self.closed = True
            children, self._child = [*self._retired, *([self._child] if self._child else [])], None
            self._retired = []
        deadline = time.monotonic() + grace
        for child in children:
            child.retire()
        for child in children:
            child.finish(deadline)


def _close_at_exit(ref: weakref.ref[ShadowProcess]) -> None:
    runner = ref()
    if runner is not None:
        with contextlib.suppress(Exception):
            runner.close()
