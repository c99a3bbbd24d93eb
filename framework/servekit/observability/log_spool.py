"""The request log's spool: each record is on local disk before its answer's last byte goes out.

:class:`Spool` appends every record, as one JSON line in one ``write(2)``, to a
file of its own process in the spool folder; a thread ships the lines to the
store in batches.  The write lands in the kernel's page cache, which outlives
the process: a ``kill -9`` after a client got its answer cannot lose the row
(a machine crash, or a tmpfs that goes with its container, can; no ``fsync``
is made).  Nothing on the request's path waits on the database.

Each process holds an exclusive ``flock`` on its own ``OWNER.lock`` for as long
as it lives; the kernel drops it when the process dies, however it dies.  Every
shipper looks at the folder once a second (and when it starts) and takes over
the files of any owner whose lock it can take: a killed worker's records are
shipped by its sibling, its replacement, or any process sharing the folder.
Replayed lines are harmless: the store inserts by the record's id and ignores
one it already has, so a row is never written twice.

Files rotate every :data:`SEGMENT_BYTES`; a shipped segment is deleted.  While
the store is unreachable records stay in the spool (the shipper retries with a
growing pause) up to :data:`MAX_SPOOL_BYTES` per process; beyond that a record
is dropped and counted.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import logging
import os
import socket
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from functools import partial
from pathlib import Path

import orjson

from servekit.types import PredictionLog, RequestLog

log = logging.getLogger("servekit.request_log")

SEGMENT_BYTES = 8 * 1024 * 1024
MAX_SPOOL_BYTES = 1024 * 1024 * 1024
BATCH_SIZE = 500
BATCH_SECONDS = 0.05
ADOPT_SECONDS = 1.0
READ_BYTES = 1024 * 1024
MAX_PAUSE = 5.0


def default_folder(url: str) -> Path:
    """Next to a SQLite file (``FILE-spool``); otherwise a folder of the temporary directory
    named after the user and the store, so every server of one user on the machine logging to
    it shares one."""
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///") :].split("?", 1)[0]
        if path and path != ":memory:":
            return Path(path + "-spool")
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"servekit-request-log-{os.getuid()}-{digest}"  # a folder per user


def encode(record: RequestLog) -> bytes:
    return orjson.dumps(record) + b"\n"


def decode(line: bytes) -> RequestLog:
    doc = orjson.loads(line)
    doc["predictions"] = [PredictionLog(**p) for p in doc["predictions"]]
    return RequestLog(**doc)


def _complete_lines(data: bytes) -> tuple[list[bytes], int]:
    """The whole lines at the start of ``data`` and how many bytes they take."""
    end = data.rfind(b"\n") + 1
    return data[:end].split(b"\n")[:-1], end


def _position(seq: int, at: int) -> bytes:
    """Where the owner's shipping stands, kept in its lock file (fixed width: each write covers the last)."""
    return f"{seq:09d} {at:012d}\n".encode()


def _read_position(fd: int) -> tuple[int, int]:
    try:
        seq, at = os.pread(fd, 32, 0).split()
        return int(seq), int(at)
    except ValueError:
        return 0, 0  # nothing shipped yet


def _decode_all(lines: list[bytes], where: str) -> list[RequestLog]:
    records = []
    for line in lines:
        try:
            records.append(decode(line))
        except (ValueError, TypeError, KeyError):
            log.warning("request log spool %s: a line that is not a record was skipped", where)
    return records


class Spool:
    """One process's spool files and the thread that ships them (and abandoned ones) with ``ship``."""

    def __init__(self, folder: Path | str, ship: Callable[[list[RequestLog]], None]):
        self.folder = Path(folder)
        self.ship = ship
        self._pid = -1
        self._torn = False
        self._fresh_locks()
        os.register_at_fork(after_in_child=partial(_after_fork, weakref.ref(self)))

    def _fresh_locks(self) -> None:
        """New locks (a forked child's copies may be held by a thread that is not there)."""
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)

    # -- the writing side (any thread of the process) ----------------------------------------

    def append(self, record: RequestLog) -> bool:
        """Put ``record`` in the spool; ``False`` when it could not be kept (counted by the caller)."""
        line = encode(record)
        with self._lock:
            self._ensure_open()
            if self._appended - self._shipped + len(line) > MAX_SPOOL_BYTES:
                return False
            if self._torn:  # the last write failed halfway: end its line, so that this one stands alone
                line = b"\n" + line
            written = 0
            try:
                while written < len(line):  # one call in all but a short write (a signal, a full disk)
                    written += os.write(self._fd, line[written:])
            finally:
                if written:  # nothing written leaves the file as it was
                    self._torn = written < len(line)
                self._appended += written
                self._size += written
            if self._size >= SEGMENT_BYTES:
                self._rotate()
            self._wake.notify()
        return True

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every record this process appended so far is in the store."""
        deadline = time.monotonic() + timeout
        with self._lock:
            if self._pid != os.getpid():
                return True
            target = self._appended  # bytes, as _shipped
            self._urgent += 1
            self._wake.notify_all()
            try:
                while self._shipped < target:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._wake.wait(left)
            finally:
                self._urgent -= 1
        return True

    def start(self) -> None:
        """Open this process's files and start its shipper (done on first use anyway)."""
        with self._lock:
            self._ensure_open()

    def _ensure_open(self) -> None:
        if self._pid == os.getpid():
            return
        self._forget_parent()
        self._pid = os.getpid()
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.owner = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        # lock first, then the name: another shipper never sees an unlocked lock of a live owner
        staging = self.folder / f".{self.owner}.lock"
        self._lock_fd = os.open(staging, os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        os.rename(staging, self.folder / f"{self.owner}.lock")
        self._seq, self._size, self._fd = -1, 0, -1
        self._appended = self._shipped = 0  # bytes written to and shipped from the spool
        self._torn = False
        self._rotate()
        self._read_seq, self._read_at = 0, 0
        self._stopping, self._urgent = False, 0
        threading.Thread(target=self._ship_loop, name="servekit-request-log", daemon=True).start()
        atexit.register(_at_exit, weakref.ref(self))

    def _forget_parent(self) -> None:
        """After a fork, the parent's descriptors are its own: close the child's copies (the parent's
        lock stays with the parent)."""
        if self._pid == -1:
            return
        for fd in (self._fd, self._lock_fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _segment(self, seq: int) -> Path:
        return self.folder / f"{self.owner}.{seq:06d}.log"

    def _rotate(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._seq += 1
        self._fd = os.open(self._segment(self._seq), os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600)
        self._size = 0

    # -- the shipper (one thread per process) ------------------------------------------------

    def _ship_loop(self) -> None:
        pid, pause, adopted_at = os.getpid(), 0.0, 0.0
        while os.getpid() == pid:
            with self._lock:
                if self._stopping:
                    return
                if self._shipped >= self._appended:
                    self._wake.wait(ADOPT_SECONDS)
                urgent = self._urgent
            if not urgent:
                time.sleep(BATCH_SECONDS)  # gather: one transaction per batch, not per request
            try:
                if time.monotonic() - adopted_at >= ADOPT_SECONDS:
                    adopted_at = time.monotonic()
                    self.adopt()
                while self._ship_own():
                    pass
                pause = 0.0
            except Exception:
                pause = min(MAX_PAUSE, max(0.1, pause * 2))
                log.exception("shipping request logs failed; they stay in the spool, next try in %.1f s", pause)
                time.sleep(pause)

    def _ship_own(self) -> bool:
        """Ship the next batch of this process's own lines; ``True`` while more may be waiting."""
        with self._lock:
            if self._stopping:
                return False
            seq, at, writing = self._read_seq, self._read_at, self._seq
        path = self._segment(seq)
        if not path.exists():  # the folder was removed under us: start afresh at the next record
            log.warning("request log spool %s was removed; records appended to it are lost", path)
            with self._lock:
                self._stopping = True
                self._forget_parent()
                self._pid = -1
                self._wake.notify_all()
            return False
        with open(path, "rb") as f:
            f.seek(at)
            lines, _ = _complete_lines(f.read(READ_BYTES))
            if not lines:  # a line longer than one read, or nothing new
                f.seek(at)
                lines, _ = _complete_lines(f.read())
        lines = lines[:BATCH_SIZE]
        used = sum(len(line) + 1 for line in lines)
        if lines:
            self.ship(_decode_all(lines, path.name))
        with self._lock:
            self._read_at += used
            self._shipped += used
            self._wake.notify_all()
            moved = not lines and seq < writing
            if moved:  # done with a segment the writer left: the next one
                self._read_seq, self._read_at = seq + 1, 0
                path.unlink(missing_ok=True)
            if lines or moved:  # who takes these files over after a kill starts here
                os.pwrite(self._lock_fd, _position(self._read_seq, self._read_at), 0)
            return bool(lines) or moved

    def adopt(self) -> int:
        """Ship and delete the files of every owner that is gone; how many records were shipped."""
        shipped = 0
        for lock in sorted(self.folder.glob("*.lock")):
            owner = lock.name[: -len(".lock")]
            if owner == getattr(self, "owner", None) or owner.startswith("."):
                continue  # our own, or one being made (locked before it gets its name)
            try:
                fd = os.open(lock, os.O_RDWR)
            except FileNotFoundError:
                continue  # another shipper took it over just now
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # its owner is alive
                if not lock.exists() or os.stat(lock).st_ino != os.fstat(fd).st_ino:
                    continue  # another shipper finished it between our open and our lock
                shipped += self._ship_abandoned(owner, *_read_position(fd))
                lock.unlink()
            finally:
                os.close(fd)
        return shipped

    def _ship_abandoned(self, owner: str, from_seq: int, from_at: int) -> int:
        """Ship an owner's segments from where its own shipping stood, then delete them."""
        shipped = 0
        for path in sorted(self.folder.glob(f"{owner}.*.log")):
            seq = int(path.name.rsplit(".", 2)[1])
            data = b"" if seq < from_seq else path.read_bytes()[from_at if seq == from_seq else 0 :]
            lines, used = _complete_lines(data)
            if used < len(data):
                log.warning("request log spool %s ends in a cut line (its process died writing it)", path.name)
            for start in range(0, len(lines), BATCH_SIZE):
                self.ship(_decode_all(lines[start : start + BATCH_SIZE], path.name))
            shipped += len(lines)
            path.unlink()
        if shipped:
            log.info("shipped %d request log(s) left by %s", shipped, owner)
        return shipped

    def close(self, timeout: float = 5.0) -> None:
        """Ship what is left and remove this process's files (they stay if the store is away)."""
        if self._pid != os.getpid():
            return
        if not self.flush(timeout):
            return
        with self._lock:
            if self._shipped < self._appended:
                return  # appended since: the files stay, for another process to ship
            self._stopping = True
            for seq in range(self._read_seq, self._seq + 1):
                self._segment(seq).unlink(missing_ok=True)
            (self.folder / f"{self.owner}.lock").unlink(missing_ok=True)
            os.close(self._fd)
            os.close(self._lock_fd)
            self._pid = -1


def _after_fork(ref: weakref.ref[Spool]) -> None:
    spool = ref()
    if spool is not None:
        spool._fresh_locks()


def _at_exit(ref: weakref.ref[Spool]) -> None:
    spool = ref()
    if spool is not None:
        with contextlib.suppress(Exception):
            spool.close()
