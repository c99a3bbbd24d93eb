"""The hand-off between an HTTP worker and a model host: a socket for headers, shared memory for tensors.

Each connection owns two shared-memory *slabs*: the worker writes request
tensors into its ``in`` slab, the host writes answers into the ``out`` slab,
and only a small pickled header (names, dtypes, shapes, offsets, options)
crosses the Unix socket.  Numeric arrays are never pickled; anything else (a
string tensor, a list of examples, a ``ModelMetadata``) rides in the header.

A slab is a file in ``/dev/shm`` (Linux), mapped by both sides and unlinked
as soon as the second side has mapped it: Linux keeps a mapping alive after
its name is gone, so a ``kill -9`` of either side leaves nothing behind.  The
short window between creating a slab and the peer mapping it is covered by
name prefixes (``servekit-<server>-<pid>-``) that the survivors sweep.
"""

from __future__ import annotations

import itertools
import mmap
import os
import pickle
import socket
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from servekit.errors import ServekitError

SHM_DIR = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
SLAB_MIN = 64 * 1024
_ALIGN = 64
_HEADER = struct.Struct("<I")
_counter = itertools.count()


class PeerGone(ConnectionError):
    """The other side of a connection closed it or died."""


# ---------------------------------------------------------------------------
# Slabs
# ---------------------------------------------------------------------------


class Slab:
    """One mapped shared-memory file; ``name`` is set only while the file still exists."""

    def __init__(self, name: str, size: int, *, create: bool):
        path = SHM_DIR / name
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            else:
                size = os.fstat(fd).st_size
            self.map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.name: str | None = name
        self.size = size

    @classmethod
    def create(cls, prefix: str, size: int) -> Slab:
        size = max(SLAB_MIN, 1 << max(0, size - 1).bit_length())
        return cls(f"{prefix}{next(_counter)}", size, create=True)

    @classmethod
    def attach(cls, name: str) -> Slab:
        """Map a slab the peer made and remove its name: from now on only mappings hold it."""
        slab = cls(name, 0, create=False)
        slab.unlink()
        return slab

    def unlink(self) -> None:
        if self.name is not None:
            try:
                os.unlink(SHM_DIR / self.name)
            except FileNotFoundError:
                pass
            self.name = None

    def close(self) -> None:
        self.unlink()
        try:
            self.map.close()
        except BufferError:  # an array still views it; the mapping goes with the array
            pass


def sweep(prefix: str) -> int:
    """Remove leftover slabs whose names start with ``prefix``; returns how many."""
    removed = 0
    for entry in SHM_DIR.glob(prefix + "*"):
        try:
            entry.unlink()
            removed += 1
        except OSError:
            pass
    return removed


# ---------------------------------------------------------------------------
# Packing values: numeric arrays into a slab, the rest into the header
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ShmArray:
    """Where an array lies in a slab."""

    offset: int
    dtype: str
    shape: tuple[int, ...]


def _shareable(value: Any) -> bool:
    return isinstance(value, np.ndarray) and value.dtype.kind in "biufcmM" and not value.dtype.hasobject


def _arrays(value: Any) -> list[np.ndarray]:
    if _shareable(value):
        return [value]
    if isinstance(value, dict):
        return [v for v in value.values() if _shareable(v)]
    if isinstance(value, (list, tuple)):
        return [v for v in value if _shareable(v)]
    return []


def needed(values: list[Any]) -> int:
    """Bytes a slab needs to hold every shareable array of ``values``."""
    return sum(_aligned(a.nbytes) for v in values for a in _arrays(v))


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class Packer:
    """Writes arrays into a slab from offset 0 on, replacing them by :class:`ShmArray`."""

    def __init__(self, slab: Slab):
        self.slab = slab
        self.offset = 0

    def pack(self, value: Any) -> Any:
        if _shareable(value):
            return self._put(value)
        if isinstance(value, dict):
            return {k: self._put(v) if _shareable(v) else v for k, v in value.items()}
        if isinstance(value, (list, tuple)) and any(_shareable(v) for v in value):
            return type(value)(self._put(v) if _shareable(v) else v for v in value)
        return value

    def _put(self, array: np.ndarray) -> ShmArray:
        start = self.offset
        target: np.ndarray = np.ndarray(array.shape, array.dtype, buffer=self.slab.map, offset=start)
        np.copyto(target, array, casting="no")
        self.offset = start + _aligned(array.nbytes)
        return ShmArray(start, array.dtype.str, tuple(array.shape))


def unpack(value: Any, slab: Slab, *, copy: bool) -> Any:
    """The inverse of :meth:`Packer.pack`; ``copy=False`` gives views into the slab."""
    if isinstance(value, ShmArray):
        array: np.ndarray = np.ndarray(value.shape, np.dtype(value.dtype), buffer=slab.map, offset=value.offset)
        return array.copy() if copy else array
    if isinstance(value, dict):
        return {k: unpack(v, slab, copy=copy) if isinstance(v, ShmArray) else v for k, v in value.items()}
    if isinstance(value, (list, tuple)) and any(isinstance(v, ShmArray) for v in value):
        return type(value)(unpack(v, slab, copy=copy) if isinstance(v, ShmArray) else v for v in value)
    return value


# ---------------------------------------------------------------------------
# Framing on the socket
# ---------------------------------------------------------------------------

#: One ``recv`` reads up to this much: a whole header, almost always.
RECV_SIZE = 64 * 1024


def encode(header: dict[str, Any]) -> bytes:
    body = pickle.dumps(header, protocol=5)
    return _HEADER.pack(len(body)) + body


def send(sock: socket.socket, header: dict[str, Any]) -> None:
    sock.sendall(encode(header))


class Framer:
    """Whole messages out of one socket's byte stream: one ``recv`` per message, not two.

    :meth:`read` blocks for the next message; :meth:`ready` (the host's loop,
    on a socket ``epoll`` found readable) returns what has arrived without
    waiting.  Several messages in one read (a stream's items) are kept in order.
    """

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = bytearray()

    def read(self) -> dict[str, Any]:
        while True:
            message = self._next()
            if message is not None:
                return message
            self._fill(self.sock.recv(RECV_SIZE))

    def ready(self) -> list[dict[str, Any]]:
        try:
            self._fill(self.sock.recv(RECV_SIZE, socket.MSG_DONTWAIT))
        except BlockingIOError:
            pass
        messages = []
        while (message := self._next()) is not None:
            messages.append(message)
        return messages

    def _fill(self, chunk: bytes) -> None:
        if not chunk:
            raise PeerGone("the other side closed the connection")
        self.buf += chunk

    def _next(self) -> dict[str, Any] | None:
        buf = self.buf
        if len(buf) < _HEADER.size:
            return None
        (length,) = _HEADER.unpack_from(buf)
        end = _HEADER.size + length
        if len(buf) < end:
            return None
        body = bytes(buf[_HEADER.size : end])
        del buf[:end]
        return pickle.loads(body)


# ---------------------------------------------------------------------------
# A request's arguments and an answer's error
# ---------------------------------------------------------------------------


def arguments(request: dict[str, Any], slab: Slab) -> tuple[list[Any], dict[str, Any]]:
    """A request's arguments; its arrays are views into the request slab, valid until the reply."""
    args = [unpack(a, slab, copy=False) for a in request.get("args", ())]
    kwargs = {k: unpack(v, slab, copy=False) for k, v in request.get("kwargs", {}).items()}
    return args, kwargs


def error_of(exc: BaseException) -> tuple[str, str]:
    """An exception as it crosses to the worker: the servekit error's class name (its HTTP status) and message."""
    if isinstance(exc, ServekitError):
        return type(exc).__name__, exc.message
    return "ModelFailure", f"model host failed: {type(exc).__name__}: {exc}"
