"""Where request logs are kept: a background writer over SQLite or any SQLAlchemy database.

:class:`SqlRequestLog` is the built-in ``log_request`` plugin.  It queues each
record and writes batches from one thread per worker, so a request never waits
on the database (a full queue drops the record and counts it in
``servekit_request_log_dropped_total``).  ``sqlite:///FILE`` uses the standard
library's sqlite3 in WAL mode, one file shared by every worker: nothing to
install or start.  Any other URL (``postgresql://user@host/db``) goes through
SQLAlchemy (``pip install 'servekit[sql]'``).  Both create their two tables,
``servekit_request_logs`` and ``servekit_prediction_logs``, on first use.
"""

from __future__ import annotations

import logging
import os
import queue
import sqlite3
import threading
import time
from typing import Any

import servekit

from ..types import PredictionLog, RequestLog

log = logging.getLogger("servekit.request_log")

QUEUE_SIZE = 10_000
BATCH_SIZE = 500
BATCH_SECONDS = 0.05


_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS servekit_request_logs (
        id VARCHAR(64) PRIMARY KEY, request_id VARCHAR(128), created DOUBLE PRECISION,
        method VARCHAR(8), path TEXT, protocol VARCHAR(16), model VARCHAR(128), status INTEGER,
        duration_ms DOUBLE PRECISION, request_body TEXT, response_body TEXT)""",
    """CREATE TABLE IF NOT EXISTS servekit_prediction_logs (
        id VARCHAR(80) PRIMARY KEY, request_log_id VARCHAR(64), idx INTEGER, output TEXT)""",
    "CREATE INDEX IF NOT EXISTS servekit_prediction_logs_request ON servekit_prediction_logs (request_log_id)",
)
_REQUEST_COLUMNS = (
    "id",
    "request_id",
    "created",
    "method",
    "path",
    "protocol",
    "model",
    "status",
    "duration_ms",
    "request_body",
    "response_body",
)


def _request_row(r: RequestLog) -> tuple:
    return (
        r.request_log_id,
        r.request_id,
        r.created,
        r.method,
        r.path,
        r.protocol,
        r.model,
        r.status,
        r.duration_ms,
        r.request_body,
        r.response_body,
    )


def _from_rows(row: tuple, predictions: list[tuple]) -> RequestLog:
    values = dict(zip(_REQUEST_COLUMNS, row))
    return RequestLog(
        request_log_id=values["id"],
        request_id=values["request_id"] or "",
        created=values["created"],
        method=values["method"],
        path=values["path"],
        protocol=values["protocol"],
        model=values["model"],
        status=values["status"],
        duration_ms=values["duration_ms"],
        request_body=values["request_body"] or "",
        response_body=values["response_body"] or "",
        predictions=[PredictionLog(pid, idx, out or "") for pid, idx, out in predictions],
    )


class SqliteBackend:
    """The standard library's sqlite3: one file shared by every worker (WAL mode)."""

    def __init__(self, path: str):
        self.path = path
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            for statement in _SCHEMA:
                db.execute(statement)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.execute("PRAGMA busy_timeout=30000")
        db.execute("PRAGMA synchronous=NORMAL")
        return db

    def write(self, records: list[RequestLog]) -> None:
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            db.executemany(
                f"INSERT OR REPLACE INTO servekit_request_logs VALUES ({','.join('?' * 11)})",
                [_request_row(r) for r in records],
            )
            db.executemany(
                "INSERT OR REPLACE INTO servekit_prediction_logs VALUES (?,?,?,?)",
                [(p.prediction_log_id, r.request_log_id, p.index, p.output) for r in records for p in r.predictions],
            )
            db.execute("COMMIT")
        finally:
            db.close()

    def get(self, request_log_id: str) -> RequestLog | None:
        db = self._connect()
        try:
            row = db.execute(
                f"SELECT {','.join(_REQUEST_COLUMNS)} FROM servekit_request_logs WHERE id = ?", (request_log_id,)
            ).fetchone()
            if row is None:
                return None
            predictions = db.execute(
                "SELECT id, idx, output FROM servekit_prediction_logs WHERE request_log_id = ? ORDER BY idx",
                (request_log_id,),
            ).fetchall()
            return _from_rows(row, predictions)
        finally:
            db.close()

    def request_of(self, prediction_log_id: str) -> str | None:
        db = self._connect()
        try:
            row = db.execute(
                "SELECT request_log_id FROM servekit_prediction_logs WHERE id = ?", (prediction_log_id,)
            ).fetchone()
            return row[0] if row else None
        finally:
            db.close()


class SqlAlchemyBackend:
    """Any database SQLAlchemy speaks (PostgreSQL in production); ``pip install sqlalchemy``."""

    def __init__(self, url: str):
        try:
            import sqlalchemy as sa
        except ImportError:
            raise RuntimeError(
                f"request log URL {url.split(':')[0]}:... needs SQLAlchemy: pip install 'servekit[sql]'"
            ) from None
        self.sa = sa
        self.engine = sa.create_engine(url, pool_pre_ping=True)
        meta = sa.MetaData()
        self.requests = sa.Table(
            "servekit_request_logs",
            meta,
            sa.Column("id", sa.String(64), primary_key=True),
            sa.Column("request_id", sa.String(128)),
            sa.Column("created", sa.Float),
            sa.Column("method", sa.String(8)),
            sa.Column("path", sa.Text),
            sa.Column("protocol", sa.String(16)),
            sa.Column("model", sa.String(128)),
            sa.Column("status", sa.Integer),
            sa.Column("duration_ms", sa.Float),
            sa.Column("request_body", sa.Text),
            sa.Column("response_body", sa.Text),
        )
        self.predictions = sa.Table(
            "servekit_prediction_logs",
            meta,
            sa.Column("id", sa.String(80), primary_key=True),
            sa.Column("request_log_id", sa.String(64), index=True),
            sa.Column("idx", sa.Integer),
            sa.Column("output", sa.Text),
        )
        try:
            meta.create_all(self.engine)
        except sa.exc.SQLAlchemyError:
            meta.create_all(self.engine)  # another worker created them at the same moment

    def write(self, records: list[RequestLog]) -> None:
        rows = [dict(zip(_REQUEST_COLUMNS, _request_row(r))) for r in records]
        predictions = [
            {"id": p.prediction_log_id, "request_log_id": r.request_log_id, "idx": p.index, "output": p.output}
            for r in records
            for p in r.predictions
        ]
        with self.engine.begin() as conn:
            conn.execute(self.requests.insert(), rows)
            if predictions:
                conn.execute(self.predictions.insert(), predictions)

    def get(self, request_log_id: str) -> RequestLog | None:
        sa = self.sa
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(*[self.requests.c[c] for c in _REQUEST_COLUMNS]).where(self.requests.c.id == request_log_id)
            ).fetchone()
            if row is None:
                return None
            p = self.predictions.c
            predictions = conn.execute(
                sa.select(p.id, p.idx, p.output).where(p.request_log_id == request_log_id).order_by(p.idx)
            ).fetchall()
        return _from_rows(tuple(row), [tuple(r) for r in predictions])

    def request_of(self, prediction_log_id: str) -> str | None:
        sa, p = self.sa, self.predictions.c
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(p.request_log_id).where(p.id == prediction_log_id)).fetchone()
        return row[0] if row else None


def open_backend(url: str) -> SqliteBackend | SqlAlchemyBackend:
    if url.startswith("sqlite:///") and "?" not in url:
        return SqliteBackend(url[len("sqlite:///") :] or ":memory:")
    return SqlAlchemyBackend(url)


class SqlRequestLog:
    """The built-in ``log_request`` plugin: queue records, write them in batches from a thread."""

    def __init__(self, url: str):
        self.url = url
        self.backend = open_backend(url)
        self._pid = -1
        self._queue: queue.Queue[Any] = queue.Queue(QUEUE_SIZE)

    @servekit.hookimpl
    def log_request(self, record: RequestLog) -> None:
        self._ensure_thread()
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            from .metrics import metrics  # prometheus_client loads late

            metrics().log_dropped.inc()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until this worker's queued records are written (reads see them after)."""
        if self._pid != os.getpid():
            return True
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout)

    def get(self, request_log_id: str) -> RequestLog | None:
        self.flush()
        return self.backend.get(request_log_id)

    def get_by_prediction(self, prediction_log_id: str) -> RequestLog | None:
        self.flush()
        request_log_id = self.backend.request_of(prediction_log_id)
        return self.backend.get(request_log_id) if request_log_id else None

    def _ensure_thread(self) -> None:
        if self._pid != os.getpid():  # first use, or first use after a fork
            self._pid = os.getpid()
            self._queue = queue.Queue(QUEUE_SIZE)
            threading.Thread(target=self._write_loop, name="servekit-request-log", daemon=True).start()

    def _write_loop(self) -> None:
        while True:
            batch = [self._queue.get()]
            # gather for a moment: one transaction per batch, not per request;
            # a flush (an Event) ends the wait at once
            deadline = time.monotonic() + BATCH_SECONDS
            while len(batch) < BATCH_SIZE and not isinstance(batch[-1], threading.Event):
                try:
                    batch.append(self._queue.get(timeout=max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    break
            records = [r for r in batch if isinstance(r, RequestLog)]
            if records:
                try:
                    self.backend.write(records)
                except Exception:
                    log.exception("writing %d request log(s) failed", len(records))
            for item in batch:
                if isinstance(item, threading.Event):
                    item.set()
