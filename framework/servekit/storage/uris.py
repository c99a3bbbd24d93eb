"""Which model paths are URIs, and what a URI's parts are called.

``s3://bucket/prefix`` and ``gs://bucket/prefix`` name a model folder or a
repository of model folders in object storage; ``https://host/model.tar.gz``
(or ``.tgz``, ``.zip``; ``http://`` too) names an archive of one, as KServe's
storage initializer reads it.  Everything else is a local path.
"""

from __future__ import annotations

from urllib.parse import urlsplit

#: object stores, by URI scheme: the fsspec protocol and the extra that installs it
STORES = {"s3": ("s3", "s3"), "gs": ("gcs", "gcs"), "gcs": ("gcs", "gcs")}
ARCHIVE_SCHEMES = ("http", "https")
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")


def is_uri(path: object) -> bool:
    """Whether a model path is a storage URI (``s3://``, ``gs://``, ``http(s)://``)."""
    text = str(path)
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme.lower() in (*STORES, *ARCHIVE_SCHEMES)


def scheme(uri: str) -> str:
    return uri.partition("://")[0].lower()


def is_archive(uri: str) -> bool:
    return scheme(uri) in ARCHIVE_SCHEMES


def normalized(uri: str) -> str:
    """The URI without a trailing slash (``s3://b/models/`` and ``s3://b/models`` are one path)."""
    if is_archive(uri):
        return uri
    return uri.rstrip("/") if uri.count("/") > 2 else uri


def basename(uri: str) -> str:
    """The name the URI's folder has in the cache: its last path part (a model's name, or a repository's).

    An archive's name drops its suffix: ``https://host/iris.tar.gz`` is ``iris``.
    """
    if is_archive(uri):
        path = urlsplit(uri).path.rstrip("/")
        name = path.rsplit("/", 1)[-1] or urlsplit(uri).hostname or "model"
        for suffix in ARCHIVE_SUFFIXES:
            if name.lower().endswith(suffix):
                return name[: -len(suffix)] or "model"
        return name
    rest = normalized(uri).partition("://")[2]
    return rest.rsplit("/", 1)[-1] or "model"


def store_path(uri: str) -> str:
    """The path fsspec's object-store filesystems take: ``bucket/prefix``."""
    return normalized(uri).partition("://")[2]


def bucket(uri: str) -> str:
    return store_path(uri).split("/", 1)[0]


def check(uri: str) -> None:
    """:raises ValueError: a URI servekit cannot read, named."""
    if is_archive(uri):
        if not urlsplit(uri).hostname:
            raise ValueError(f"{uri}: an archive URI needs a host")
        if not urlsplit(uri).path.lower().endswith(ARCHIVE_SUFFIXES):
            raise ValueError(f"{uri}: an http(s) model path names an archive (.tar.gz, .tgz, .tar or .zip)")
        return
    if not bucket(uri):
        raise ValueError(f"{uri}: the URI names no bucket")
