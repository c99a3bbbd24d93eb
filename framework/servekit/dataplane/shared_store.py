"""One SQLite file per server that every worker reads and writes: state the workers share.

The response cache (:mod:`servekit.dataplane.response_cache`) and the per-key
quotas (:mod:`servekit.server.quotas`) must hold across the workers of a server,
not per worker.  The server's top process makes a private folder before it forks
(:func:`prepare`, called by ``servekit.server.gunicorn_app.prepare_server`` for
both engines) and names it in ``SERVEKIT_SHARED_DIR``; each process opens the
database there, one connection per thread.  SQLite's own file lock is the lock:
a change runs in a ``BEGIN IMMEDIATE`` transaction, so a check-and-count is exact
across processes.  WAL journal, no fsync: the file is scratch, gone with the server.

Without the variable (an app made in a test process) a private folder is made
for the store, removed at exit.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sqlite3
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ENV = "SERVEKIT_SHARED_DIR"
_OWN = "SERVEKIT_OWN_SHARED_DIR"


def prepare() -> str:
    """Make the server's shared folder before the workers fork (an operator's is kept)."""
    given = os.environ.get(ENV)
    if given:
        Path(given).mkdir(parents=True, exist_ok=True)
        return given
    made = tempfile.mkdtemp(prefix="servekit-shared-")
    os.environ[ENV] = made
    os.environ[_OWN] = "1"
    return made


def remove() -> None:
    """At server exit, remove the folder if :func:`prepare` made it."""
    if os.environ.pop(_OWN, None) and os.environ.get(ENV):
        shutil.rmtree(os.environ.pop(ENV), ignore_errors=True)


class Store:
    """One SQLite database file in the shared folder; ``schema`` is run once per connection."""

    def __init__(self, filename: str, schema: str) -> None:
        folder = os.environ.get(ENV)
        if not folder:
            folder = tempfile.mkdtemp(prefix="servekit-shared-")
            atexit.register(shutil.rmtree, folder, True)
        self.path = os.path.join(folder, filename)
        self.schema = schema
        self._local = threading.local()

    def connection(self) -> sqlite3.Connection:
        """This thread's connection (a forked child opens its own)."""
        local = self._local
        if getattr(local, "pid", None) != os.getpid():
            made = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
            made.execute("PRAGMA journal_mode=WAL")
            made.execute("PRAGMA synchronous=OFF")
            made.executescript(self.schema)
            local.conn, local.pid = made, os.getpid()
        conn: sqlite3.Connection = local.conn
        return conn

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction: every other process waits for it (the lock across workers)."""
        conn = self.connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
