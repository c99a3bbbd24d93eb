"""API keys with scopes: ``infer``, ``admin`` and ``metrics``.

Keys come from three places, all at once if need be:

- ``--api-key KEY``: one key with every scope (as before scopes existed);
- ``--api-key-file FILE``: one ``SCOPES KEY [FIELD=VALUE ...]`` per line, ``SCOPES`` a
  comma-separated list of scopes (or ``*`` for all), ``KEY`` the key itself or its hash
  ``sha256:<hex>``; ``#`` starts a comment.  The optional fields name the key and bound
  it (:mod:`servekit.server.quotas`): ``name=``, ``requests_per_minute=``,
  ``tokens_per_minute=``, ``max_concurrent=``.  The file is read again when it
  changes (checked at most once a second), so keys rotate without a restart;
- the environment variable ``SERVEKIT_API_KEYS``: the same lines, separated by
  newlines or ``;`` (for a secret mounted as an environment variable).

What each scope opens: ``admin`` the model control plane (``/v2/repository/...``,
TF Serving's config reload, and the request log ``/v1/logs/...``), ``metrics``
the Prometheus pages, ``infer`` everything else (inference and metadata).
The open paths (``--open-paths``: health probes, and ``/metrics`` unless a key
names the ``metrics`` scope) need no key.  Without a key the answer is 401; with
a valid key of the wrong scope, 403.

A key is never kept or compared in the clear: every key is held as its SHA-256
digest, the presented one is hashed once, and it is compared against every
stored digest with :func:`hmac.compare_digest` (no early exit), so neither the
time taken nor the logs tell anything about a key.  One check serves every HTTP
path (Flask's ``before_request`` and the fast lane) and gRPC's interceptor.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servekit.errors import Forbidden, Unauthorized
from servekit.routes import ADMIN_PATHS, METRICS_PATHS, OPEN_PATHS, is_open_path

log = logging.getLogger("servekit.auth")

SCOPES = ("infer", "admin", "metrics")
ENV_KEYS = "SERVEKIT_API_KEYS"
_HASHED = re.compile(r"^sha256:([0-9a-fA-F]{64})$")
_RECHECK_SECONDS = 1.0


def scope_of(path: str) -> str:
    """The scope an HTTP path needs."""
    if any(path.startswith(prefix) for prefix in ADMIN_PATHS):
        return "admin"
    if is_open_path(path, METRICS_PATHS):
        return "metrics"
    return "infer"


#: The bounds a key may carry in the key file, each a positive whole number.
QUOTA_FIELDS = ("requests_per_minute", "tokens_per_minute", "max_concurrent")


@dataclass(frozen=True)
class Quota:
    """What one key may use (``0``: unbounded) and the name it is counted under (never the key)."""

    name: str
    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    max_concurrent: int = 0

    def __bool__(self) -> bool:
        return bool(self.requests_per_minute or self.tokens_per_minute or self.max_concurrent)


def parse_keys(text: str, source: str) -> list[tuple[frozenset[str], bytes]]:
    """``SCOPES KEY`` lines as (scopes, SHA-256 digest) pairs; a bad line is a ``ValueError`` naming it."""
    return [(scopes, digest) for scopes, digest, _ in parse_entries(text, source)]


def parse_entries(text: str, source: str) -> list[tuple[frozenset[str], bytes, Quota]]:
    """``SCOPES KEY [FIELD=VALUE ...]`` lines as (scopes, SHA-256 digest, quota); a bad line or field is named."""
    keys = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) < 2:  # a key may hold '=' (base64): only what follows it are fields
            raise ValueError(f"{source}, line {number}: expected 'SCOPES KEY' then optional FIELD=VALUE items")
        scopes = frozenset(SCOPES) if parts[0] in ("*", "all") else frozenset(parts[0].split(","))
        unknown = scopes - set(SCOPES)
        if unknown:
            raise ValueError(f"{source}, line {number}: unknown scope(s) {', '.join(sorted(unknown))}")
        hashed = _HASHED.match(parts[1])
        digest = bytes.fromhex(hashed.group(1)) if hashed else hashlib.sha256(parts[1].encode()).digest()
        keys.append((scopes, digest, _quota(parts[2:], digest, f"{source}, line {number}")))
    return keys


def _quota(fields: list[str], digest: bytes, where: str) -> Quota:
    pairs = [item.partition("=") for item in fields]
    named = [value for field, _, value in pairs if field == "name"]
    name = named[-1] if named else "sha256:" + digest.hex()[:8]
    if not re.fullmatch(r"[A-Za-z0-9_.:@-]{1,64}", name):
        raise ValueError(f"{where}: name={name!r} must be 1 to 64 letters, digits or _.:@-")
    values: dict[str, Any] = {"name": name}
    for field, sep, value in pairs:
        if not sep or field not in ("name", *QUOTA_FIELDS):
            raise ValueError(
                f"{where}, key {name!r}: unknown field {field!r}; expected name=, {'=, '.join(QUOTA_FIELDS)}="
            )
        if field == "name":
            continue
        if not value.isdigit() or int(value) <= 0:
            raise ValueError(f"{where}, key {name!r}: {field}={value!r} must be a positive whole number")
        values[field] = int(value)
    return Quota(**values)


class ApiKey:
    """Every key the server accepts, with its scopes; ``check`` answers 401/403 or lets a request through."""

    def __init__(
        self,
        key: str | None = None,
        open_paths: Iterable[str] = OPEN_PATHS,
        *,
        key_file: str | None = None,
        env_keys: str | None = None,
    ):
        self._fixed: list[tuple[frozenset[str], bytes]] = []
        #: each key's bounds, by digest (keys without any are left out)
        self._fixed_quotas: dict[bytes, Quota] = {}
        self.quotas: dict[bytes, Quota] = {}
        if key:
            self._fixed.append((frozenset(SCOPES), hashlib.sha256(key.encode()).digest()))
        if env_keys:
            entries = parse_entries(env_keys.replace(";", "\n"), ENV_KEYS)
            self._fixed += [(scopes, digest) for scopes, digest, _ in entries]
            self._fixed_quotas = {digest: quota for _, digest, quota in entries if quota}
            self.quotas = dict(self._fixed_quotas)
        self.key_file = Path(key_file) if key_file else None
        self._file_keys: list[tuple[frozenset[str], bytes]] = []
        self._stamp: tuple[int, int] | None = None
        self._checked = 0.0
        self._lock = threading.Lock()
        self._base_open = tuple(open_paths)
        if self.key_file is not None:
            self._file_keys = self._read_file()
        self.open_paths = self._open_paths()

    @classmethod
    def from_settings(cls, settings: object, environ: dict | None = None) -> ApiKey | None:
        """The keys ``settings`` and the environment name, or ``None`` when there are none."""
        env = os.environ if environ is None else environ
        key, key_file = getattr(settings, "api_key", None), getattr(settings, "api_key_file", None) or None
        env_keys = env.get(ENV_KEYS) or None
        if not (key or key_file or env_keys):
            return None
        return cls(key, getattr(settings, "open_paths", OPEN_PATHS), key_file=key_file, env_keys=env_keys)

    # -- checking -----------------------------------------------------------------------

    def check(self, path: str, authorization: str | None) -> None:
        """Raise 401/403 unless ``path`` is open or the header carries a key with its scope."""
        self._refresh()
        if is_open_path(path, self.open_paths):
            return
        self.require(scope_of(path), authorization, "send 'Authorization: Bearer <key>'")

    def require(self, scope: str, authorization: str | None, how: str) -> None:
        """:class:`Unauthorized` without a known key, :class:`Forbidden` with one lacking ``scope``."""
        self._refresh()
        scopes = self.scopes_of(authorization)
        if scopes is None:
            raise Unauthorized(f"missing or wrong API key; {how}")
        if scope not in scopes:
            raise Forbidden(f"this API key lacks the '{scope}' scope")

    def quota_of(self, authorization: str | None) -> Quota | None:
        """The bounds of the key in an ``Authorization`` value, ``None`` for a key without any (or no key)."""
        self._refresh()
        if not self.quotas:
            return None
        scheme, _, token = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        digest = hashlib.sha256(token.strip().encode()).digest()
        found = None
        for stored, quota in self.quotas.items():  # every entry, no early exit
            if hmac.compare_digest(digest, stored):
                found = quota
        return found

    def scopes_of(self, authorization: str | None) -> frozenset[str] | None:
        """The scopes of the key in an ``Authorization`` value (``Bearer KEY``), ``None`` if unknown."""
        scheme, _, token = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        digest = hashlib.sha256(token.strip().encode()).digest()
        found: frozenset[str] | None = None
        for scopes, stored in self._fixed + self._file_keys:  # every entry, no early exit
            if hmac.compare_digest(digest, stored):
                found = scopes if found is None else found | scopes
        return found

    # -- the key file ---------------------------------------------------------------------

    def _open_paths(self) -> tuple[str, ...]:
        """``--open-paths``, less the metrics pages once a key names the ``metrics`` scope."""
        explicit = any(scopes != frozenset(SCOPES) and "metrics" in scopes for scopes, _ in self._all())
        if not explicit:
            return self._base_open
        return tuple(p for p in self._base_open if not is_open_path(p, METRICS_PATHS))

    def _all(self) -> list[tuple[frozenset[str], bytes]]:
        return self._fixed + self._file_keys

    def _refresh(self) -> None:
        if self.key_file is None or time.monotonic() - self._checked < _RECHECK_SECONDS:
            return
        with self._lock:
            self._checked = time.monotonic()
            try:
                st = self.key_file.stat()
            except OSError:
                return  # a file mid-rotation: keep the keys read last
            if (st.st_mtime_ns, st.st_size) == self._stamp:
                return
            try:
                self._file_keys = self._read_file()
            except (OSError, ValueError) as exc:
                log.error("API key file not reloaded, the previous keys stay: %s", exc)
                return
            self.open_paths = self._open_paths()
            log.info("API key file %s reloaded: %d key(s)", self.key_file, len(self._file_keys))

    def _read_file(self) -> list[tuple[frozenset[str], bytes]]:
        assert self.key_file is not None
        st = self.key_file.stat()
        entries = parse_entries(self.key_file.read_text(), str(self.key_file))
        self._stamp = (st.st_mtime_ns, st.st_size)
        self.quotas = {**self._fixed_quotas, **{digest: quota for _, digest, quota in entries if quota}}
        return [(scopes, digest) for scopes, digest, _ in entries]
