"""fsspec filesystems for model URIs, configured from the environment as servekit's peers read it.

S3 (``s3fs``, ``pip install 'servekit[s3]'``): credentials from botocore's
standard chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``,
``AWS_PROFILE``, ``~/.aws``, instance and pod roles); ``AWS_REGION`` (or
``AWS_DEFAULT_REGION``); ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` for an
S3-compatible store (MinIO, Ceph, ...), or TF Serving's and KServe's
``S3_ENDPOINT`` (``host:port``) with ``S3_USE_HTTPS`` and ``S3_VERIFY_SSL``
(``0`` turns each off); ``AWS_ANON=true`` (or ``AWS_NO_SIGN_REQUEST=true``)
reads a public bucket unsigned.

Google Cloud Storage (``gcsfs``, ``pip install 'servekit[gcs]'``): the
application-default credentials (``GOOGLE_APPLICATION_CREDENTIALS``, the
metadata server), anonymous when there are none; ``STORAGE_EMULATOR_HOST``
points it at an emulator.

http(s) archives go through fsspec's own HTTP filesystem (aiohttp).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from servekit.storage.errors import StorageError
from servekit.storage.uris import scheme

_FALSE = ("0", "false", "no", "off")
_TRUE = ("1", "true", "yes", "on")


def _env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    return default


def s3_options(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The ``s3fs.S3FileSystem`` options the environment asks for."""
    env = os.environ if environ is None else environ
    options: dict[str, Any] = {}
    client: dict[str, Any] = {}
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or ""
    use_https = env.get("S3_USE_HTTPS", "1").strip().lower() not in _FALSE
    if not endpoint and env.get("S3_ENDPOINT"):
        endpoint = env["S3_ENDPOINT"]
        if "://" not in endpoint:  # TF Serving's form: host:port, the scheme from S3_USE_HTTPS
            endpoint = ("https://" if use_https else "http://") + endpoint
    if endpoint:
        options["endpoint_url"] = endpoint
    if env.get("S3_VERIFY_SSL", "1").strip().lower() in _FALSE:
        client["verify"] = False
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        client["region_name"] = region
    anon = any(env.get(n, "").strip().lower() in _TRUE for n in ("AWS_ANON", "AWS_NO_SIGN_REQUEST"))
    if anon:
        options["anon"] = True
    if client:
        options["client_kwargs"] = client
    return options


#: environment variables a filesystem is made from: one is made again when any of them changes
_ENV_KEYS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ANON",
    "AWS_NO_SIGN_REQUEST",
    "S3_ENDPOINT",
    "S3_USE_HTTPS",
    "S3_VERIFY_SSL",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "STORAGE_EMULATOR_HOST",
)
_made: dict[tuple[str, tuple[str, ...]], Any] = {}
_lock = threading.Lock()


def filesystem(uri: str) -> Any:
    """The fsspec filesystem for ``uri``'s scheme, kept between polls, its listing cache emptied.

    Made again when the environment it was made from changes (new credentials).

    :raises StorageError: its extra is not installed.
    """
    key = (scheme(uri), tuple(os.environ.get(k, "") for k in _ENV_KEYS))
    with _lock:
        fs = _made.get(key)
        if fs is None:
            fs = _made[key] = _make(uri)
    fs.invalidate_cache()  # every sync sees the store as it is now
    return fs


def _make(uri: str) -> Any:
    kind = scheme(uri)
    if kind == "s3":
        try:
            import s3fs
        except ImportError:
            raise StorageError(f"{uri}: s3:// model paths need s3fs: pip install 'servekit[s3]'") from None
        return s3fs.S3FileSystem(skip_instance_cache=True, **s3_options())
    if kind in ("gs", "gcs"):
        try:
            # the plain JSON-API filesystem: gcsfs's default class first asks a gRPC API what kind
            # of bucket it is, which emulators do not answer (a minute's timeout per bucket)
            from gcsfs.core import GCSFileSystem
        except ImportError:
            raise StorageError(f"{uri}: gs:// model paths need gcsfs: pip install 'servekit[gcs]'") from None
        return GCSFileSystem(skip_instance_cache=True)
    try:
        from fsspec.implementations.http import HTTPFileSystem
    except ImportError:  # aiohttp
        raise StorageError(f"{uri}: http(s) model archives need aiohttp: pip install 'servekit[storage]'") from None
    return HTTPFileSystem(skip_instance_cache=True)


def describe(exc: BaseException, uri: str) -> str:
    """One line naming the URI and what went wrong (missing bucket, credentials, network)."""
    name = type(exc).__name__
    text = " ".join(str(exc).split()) or name
    if isinstance(exc, FileNotFoundError):
        return f"{uri}: not found (no such bucket or prefix): {text}"
    if isinstance(exc, PermissionError):
        return f"{uri}: access denied (check the credentials): {text}"
    lowered = text.lower()
    if "credentials" in lowered or "signature" in lowered or "accessdenied" in lowered or "forbidden" in lowered:
        return f"{uri}: access denied (check the credentials): {text}"
    return f"{uri}: {text}" if name in text else f"{uri}: {name}: {text}"
