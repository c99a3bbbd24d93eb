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
go (a hit's recency is written with its process's next eviction, or a second on).
A version that is unloaded or replaced takes its entries with it.

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
import os
import pickle
import queue
import sqlite3
import threading
import time
from typing import Any, NamedTuple

import numpy as np

from servekit.dataplane.shared_store import Store
from servekit.observability import statistics

log = logging.getLogger("servekit.cache")

#: The server-wide bound when the server sets none (Triton needs one set; servekit picks one).
DEFAULT_BYTES = 64 * 1024 * 1024

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    key BLOB PRIMARY KEY, model TEXT NOT NULL, version TEXT NOT NULL, load TEXT NOT NULL,
    size INTEGER NOT NULL, used INTEGER NOT NULL, value BLOB NOT NULL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS entries_used ON entries (used);
CREATE INDEX IF NOT EXISTS entries_model ON entries (model, used);
CREATE TABLE IF NOT EXISTS totals (scope TEXT PRIMARY KEY, bytes INTEGER NOT NULL);
CREATE TRIGGER IF NOT EXISTS entries_added AFTER INSERT ON entries BEGIN
    INSERT INTO totals VALUES (NEW.model, NEW.size) ON CONFLICT (scope) DO UPDATE SET bytes = bytes + excluded.bytes;
    INSERT INTO totals VALUES (char(0) || 'all', NEW.size)
        ON CONFLICT (scope) DO UPDATE SET bytes = bytes + excluded.bytes;
END;
CREATE TRIGGER IF NOT EXISTS entries_removed AFTER DELETE ON entries BEGIN
    UPDATE totals SET bytes = bytes - OLD.size WHERE scope IN (OLD.model, char(0) || 'all');
END;
"""
#: the ``totals`` row of the whole cache (each model's is its name); the triggers keep both
_ALL = "\0all"

_MISSING = object()


class _Write(NamedTuple):
    """An answer for the writer thread; ``used`` is when it was computed (``time.time_ns``)."""

    model: str
    version: str
    load: str
    key: bytes
    blob: bytes
    limit: int
    used: int


#: a hit's recency reaches the shared file with its process's next eviction, or this many seconds on
TOUCH_SECONDS = 1.0
#: seconds a process's writer waits before it writes what was handed to it, with what came
#: meanwhile: a writer that woke at once took the GIL from the request still being answered
#: (a miss on 1 row cost 9.9 % over no cache, and 3-4 % with no writer)
WRITE_DELAY = 0.02


class ResponseCache:
    """The server's response cache (one per data plane; its entries are in the shared store)."""

    def __init__(self, max_bytes: int = DEFAULT_BYTES) -> None:
        self.max_bytes = max_bytes
        self.store = Store("response-cache.sqlite", _SCHEMA)
        # hits not yet written as ``used`` (a write on every hit cost more than the read); an
        # eviction writes them first, so LRU is exact in a process and to a second across them
        self._touched: dict[bytes, int] = {}
        self._touch_lock = threading.Lock()
        self._touches_written = time.monotonic()
        # answers handed to this process's writer and not yet in the file: hits here already
        self._pending: dict[bytes, bytes] = {}
        self._writes: queue.Queue[_Write | None] | None = None
        self._writer_pid = 0
        self._writer_lock = threading.Lock()

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
        blob = self._pending.get(key)
        try:
            if blob is None:
                row = self.store.connection().execute("SELECT value FROM entries WHERE key = ?", (key,)).fetchone()
                blob = None if row is None else row[0]
        except sqlite3.Error as exc:  # the cache is an aid: a request it cannot serve is computed
            log.warning("response cache not read: %s", exc)
        if blob is None:
            return _MISSING, time.perf_counter_ns() - began
        with self._touch_lock:
            self._touched[key] = time.time_ns()
            due = time.monotonic() - self._touches_written >= TOUCH_SECONDS
        if due:
            self._writer().put(None)  # the writer writes the touches
        value = pickle.loads(blob)
        statistics.record_cache(mv.name, str(mv.version), "cache_hit", time.perf_counter_ns() - began)
        return value, 0

    def put(self, mv: Any, key: bytes, value: Any, looked_up_ns: int) -> None:
        """Store a computed answer (when it is plain data and fits) and count the miss.

        The answer is pickled now (what a caller does to it later is not cached) and is a
        hit in this process at once; this process's writer thread puts it in the shared
        file :data:`WRITE_DELAY` later, with the others of that moment in one transaction,
        off the request's time (an insert is a file write: about as long as the lookup,
        the key and the pickle together); the other workers find it from then on.
        """
        began = time.perf_counter_ns()
        if _plain(value):
            blob = pickle.dumps(value, protocol=5)
            limit = _model_bytes(mv, self.max_bytes)
            if len(blob) <= limit:
                writes = self._writer()
                self._pending[key] = blob
                writes.put(_Write(mv.name, str(mv.version), load_of(mv), key, blob, limit, time.time_ns()))
        spent = looked_up_ns + time.perf_counter_ns() - began
        statistics.record_cache(mv.name, str(mv.version), "cache_miss", spent)

    def wait_written(self) -> None:
        """Until every answer this process handed to its writer is in the shared file."""
        writes = self._writes
        if writes is not None and self._writer_pid == os.getpid():
            writes.join()

    def forget(self, mv: Any) -> None:
        """A version unloaded or replaced: its entries go (those of this load of it)."""
        if getattr(mv.config, "cache", None) is None:
            return
        self.wait_written()  # none of its answers lands after
        with self.store.transaction() as tx:  # a trigger takes them off the totals
            tx.execute(
                "DELETE FROM entries WHERE model = ? AND version = ? AND load = ?",
                (mv.name, str(mv.version), load_of(mv)),
            )

    def _writer(self) -> queue.Queue[_Write | None]:
        """This process's queue of writes, and its writer thread (one per process, after a fork too)."""
        writes = self._writes
        if writes is not None and self._writer_pid == os.getpid():
            return writes
        with self._writer_lock:
            if self._writes is None or self._writer_pid != os.getpid():
                self._writes, self._writer_pid = queue.Queue(), os.getpid()
                self._pending = {}
                threading.Thread(
                    target=self._write_loop, args=(self._writes,), name="servekit-cache", daemon=True
                ).start()
            return self._writes

    def _write_loop(self, writes: queue.Queue[_Write | None]) -> None:
        while True:
            batch = [writes.get()]
            time.sleep(WRITE_DELAY)  # off the GIL while the request that handed it in is answered
            while len(batch) < 1024:  # what queued meanwhile goes in the same transaction
                try:
                    batch.append(writes.get_nowait())
                except queue.Empty:
                    break
            try:
                self._write(batch)
            except sqlite3.Error as exc:
                log.warning("response cache not written: %s", exc)
            except Exception:  # the writer outlives a failure: a later batch, and wait_written, go on
                log.exception("response cache not written")
            finally:
                for item in batch:
                    if item is not None and self._pending.get(item.key) is item.blob:
                        del self._pending[item.key]
                    writes.task_done()

    def _write(self, batch: list[_Write | None]) -> None:
        """One transaction: the answers (their triggers add to the totals), the touches, and any eviction due."""
        answers = [item for item in batch if item is not None]
        with self.store.transaction() as tx:
            tx.executemany(  # the same key is the same answer: one stored by another worker stays
                "INSERT OR IGNORE INTO entries VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(a.key, a.model, a.version, a.load, len(a.blob), a.used, a.blob) for a in answers],
            )
            self._write_touches(tx, frozenset(a.key for a in answers))
            for model, limit in {a.model: a.limit for a in answers}.items():
                _evict(tx, model, limit)
            _evict(tx, _ALL, self.max_bytes)

    def _write_touches(self, tx: sqlite3.Connection, written: frozenset[bytes]) -> None:
        """The hits' times as ``used``; those of answers still on their way to the file (not among
        ``written``, this transaction's) wait for them."""
        ready: list[tuple[int, bytes]] = []
        waiting: dict[bytes, int] = {}
        with self._touch_lock:
            for key, ns in self._touched.items():
                if key in self._pending and key not in written:
                    waiting[key] = ns
                else:
                    ready.append((ns, key))
            self._touched = waiting
            self._touches_written = time.monotonic()
        tx.executemany("UPDATE entries SET used = max(used, ?) WHERE key = ?", ready)

    # -- reading -------------------------------------------------------------------------------------

    def usage(self) -> tuple[int, int]:
        """Entries and bytes held now, server-wide (this process's answers written first)."""
        self.wait_written()
        conn = self.store.connection()
        count = conn.execute("SELECT count(*) FROM entries").fetchone()[0]
        return int(count), _total(conn, _ALL)


def missing(value: Any) -> bool:
    """The first item :meth:`ResponseCache.get` answers on a miss."""
    return value is _MISSING


def load_of(mv: Any) -> str:
    """What tells one load of a version from another: its folder's fingerprint and its settings
    (worked out on its first cached request, kept on the version: a load is never changed)."""
    if not mv.cache_load:
        settings = json.dumps(mv.raw_config, sort_keys=True, default=str)
        mv.cache_load = f"{mv.fingerprint!r}:{hashlib.sha256(settings.encode()).hexdigest()[:16]}"
    return str(mv.cache_load)


def _model_bytes(mv: Any, server_bytes: int) -> int:
    own = mv.config.cache.get("max_bytes")
    return min(own, server_bytes) if own else server_bytes


def _total(tx: Any, scope: str) -> int:
    row = tx.execute("SELECT bytes FROM totals WHERE scope = ?", (scope,)).fetchone()
    return int(row[0]) if row else 0


def _evict(tx: Any, scope: str, limit: int) -> None:
    """Drop the least recently used entries (of a model, or of all) until they fit in ``limit`` bytes."""
    total = _total(tx, scope)
    if total <= limit:
        return
    where, args = ("", ()) if scope == _ALL else ("WHERE model = ?", (scope,))
    doomed = []
    for key, size in tx.execute(f"SELECT key, size FROM entries {where} ORDER BY used", args):
        if total <= limit:
            break
        doomed.append((key,))
        total -= size
    tx.executemany("DELETE FROM entries WHERE key = ?", doomed)  # a trigger takes them off the totals


def _plain(value: Any) -> bool:
    """Arrays, numbers, strings and their lists and dicts: what pickles back the same, with no code."""
    if isinstance(value, np.ndarray):
        return value.dtype.kind != "O" or all(isinstance(v, (str, bytes)) for v in value.ravel())
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str, bytes, np.generic))
