"""Model paths in object storage: ``s3://``, ``gs://`` and ``https://`` archives (docs/model-storage.md).

A URI is mirrored into a local cache folder (:mod:`.mirror`); everything else
in servekit reads that folder like any local one.  Only the server's owner
syncs (:mod:`servekit.control.plan` asks :func:`sync` on every poll), so the
workers and model hosts read local files and never need the store's
credentials or libraries.  fsspec reads the stores (:mod:`.filesystems`:
``s3fs`` and ``gcsfs`` behind the ``s3`` and ``gcs`` extras).
"""

from __future__ import annotations

from pathlib import Path

from servekit.storage.errors import StorageError
from servekit.storage.mirror import CACHE_ENV, Synced, cache_root, local_path, prepare, source_of, sync, sync_new_models
from servekit.storage.uris import is_uri

__all__ = [
    "CACHE_ENV",
    "StorageError",
    "Synced",
    "cache_root",
    "is_uri",
    "local_path",
    "local_paths",
    "prepare",
    "prepare_paths",
    "source_of",
    "sync",
    "sync_new_models",
]

_prepared: dict[str, Path] = {}


def local_paths(paths: list[str]) -> list[Path]:
    """Model paths as local folders: a URI as its cache folder (no network)."""
    return [local_path(p) if is_uri(p) else Path(p) for p in paths]


def prepare_paths(paths: list[str]) -> list[Path]:
    """Mirror every URI among ``paths`` once in this process (the server's owner, before it forks).

    :raises StorageError: a URI cannot be read.
    """
    out = []
    for path in paths:
        if not is_uri(path):
            out.append(Path(path))
            continue
        if path not in _prepared:
            _prepared[path] = prepare(path)
        out.append(_prepared[path])
    return out
