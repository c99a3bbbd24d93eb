"""Where request logs are kept: SQLite or any SQLAlchemy database, fed from a local spool.

:class:`SqlRequestLog` is the built-in ``log_request`` plugin.  It appends each
record to this process's spool file (:mod:`.log_spool`) before the answer goes
out, and a thread per process ships the spool in batches, so a request never
waits on the database and a killed process loses no answered request's row (a
record that cannot be spooled is dropped and counted in
``servekit_request_log_dropped_total``).  A record is inserted by its id and
ignored when the store has it already: a replayed spool writes no row twice.
``sqlite:///FILE`` uses the standard
library's sqlite3 in WAL mode, one file shared by every worker: nothing to
install or start.  Any other URL (``postgresql://user@host/db``) goes through
SQLAlchemy (``pip install 'servekit[sql]'``).  Both create their two tables,
``servekit_request_logs`` and ``servekit_prediction_logs``, on first use.
"""

from __future__ import annotations

import logging
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servekit.hooks.specs import hookimpl
from servekit.observability.log_spool import Spool, default_folder
from servekit.types import PredictionLog, RequestLog

log = logging.getLogger("servekit.request_log")


_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS servekit_request_logs (
        id VARCHAR(64) PRIMARY KEY, request_id VARCHAR(128), created DOUBLE PRECISION,
        method VARCHAR(8), path TEXT, protocol VARCHAR(16), model VARCHAR(128), status INTEGER,
        duration_ms DOUBLE PRECISION, request_body TEXT, response_body TEXT,
        version VARCHAR(32), trace_id VARCHAR(32))""",
    """CREATE TABLE IF NOT EXISTS servekit_prediction_logs (
        id VARCHAR(80) PRIMARY KEY, request_log_id VARCHAR(64), idx INTEGER, output TEXT)""",
    "CREATE INDEX IF NOT EXISTS servekit_prediction_logs_request ON servekit_prediction_logs (request_log_id)",
    "CREATE INDEX IF NOT EXISTS servekit_request_logs_created ON servekit_request_logs (created)",
)
#: columns added after the first release: a store made before gets them on open
_ADDED_COLUMNS = (("version", "VARCHAR(32)"), ("trace_id", "VARCHAR(32)"))
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
    "version",
    "trace_id",
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
        r.version,
        r.trace_id,
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
        version=values["version"] or "",
        trace_id=values["trace_id"] or "",
        predictions=[PredictionLog(pid, idx, out or "") for pid, idx, out in predictions],
    )


class SqliteBackend:
    """The standard library's sqlite3: one file shared by every worker (WAL mode)."""

    def __init__(self, path: str):
        self.path = path
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(_SCHEMA[0])
            have = {row[1] for row in db.execute("PRAGMA table_info(servekit_request_logs)")}
            for column, kind in _ADDED_COLUMNS:
                if column not in have:
                    db.execute(f"ALTER TABLE servekit_request_logs ADD COLUMN {column} {kind}")
            for statement in _SCHEMA[1:]:
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
                f"INSERT OR IGNORE INTO servekit_request_logs ({','.join(_REQUEST_COLUMNS)}) "
                f"VALUES ({','.join('?' * len(_REQUEST_COLUMNS))})",
                [_request_row(r) for r in records],
            )
            db.executemany(
                "INSERT OR IGNORE INTO servekit_prediction_logs VALUES (?,?,?,?)",
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

    def search(self, query: Query) -> list[RequestLog]:
        where, params = query.sql("?")
        db = self._connect()
        try:
            rows = db.execute(
                f"SELECT {','.join(_REQUEST_COLUMNS)} FROM servekit_request_logs{where} "
                f"ORDER BY created {'ASC' if query.oldest_first else 'DESC'} LIMIT {int(query.limit)}",
                params,
            ).fetchall()
        finally:
            db.close()
        return [_from_rows(row, []) for row in rows]

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
            sa.Column("version", sa.String(32)),
            sa.Column("trace_id", sa.String(32)),
            sa.Index("servekit_request_logs_created", "created"),
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
        self._add_columns()

    def _add_columns(self) -> None:
        """Columns a store made by an older servekit lacks."""
        sa = self.sa
        have = {c["name"] for c in sa.inspect(self.engine).get_columns("servekit_request_logs")}
        for column, kind in _ADDED_COLUMNS:
            if column not in have:
                try:
                    with self.engine.begin() as conn:
                        conn.execute(sa.text(f"ALTER TABLE servekit_request_logs ADD COLUMN {column} {kind}"))
                except sa.exc.SQLAlchemyError:
                    pass  # another worker added it first

    def write(self, records: list[RequestLog]) -> None:
        rows = [dict(zip(_REQUEST_COLUMNS, _request_row(r))) for r in records]
        predictions = [
            {"id": p.prediction_log_id, "request_log_id": r.request_log_id, "idx": p.index, "output": p.output}
            for r in records
            for p in r.predictions
        ]
        with self.engine.begin() as conn:
            conn.execute(self._insert_new(self.requests), rows)
            if predictions:
                conn.execute(self._insert_new(self.predictions), predictions)

    def _insert_new(self, table: Any) -> Any:
        """An INSERT that skips rows whose id the table has (a replayed spool)."""
        dialect = self.engine.dialect.name
        if dialect == "postgresql":
            from sqlalchemy.dialects import postgresql

            return postgresql.insert(table).on_conflict_do_nothing(index_elements=["id"])
        if dialect == "sqlite":
            from sqlalchemy.dialects import sqlite

            return sqlite.insert(table).on_conflict_do_nothing(index_elements=["id"])
        if dialect in ("mysql", "mariadb"):
            return table.insert().prefix_with("IGNORE")
        raise RuntimeError(
            f"the request log cannot insert idempotently into {dialect}: use PostgreSQL, SQLite or MySQL"
        )

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

    def search(self, query: Query) -> list[RequestLog]:
        sa, c = self.sa, self.requests.c
        statement = sa.select(*[c[name] for name in _REQUEST_COLUMNS])
        for condition in query.conditions(c):
            statement = statement.where(condition)
        order = c.created.asc() if query.oldest_first else c.created.desc()
        with self.engine.connect() as conn:
            rows = conn.execute(statement.order_by(order).limit(query.limit)).fetchall()
        return [_from_rows(tuple(row), []) for row in rows]

    def request_of(self, prediction_log_id: str) -> str | None:
        sa, p = self.sa, self.predictions.c
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(p.request_log_id).where(p.id == prediction_log_id)).fetchone()
        return row[0] if row else None


@dataclass
class Query:
    """What ``servekit logs`` and ``GET /v1/logs/requests`` search by; every field optional.

    ``status`` is one code (``503``) or a class (``5xx``); latencies are in
    milliseconds and times are Unix seconds, both bounds inclusive.
    """

    model: str | None = None
    version: str | None = None
    status: str | None = None
    min_ms: float | None = None
    max_ms: float | None = None
    since: float | None = None
    until: float | None = None
    limit: int = 100
    oldest_first: bool = False

    def __post_init__(self) -> None:
        if self.status is not None and not STATUS.match(self.status):
            raise ValueError(f"status must be a code (503) or a class (5xx), found {self.status!r}")
        if not 1 <= int(self.limit) <= MAX_LIMIT:
            raise ValueError(f"limit must be between 1 and {MAX_LIMIT}, found {self.limit}")

    def status_range(self) -> tuple[int, int] | None:
        if self.status is None:
            return None
        if self.status[1:].lower() == "xx":
            low = int(self.status[0]) * 100
            return low, low + 99
        return int(self.status), int(self.status)

    def _bounds(self) -> list[tuple[str, str, Any]]:
        found: list[tuple[str, str, Any]] = []
        if self.model is not None:
            found.append(("model", "=", self.model))
        if self.version is not None:
            found.append(("version", "=", self.version))
        if (statuses := self.status_range()) is not None:
            found += [("status", ">=", statuses[0]), ("status", "<=", statuses[1])]
        for column, op, value in (
            ("duration_ms", ">=", self.min_ms),
            ("duration_ms", "<=", self.max_ms),
            ("created", ">=", self.since),
            ("created", "<=", self.until),
        ):
            if value is not None:
                found.append((column, op, value))
        return found

    def sql(self, mark: str) -> tuple[str, list[Any]]:
        """A ``WHERE`` clause with ``mark`` placeholders, and its parameters."""
        bounds = self._bounds()
        if not bounds:
            return "", []
        return " WHERE " + " AND ".join(f"{c} {op} {mark}" for c, op, _ in bounds), [v for _, _, v in bounds]

    def conditions(self, columns: Any) -> list[Any]:
        """The same bounds as SQLAlchemy conditions on ``columns``."""
        ops = {"=": lambda a, b: a == b, ">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b}
        return [ops[op](columns[c], v) for c, op, v in self._bounds()]


STATUS = re.compile(r"^[1-5]([0-9]{2}|xx|XX)$")
MAX_LIMIT = 100_000


def open_backend(url: str) -> SqliteBackend | SqlAlchemyBackend:
    if url.startswith("sqlite:///") and "?" not in url:
        return SqliteBackend(url[len("sqlite:///") :] or ":memory:")
    return SqlAlchemyBackend(url)


class SqlRequestLog:
    """The built-in ``log_request`` plugin: spool each record, ship the spool in batches from a thread."""

    def __init__(self, url: str, spool: str | Path | None = None):
        self.url = url
        self.backend = open_backend(url)
        self.spool = Spool(spool or default_folder(url), self._ship)

    @hookimpl
    def log_request(self, record: RequestLog) -> None:
        try:
            kept = self.spool.append(record)
        except OSError:
            log.exception("the request log spool %s cannot be written", self.spool.folder)
            kept = False
        if not kept:
            _dropped()

    def _ship(self, records: list[RequestLog]) -> None:
        """Write a batch; a record the store refuses (not a connection problem) is dropped alone."""
        try:
            self.backend.write(records)
            return
        except Exception as exc:
            if _transient(exc):
                raise  # the store is away: the batch stays in the spool, to be tried again
        for record in records:
            try:
                self.backend.write([record])
            except Exception as exc:
                if _transient(exc):
                    raise
                log.exception("the store refused request log %s; it is dropped", record.request_log_id)
                _dropped()

    def start(self) -> None:
        """Start shipping now: what processes that are gone left in the spool goes to the store."""
        self.spool.start()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until this process's records are written (reads see them after)."""
        return self.spool.flush(timeout)

    def get(self, request_log_id: str) -> RequestLog | None:
        self.flush()
        return self.backend.get(request_log_id)

    def search(self, query: Query) -> list[RequestLog]:
        """Records matching ``query``, newest first, without their predictions."""
        self.flush()
        return self.backend.search(query)

    def get_by_prediction(self, prediction_log_id: str) -> RequestLog | None:
        self.flush()
        request_log_id = self.backend.request_of(prediction_log_id)
        return self.backend.get(request_log_id) if request_log_id else None


def _dropped() -> None:
    from servekit.observability.metrics import metrics  # prometheus_client loads late

    metrics().log_dropped.inc()


#: errors of a store that cannot be reached or is busy (sqlite3's, the DB-API's through SQLAlchemy)
_TRANSIENT = {"OperationalError", "InterfaceError", "TimeoutError", "DisconnectionError"}


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, OSError) or any(kind.__name__ in _TRANSIENT for kind in type(exc).__mro__)
