"""The response cache: a ``predict`` asked again with the same inputs answers from the cache.

Opt-in per model (``cache:`` in ``servekit.yaml``, or Triton's ``response_cache {
enable: true }`` in ``config.pbtxt``).  An entry is keyed by the model, its version
and that version's load (the folder's fingerprint and settings, so a version
replaced by new files or new settings never answers with the old one's outputs),
the inputs (names, dtypes, shapes and bytes), the parameters, the signature and
the outputs asked for.  Entries live in one SQLite file every worker of the server
shares (:mod:`servekit.dataplane.shared_store`): an answer computed by one worker
is a hit on every other.  The cache is bounded in bytes, server-wide
(``--response-cache-bytes``, Triton's ``--cache-config local,size=N``) and per
model (``cache: {max_bytes: N}``); past a bound the least recently used entries
go.  A version that is unloaded or replaced takes its entries with it.

Never cached: a request of a sequence (its answer depends on the sequence's
state), a streamed answer, a pipeline's steps' own requests unless their model
opts in, ``explain`` and generation (only ``predict`` is cached), and an answer
that is not plain arrays or numbers.  Hits and misses are counted in Triton's
statistics (``cache_hit``, ``cache_miss``: the time to look up, and to store on a
miss), so ``/metrics`` shows them too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import pickle
import sqlite3
import time
from typing import Any

import numpy as np

from servekit.dataplane.shared_store import Store
from servekit.observability import statistics

log = logging.getLogger("servekit.cache")

#: The server-wide bound when the server sets none (Triton needs one set; servekit picks one).
DEFAULT_BYTES = 64 * 1024 * 1024

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    key BLOB PRIMARY KEY, model TEXT NOT NULL, version TEXT NOT NULL, load TEXT NOT NULL,
    size INTEGER NOT NULL, used INTEGER NOT NULL, value BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS entries_used ON entries (used);
CREATE INDEX IF NOT EXISTS entries_model ON entries (model, used);
CREATE TABLE IF NOT EXISTS totals (scope TEXT PRIMARY KEY, bytes INTEGER NOT NULL);
"""
#: the ``totals`` row of the whole cache (each model's is its name)
_ALL = "\0all"

_MISSING = object()


class ResponseCache:
    """The server's response cache (one per data plane; its entries are in the shared store)."""

    def __init__(self, max_bytes: int = DEFAULT_BYTES) -> None:
        self.max_bytes = max_bytes
        self.store = Store("response-cache.sqlite", _SCHEMA)

    # -- the data plane's side ------------------------------------------------------------------

    def applies(self, mv: Any, parameters: dict[str, Any]) -> bool:
        """Whether a ``predict`` of ``mv`` may be answered from (and stored in) the cache."""
        config = getattr(mv.config, "cache", None)
        return (
            config is not None and self.max_bytes > 0 and mv.config.sequence is None and "sequence_id" not in parameters
        )

    def key(
        self,
        mv: Any,
        inputs: Any,
        parameters: dict[str, Any],
        signature_name: str | None,
        output_names: list[str] | None,
    ) -> bytes | None:
        """The entry's key, or ``None`` for inputs it cannot key exactly (not arrays)."""
        digest = hashlib.sha256()
        head = [mv.name, str(mv.version), load_of(mv), signature_name, output_names, parameters]
        digest.update(json.dumps(head, sort_keys=True, default=repr).encode())
        named = inputs.items() if isinstance(inputs, dict) else [("", inputs)]
        for name, value in named:
            if not isinstance(value, np.ndarray):
                return None
            digest.update(f"\0{name}\0{value.dtype.str}\0{value.shape}\0".encode())
            if value.dtype.kind == "O":
                for item in value.ravel():
                    raw = item if isinstance(item, bytes) else str(item).encode()
                    digest.update(b"%d:%s:" % (len(raw), type(item).__name__.encode()) + raw)
            else:
                digest.update(np.ascontiguousarray(value).data)
        return digest.digest()

    def get(self, mv: Any, key: bytes) -> tuple[Any, int]:
        """``(answer, 0)`` on a hit (counted); on a miss a :func:`missing` value and the lookup's nanoseconds."""
        began = time.perf_counter_ns()
        try:
            conn = self.store.connection()
            row = conn.execute("SELECT value FROM entries WHERE key = ?", (key,)).fetchone()
            if row is not None:
                conn.execute("UPDATE entries SET used = ? WHERE key = ?", (time.time_ns(), key))  # one statement
        except sqlite3.Error as exc:  # the cache is an aid: a request it cannot serve is computed
            log.warning("response cache not read: %s", exc)
            row = None
        if row is None:
            return _MISSING, time.perf_counter_ns() - began
        value = pickle.loads(row[0])
        statistics.record_cache(mv.name, str(mv.version), "cache_hit", time.perf_counter_ns() - began)
        return value, 0

    def put(self, mv: Any, key: bytes, value: Any, looked_up_ns: int) -> None:
        """Store a computed answer (when it is plain data and fits) and count the miss."""
        began = time.perf_counter_ns()
        if _plain(value):
            blob = pickle.dumps(value, protocol=5)
            limit = _model_bytes(mv, self.max_bytes)
            if len(blob) <= limit:
                try:
                    self._insert(mv, key, blob, limit)
                except sqlite3.Error as exc:
                    log.warning("response cache not written: %s", exc)
        spent = looked_up_ns + time.perf_counter_ns() - began
        statistics.record_cache(mv.name, str(mv.version), "cache_miss", spent)

    def forget(self, mv: Any) -> None:
        """A version unloaded or replaced: its entries go (those of this load of it)."""
        if getattr(mv.config, "cache", None) is None:
            return
        with self.store.transaction() as tx:
            doomed = tx.execute(
                "SELECT key, model, size FROM entries WHERE model = ? AND version = ? AND load = ?",
                (mv.name, str(mv.version), load_of(mv)),
            ).fetchall()
            _delete(tx, doomed)

    def _insert(self, mv: Any, key: bytes, blob: bytes, model_limit: int) -> None:
        with self.store.transaction() as tx:
            added = tx.execute(  # the same key is the same answer: one stored by another worker stays
                "INSERT OR IGNORE INTO entries VALUES (?, ?, ?, ?, ?, ?, ?)",
                (key, mv.name, str(mv.version), load_of(mv), len(blob), time.time_ns(), blob),
            ).rowcount
            if not added:
                return
            for scope in (mv.name, _ALL):
                tx.execute(
                    "INSERT INTO totals VALUES (?, ?) ON CONFLICT (scope) DO UPDATE SET bytes = bytes + excluded.bytes",
                    (scope, len(blob)),
                )
            _evict(tx, mv.name, model_limit)
            _evict(tx, _ALL, self.max_bytes)

    # -- reading -------------------------------------------------------------------------------------

    def usage(self) -> tuple[int, int]:
        """Entries and bytes held now, server-wide."""
        conn = self.store.connection()
        count = conn.execute("SELECT count(*) FROM entries").fetchone()[0]
        return int(count), _total(conn, _ALL)


def missing(value: Any) -> bool:
    """The first item :meth:`ResponseCache.get` answers on a miss."""
    return value is _MISSING


def load_of(mv: Any) -> str:
    """What tells one load of a version from another: its folder's fingerprint and its settings."""
    settings = json.dumps(getattr(mv, "raw_config", {}), sort_keys=True, default=str)
    return f"{getattr(mv, 'fingerprint', 0.0)!r}:{hashlib.sha256(settings.encode()).hexdigest()[:16]}"


def _model_bytes(mv: Any, server_bytes: int) -> int:
    own = mv.config.cache.get("max_bytes")
    return min(own, server_bytes) if own else server_bytes


def _total(tx: Any, scope: str) -> int:
    row = tx.execute("SELECT bytes FROM totals WHERE scope = ?", (scope,)).fetchone()
    return int(row[0]) if row else 0


def _delete(tx: Any, rows: list[tuple[bytes, str, int]]) -> None:
    """Delete entries given as ``(key, model, size)``, keeping the totals."""
    for key, model, size in rows:
        tx.execute("DELETE FROM entries WHERE key = ?", (key,))
        tx.execute("UPDATE totals SET bytes = bytes - ? WHERE scope IN (?, ?)", (size, model, _ALL))


def _evict(tx: Any, scope: str, limit: int) -> None:
    """Drop the least recently used entries (of a model, or of all) until they fit in ``limit`` bytes."""
    total = _total(tx, scope)
    if total <= limit:
        return
    where, args = ("", ()) if scope == _ALL else ("WHERE model = ?", (scope,))
    doomed = []
    for key, model, size in tx.execute(f"SELECT key, model, size FROM entries {where} ORDER BY used", args):
        if total <= limit:
            break
        doomed.append((key, model, size))
        total -= size
    _delete(tx, doomed)


def _plain(value: Any) -> bool:
    """Arrays, numbers, strings and their lists and dicts: what pickles back the same, with no code."""
    if isinstance(value, np.ndarray):
        return value.dtype.kind != "O" or all(isinstance(v, (str, bytes)) for v in value.ravel())
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str, bytes, np.generic))
