"""Model files sent in a load request (Triton's ``file:<path>`` parameters), written to disk.

Triton deploys a model through its API this way: the load's parameters carry
the files of a model folder, keyed ``file:1/model.onnx`` and so on, and they
replace what the repository holds for that model.  Each such load gets a fresh
folder in one private temporary folder of the server (removed at exit), so the
workers see a new folder and load it beside the version still serving.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from pathlib import Path, PurePosixPath

from servekit.errors import BadRequest

PREFIX = "file:"


def relative_path(key: str, name: str) -> PurePosixPath:
    """The file's path inside the model folder; refuses any path that leaves it."""
    path = PurePosixPath(key[len(PREFIX) :] if key.startswith(PREFIX) else key)
    if not path.parts or path.is_absolute() or ".." in path.parts or "\\" in str(path):
        raise BadRequest(f"failed to load {name!r}: file parameter {key!r} must be a relative path in the model folder")
    return path


class Uploads:
    def __init__(self) -> None:
        self._root: Path | None = None
        self._count = 0
        self._lock = threading.Lock()

    def write(self, name: str, files: dict[str, bytes]) -> Path:
        """A new model folder holding ``files`` (relative path -> bytes)."""
        paths = {relative_path(key, name): data for key, data in files.items()}
        with self._lock:
            if self._root is None:
                self._root = Path(tempfile.mkdtemp(prefix="servekit-uploads-"))
                atexit.register(_remove, self._root, os.getpid())
            self._count += 1
            folder = self._root / f"{self._count}" / name
        for path, data in paths.items():
            target = folder / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        return folder


def _remove(root: Path, owner: int) -> None:
    if os.getpid() == owner:  # not in a worker forked after the folder was made
        shutil.rmtree(root, ignore_errors=True)
