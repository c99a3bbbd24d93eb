"""The local cache of model URIs: what the control plane downloads, and what every process reads.

A model URI is mirrored into a folder of the cache (:func:`local_path`) laid
out as on the store, so the rest of servekit reads local folders only: the
workers and model hosts never touch the store.  Only the server's owner (the
process that polls, :mod:`servekit.control.plan`) syncs: it lists the URI,
downloads the top-level files of each model folder (``servekit.yaml``), asks
the model's version policy which versions it wants, and downloads each
wanted version completely into a temporary folder beside it, checks every
file's size, and renames it into place, so no process ever reads half a
version.  A version that left the store is dropped from the cache; one that
the policy stopped wanting is dropped one sync later.  A state file
(``.servekit-storage.json``) in each cached folder names its URI and what was
downloaded, so an unchanged version is not downloaded again, not even after a
restart.  An ``http(s)://`` archive is downloaded and unpacked whole, again
when its ``ETag``/``Last-Modified``/size change.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tarfile
import tempfile
import threading
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from servekit.folders.layout import version_of
from servekit.storage.errors import StorageError
from servekit.storage.filesystems import describe, filesystem
from servekit.storage.uris import basename, check, is_archive, normalized, store_path

log = logging.getLogger("servekit.storage")

STATE = ".servekit-storage.json"
CACHE_ENV = "SERVEKIT_MODEL_CACHE_DIR"
_IGNORED = (".", "README", "LICENSE")

#: ``select(versions on the store) -> versions to download``: the model's version policy
Select = Callable[[list[int]], list[int]]


@dataclass
class Synced:
    """What one sync of a model folder found.

    :param versions: the model's versions on the store and their cache folders (``None``:
        read the cache, as for an archive); ``{}`` when the listing failed.
    :param errors: versions whose download failed, with why (naming the URI).
    :param error: the listing itself failed (the cache is left as it was).
    """

    versions: dict[int, Path] | None = None
    errors: dict[int, str] = field(default_factory=dict)
    error: str = ""


# -- the cache ---------------------------------------------------------------------------------


def cache_root() -> Path:
    """``SERVEKIT_MODEL_CACHE_DIR`` (``--model-cache-dir``), else the user's cache folder."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "servekit" / "models"


def local_path(uri: str) -> Path:
    """The cache folder that mirrors ``uri`` (no network): ``CACHE/<digest>/<name>``."""
    uri = normalized(uri)
    digest = hashlib.sha256(uri.encode()).hexdigest()[:16]
    return cache_root() / digest / basename(uri)


def read_state(folder: Path) -> dict[str, Any]:
    try:
        state = json.loads((folder / STATE).read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def _write_state(folder: Path, state: dict[str, Any]) -> None:
    if read_state(folder) == state:
        return  # unchanged: the folder's modification times stay as they are
    tmp = folder / (STATE + ".tmp")
    tmp.write_text(json.dumps(state, sort_keys=True))
    tmp.replace(folder / STATE)


def source_of(folder: Path) -> tuple[Path, dict[str, Any]] | None:
    """The cached folder ``folder`` belongs to and its state, ``None`` for a local folder.

    A model folder of a store has its own state; a model inside an unpacked archive
    (a repository archive) has its archive's, one folder up.
    """
    folder = Path(folder)
    for candidate in (folder, folder.parent):
        state = read_state(candidate)
        if state.get("uri") and (candidate == folder or state.get("kind") == "archive"):
            return candidate, state
    return None


_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """One sync of a cached URI at a time, across threads and processes (two servers, one cache)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _locks_guard:
        lock = _locks.setdefault(str(folder), threading.Lock())
    with lock, open(folder.parent / ".lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _swap(fresh: Path, target: Path) -> None:
    """Put the complete folder ``fresh`` at ``target`` (two renames; the old one removed after)."""
    old = None
    if target.exists():
        old = target.with_name(f".old-{target.name}-{os.getpid()}-{threading.get_ident()}")
        target.rename(old)
    fresh.rename(target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# -- listing a store ------------------------------------------------------------------------------


def _list(fs: Any, uri: str) -> dict[str, dict[str, Any]]:
    """Every file under ``uri``: relative path -> its info (size, ETag, ...).

    :raises StorageError: no such bucket or prefix, no credentials, no network.
    """
    root = store_path(uri)
    try:
        found = fs.find(root, detail=True, withdirs=False)
    except Exception as exc:
        raise StorageError(describe(exc, uri)) from None
    files: dict[str, dict[str, Any]] = {}
    for path, info in found.items():
        rel = str(path)[len(root) :].lstrip("/")
        if rel and info.get("type", "file") != "directory" and not rel.endswith("/"):
            files[rel] = info
    if not files:
        try:
            exists = fs.exists(root)
        except Exception as exc:
            raise StorageError(describe(exc, uri)) from None
        if not exists:
            raise StorageError(f"{uri}: not found (no such bucket or prefix, or nothing under it)")
    return files


def _tag(info: dict[str, Any]) -> str:
    for key in ("ETag", "etag", "md5Hash", "crc32c", "LastModified", "updated", "mtime", "Last-Modified"):
        if info.get(key):
            return str(info[key])
    return ""


def _fingerprint(files: dict[str, dict[str, Any]]) -> str:
    digest = hashlib.sha256()
    for rel in sorted(files):
        digest.update(f"{rel}\0{files[rel].get('size')}\0{_tag(files[rel])}\n".encode())
    return digest.hexdigest()[:32]


def _is_model(files: dict[str, dict[str, Any]]) -> bool:
    """Model folder or repository, by the rule local folders follow (servekit.folders.layout)."""
    for rel in files:
        first, sep, _ = rel.partition("/")
        if sep and first.isascii() and first.isdigit() and int(first) > 0:
            return True
        if not sep and not first.startswith(_IGNORED) and not first.lower().endswith((".md", ".txt")):
            return True
    return False


def _under(files: dict[str, dict[str, Any]], prefix: str) -> dict[str, dict[str, Any]]:
    return {rel[len(prefix) + 1 :]: info for rel, info in files.items() if rel.startswith(prefix + "/")}


def _download(fs: Any, uri: str, files: dict[str, dict[str, Any]], into: Path) -> None:
    """``files`` (relative to ``uri``) into the folder ``into``, every size checked."""
    root = store_path(uri)
    remote, local = [], []
    for rel in sorted(files):
        target = into / PurePosixPath(rel)
        if ".." in PurePosixPath(rel).parts:
            raise StorageError(f"{uri}: refusing the object name {rel!r}")
        target.parent.mkdir(parents=True, exist_ok=True)
        remote.append(f"{root}/{rel}")
        local.append(str(target))
    try:
        if remote:
            fs.get(remote, local)
    except Exception as exc:
        raise StorageError(describe(exc, uri)) from None
    for rel, path in zip(sorted(files), local, strict=True):
        want = files[rel].get("size")
        got = os.path.getsize(path) if os.path.exists(path) else -1
        if want is not None and got != int(want):
            raise StorageError(f"{uri}/{rel}: truncated download ({got} of {want} bytes)")


# -- syncing ----------------------------------------------------------------------------------


def _own_policy(folder: Path) -> Select:
    """The version policy of the cached folder's own ``servekit.yaml`` (latest when unreadable)."""
    from servekit.folders.servekit_yaml import ConfigError, parse_model_config, read_raw_config, select_versions

    def select(versions: list[int]) -> list[int]:
        try:
            config = parse_model_config(read_raw_config(folder), folder)
        except ConfigError:
            return sorted(versions)[-1:]
        return select_versions(config.version_policy, versions)

    return select


def prepare(uri: str, select: Callable[[Path], Select] | None = None) -> Path:
    """Mirror ``uri`` into the cache now and return its folder (a model folder or a repository).

    :param select: the version policy of each model folder, given its cache folder;
        default: the folder's own ``servekit.yaml``.
    :raises StorageError: the URI cannot be read (its message names it).
    """
    uri = normalized(uri)
    try:
        check(uri)
    except ValueError as exc:
        raise StorageError(str(exc)) from None
    folder = local_path(uri)
    policy = select or _own_policy
    with _locked(folder):
        if is_archive(uri):
            _sync_archive(uri, folder)
            return folder
        fs = filesystem(uri)
        files = _list(fs, uri)
        if _is_model(files):
            synced = _sync_model(fs, uri, folder, files, policy(folder))
            if synced.errors:
                raise StorageError("; ".join(synced.errors[v] for v in sorted(synced.errors)))
            return folder
        folder.mkdir(parents=True, exist_ok=True)
        models = _sync_repository(fs, uri, folder, files, policy)
        for child in folder.iterdir():  # model folders that left the store
            if child.is_dir() and child.name not in models and read_state(child).get("uri"):
                shutil.rmtree(child, ignore_errors=True)
        _write_state(folder, {"uri": uri, "kind": "repository"})
    return folder


def _sync_repository(
    fs: Any,
    uri: str,
    folder: Path,
    files: dict[str, dict[str, Any]],
    policy: Callable[[Path], Select],
    only_new: bool = False,
) -> list[str]:
    """Mirror each model folder of a repository (``only_new``: those not in the cache yet); their names."""
    models = sorted({rel.split("/", 1)[0] for rel in files if "/" in rel and not rel.startswith(".")})
    for name in models:
        sub = _under(files, name)
        if _is_model(sub) and not (only_new and read_state(folder / name).get("uri")):
            synced = _sync_model(fs, f"{uri}/{name}", folder / name, sub, policy(folder / name))
            if synced.errors:
                log.error("%s", "; ".join(synced.errors.values()))
    return models


_listing_errors: dict[str, str] = {}  # the last listing error of each repository, logged once


def sync_new_models(folder: Path) -> None:
    """Mirror the model folders added to a cached repository's store since it was last listed.

    Each is downloaded by its own version policy, as at the start, so the repository's
    folder then holds it like a model folder copied into a local repository (the control
    plane finds it by name).  Nothing for a local folder, a model folder or an archive;
    a listing that fails is logged once and leaves the cache as it is.
    """
    state = read_state(folder)
    if state.get("kind") != "repository" or not state.get("uri"):
        return
    uri = str(state["uri"])
    try:
        with _locked(folder):
            fs = filesystem(uri)
            _sync_repository(fs, uri, folder, _list(fs, uri), _own_policy, only_new=True)
    except StorageError as exc:
        if _listing_errors.get(uri) != str(exc):
            log.error("%s; no new model folder is looked for until it answers", exc)
        _listing_errors[uri] = str(exc)
        return
    _listing_errors.pop(uri, None)


def sync(folder: Path, select: Select) -> Synced | None:
    """Bring one cached model folder in step with its store (the control plane's poll).

    ``None`` for a local folder.  A listing that fails leaves the cache as it was
    (the server keeps serving it) and says why in :attr:`Synced.error`.
    """
    found = source_of(folder)
    if found is None:
        return None
    cached, state = found
    uri = str(state["uri"])
    try:
        with _locked(cached):
            if state.get("kind") == "archive":
                _sync_archive(uri, cached)
                return Synced(None)
            fs = filesystem(uri)
            files = _list(fs, uri)
            return _sync_model(fs, uri, cached, files, select)
    except StorageError as exc:
        return Synced({}, error=str(exc))


def _split(files: dict[str, dict[str, Any]]) -> tuple[dict[int, dict[str, dict[str, Any]]], dict[str, dict[str, Any]]]:
    """A model folder's files as its version folders' files and its top-level files."""
    by_version: dict[int, dict[str, dict[str, Any]]] = {}
    top: dict[str, dict[str, Any]] = {}
    for rel, info in files.items():
        first, sep, rest = rel.partition("/")
        if sep and first.isascii() and first.isdigit() and int(first) > 0:
            by_version.setdefault(int(first), {})[rest] = info
        elif not sep:
            top[rel] = info
    return by_version, top


def _sync_model(fs: Any, uri: str, folder: Path, files: dict[str, dict[str, Any]], select: Select) -> Synced:
    by_version, top = _split(files)
    state = read_state(folder)
    if not by_version:  # no version folders: the folder itself is version 1
        return _sync_whole(fs, uri, folder, files, state)
    folder.mkdir(parents=True, exist_ok=True)
    fresh: dict[str, Any] = {"uri": uri, "kind": "model", "top": _sync_top(fs, uri, folder, top, state)}
    wanted = [v for v in select(sorted(by_version)) if v in by_version]
    errors: dict[int, str] = {}
    done: dict[str, str] = dict(state.get("versions", {}))
    for version in wanted:
        mark = _fingerprint(by_version[version])
        if done.get(str(version)) == mark and (folder / str(version)).is_dir():
            continue
        try:
            _download_version(fs, f"{uri}/{version}", by_version[version], folder / str(version))
            done[str(version)] = mark
        except StorageError as exc:
            errors[version] = str(exc)
    # dropped: versions that left the store, and those the policy stopped wanting a sync ago
    keep = (set(wanted) | set(state.get("wanted", []))) & set(by_version)
    for entry in folder.iterdir():
        number = version_of(entry)
        if number is not None and number not in keep:
            shutil.rmtree(entry, ignore_errors=True)
    fresh["versions"] = {v: m for v, m in done.items() if int(v) in keep and (folder / v).is_dir()}
    fresh["wanted"] = sorted(wanted)
    _write_state(folder, fresh)
    return Synced({v: folder / str(v) for v in sorted(by_version)}, errors)


def _sync_top(fs: Any, uri: str, folder: Path, top: dict[str, dict[str, Any]], state: dict[str, Any]) -> dict[str, str]:
    """The model folder's own files (``servekit.yaml``, ...), each replaced whole when it changed."""
    marks = {}
    for name, info in sorted(top.items()):
        mark = _fingerprint({name: info})
        if state.get("top", {}).get(name) != mark or not (folder / name).is_file():
            tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=folder))
            try:
                _download(fs, uri, {name: info}, tmp)
                (tmp / name).replace(folder / name)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        marks[name] = mark
    for name in state.get("top", {}):
        if name not in top:
            (folder / name).unlink(missing_ok=True)
    return marks


def _download_version(fs: Any, uri: str, files: dict[str, dict[str, Any]], target: Path) -> None:
    """A version folder, downloaded whole into a temporary folder beside it, then renamed into place."""
    tmp = Path(tempfile.mkdtemp(prefix=f".download-{target.name}-", dir=target.parent))
    try:
        _download(fs, uri, files, tmp)
        _swap(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("downloaded %s into the model cache", uri)


def _sync_whole(fs: Any, uri: str, folder: Path, files: dict[str, dict[str, Any]], state: dict[str, Any]) -> Synced:
    """A model folder without version folders: downloaded whole, as version 1."""
    mark = _fingerprint(files)
    if state.get("whole") != mark or not folder.is_dir():
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".download-{folder.name}-", dir=folder.parent))
        try:
            _download(fs, uri, files, tmp)
            _write_state(tmp, {"uri": uri, "kind": "model", "whole": mark})
            _swap(tmp, folder)
            log.info("downloaded %s into the model cache", uri)
        except StorageError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if not folder.is_dir():
                raise
            return Synced({1: folder}, {1: str(exc)})
    return Synced({1: folder})


# -- archives ------------------------------------------------------------------------------------


def _sync_archive(uri: str, folder: Path) -> None:
    """Download and unpack an http(s) archive into ``folder`` when it changed (or is not cached)."""
    fs = filesystem(uri)
    try:
        info = fs.info(uri)
    except Exception as exc:
        raise StorageError(describe(exc, uri)) from None
    mark = "|".join(str(info.get(k, "")) for k in ("size", "ETag", "Last-Modified", "Content-MD5"))
    if read_state(folder).get("archive") == mark and folder.is_dir():
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".download-", dir=folder.parent))
    try:
        file = work / "archive"
        try:
            fs.get_file(uri, str(file))
        except Exception as exc:
            raise StorageError(describe(exc, uri)) from None
        size = info.get("size")
        if size is not None and file.stat().st_size != int(size):
            raise StorageError(f"{uri}: truncated download ({file.stat().st_size} of {size} bytes)")
        unpacked = work / "unpacked"
        unpacked.mkdir()
        _unpack(uri, file, unpacked)
        _write_state(unpacked, {"uri": uri, "kind": "archive", "archive": mark})
        _swap(unpacked, folder)
        log.info("downloaded and unpacked %s into the model cache", uri)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _unpack(uri: str, file: Path, into: Path) -> None:
    """Unpack a tar (any compression) or zip file; members that would leave ``into`` are refused."""
    try:
        if zipfile.is_zipfile(file):
            with zipfile.ZipFile(file) as archive:
                for member in archive.namelist():
                    parts = PurePosixPath(member).parts
                    if PurePosixPath(member).is_absolute() or ".." in parts:
                        raise StorageError(f"{uri}: the archive member {member!r} leaves its folder")
                archive.extractall(into)
            return
        with tarfile.open(file) as archive:
            if hasattr(tarfile, "data_filter"):
                archive.extractall(into, filter="data")
                return
            for entry in archive.getmembers():  # a Python before extraction filters (3.10.11, 3.11.3)
                parts = PurePosixPath(entry.name).parts
                if PurePosixPath(entry.name).is_absolute() or ".." in parts or entry.issym() or entry.islnk():
                    raise StorageError(f"{uri}: the archive member {entry.name!r} leaves its folder")
            archive.extractall(into)
    except (tarfile.TarError, zipfile.BadZipFile, OSError) as exc:
        raise StorageError(f"{uri}: not a readable .tar.gz or .zip archive ({exc})") from None
