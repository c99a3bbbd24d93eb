"""Model files sent in a load request (Triton's ``file:<path>`` parameters), written to disk.

Triton deploys a model through its API this way: the load's parameters carry
the files of a model folder, keyed ``file:1/model.onnx`` and so on, and they
replace what the repository holds for that model.  Each such load gets a fresh
folder in one private temporary folder of the server (removed at exit), so the
workers see a new folder and load it beside the version still serving.

Every name and size is checked before anything is written (:func:`check`):
a path must stay inside the model folder and fit any file system (no
component over 255 bytes, 1024 bytes in all, no NUL, no empty, ``.`` or
``..`` component), and the files must fit the free space.  A refused or failed
upload answers as Triton's does, ``failed to load 'NAME', failed to poll from
model repository`` (gRPC ``INTERNAL``, which Triton's own
``simple_grpc_model_control.py`` expects), followed by what was wrong with
the client's parameter; over HTTP it is a 400, as the client sent it.  The
server's own paths and error numbers go to its log, never to the client.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path, PurePosixPath

from servekit.errors import BadRequest

log = logging.getLogger("servekit.control")

PREFIX = "file:"
#: The longest path component (a file or folder name) any common file system takes, in bytes.
MAX_NAME_BYTES = 255
#: The longest relative path a file parameter may name, in bytes: far below the system's
#: PATH_MAX (4096) with the server's upload folder in front.
MAX_PATH_BYTES = 1024
#: The most files one load may carry.
MAX_FILES = 10_000
#: Free space left on the upload folder's file system after the files are written.
SPARE_BYTES = 64 * 1024 * 1024


class UploadRefused(BadRequest):
    """A ``file:`` parameter the server does not write: 400 over HTTP, ``INTERNAL`` over gRPC as Triton."""

    grpc_code = "INTERNAL"


def refused(name: str, why: str) -> UploadRefused:
    return UploadRefused(f"failed to load {name!r}, failed to poll from model repository: {why}")


def _shown(key: str) -> str:
    """A parameter name for a message: the client's own, cut short when long."""
    return repr(key if len(key) <= 80 else key[:60] + "..." + key[-12:])


def relative_path(key: str, name: str) -> PurePosixPath:
    """The file's path inside the model folder; refuses any path that leaves it or no file system takes.

    :raises UploadRefused: naming the parameter and what is wrong with it.
    """
    text = key[len(PREFIX) :] if key.startswith(PREFIX) else key
    where = f"file parameter {_shown(key)}"
    if "\x00" in text:
        raise refused(name, f"{where} holds a NUL character")
    if not text or text.startswith("/") or "\\" in text:
        raise refused(name, f"{where} must be a relative path in the model folder")
    parts = text.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise refused(name, f"{where} must be a relative path in the model folder, without empty, '.' or '..' parts")
    encoded = [len(part.encode("utf-8", "surrogatepass")) for part in parts]
    if max(encoded) > MAX_NAME_BYTES:
        raise refused(
            name, f"{where} has a name of {max(encoded)} bytes; a file or folder name takes at most {MAX_NAME_BYTES}"
        )
    total = len(text.encode("utf-8", "surrogatepass"))
    if total > MAX_PATH_BYTES:
        raise refused(name, f"{where} is a path of {total} bytes; the limit is {MAX_PATH_BYTES}")
    return PurePosixPath(text)


def check(name: str, files: dict[str, bytes]) -> dict[PurePosixPath, bytes]:
    """The files by their path in the model folder, every name and size checked (nothing written).

    :raises UploadRefused: a name no file system takes, a path that leaves the folder,
        a file where another needs a folder, content that is not bytes, too many files.
    """
    if len(files) > MAX_FILES:
        raise refused(name, f"a load takes at most {MAX_FILES} files, found {len(files)}")
    paths: dict[PurePosixPath, bytes] = {}
    for key, data in files.items():
        path = relative_path(key, name)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise refused(name, f"file parameter {_shown(key)} must hold the file's bytes")
        paths[path] = bytes(data)
    folders = {parent for path in paths for parent in path.parents}
    clash = sorted(str(path) for path in paths if path in folders)
    if clash:
        raise refused(name, f"file parameter {_shown(PREFIX + clash[0])} is a file, but other files are inside it")
    return paths


class Uploads:
    def __init__(self) -> None:
        self._root: Path | None = None
        self._count = 0
        self._lock = threading.Lock()

    def write(self, name: str, files: dict[str, bytes]) -> Path:
        """A new model folder holding ``files`` (``file:`` key or relative path -> bytes).

        :raises UploadRefused: a file :func:`check` refuses, more bytes than the disk has
            free, or a write that failed (the reason is logged, not answered).
        """
        paths = check(name, files)
        with self._lock:
            if self._root is None:
                self._root = Path(tempfile.mkdtemp(prefix="servekit-uploads-"))
                atexit.register(_remove, self._root, os.getpid())
            self._count += 1
            folder = self._root / f"{self._count}" / name
        size = sum(len(data) for data in paths.values())
        free = shutil.disk_usage(self._root).free
        if size + SPARE_BYTES > free:
            log.warning(
                "load of %s: %d bytes of files do not fit the %d bytes free in %s", name, size, free, self._root
            )
            raise refused(name, f"the server has no room for {size} bytes of model files")
        try:
            for path, data in paths.items():
                target = folder / path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
        except OSError as exc:
            log.error("load of %s: writing its files in %s failed: %s", name, folder, exc)
            shutil.rmtree(folder.parent, ignore_errors=True)
            raise refused(name, "the server could not write the model files (its log says why)") from None
        return folder


def _remove(root: Path, owner: int) -> None:
    if os.getpid() == owner:  # not in a worker forked after the folder was made
        shutil.rmtree(root, ignore_errors=True)
