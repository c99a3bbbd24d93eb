"""Log lines as text or JSON, each carrying the request id of the request it belongs to.

The request id is the client's ``X-Request-Id`` when it sends a sensible one (so a
trace crosses services under one id) and a fresh one otherwise; it is echoed in
the response's ``X-Request-Id`` and stored with the request log.  It travels in a
context variable, so any logger used while serving a request (plugins' too)
prints it without being handed it.
"""

from __future__ import annotations

import contextvars
import json
import logging
import random
import re
import time
from typing import Any

from gunicorn import glogging

from servekit.observability import tracing

REQUEST_ID_HEADER = "X-Request-Id"
_VALID_ID = re.compile(r"^[A-Za-z0-9._:/+=@-]{1,128}$")

#: The id of the request being served in this thread / context ("" outside one).
current_request_id: contextvars.ContextVar[str] = contextvars.ContextVar("servekit_request_id", default="")

# Attributes every LogRecord has; anything else was passed with ``extra=`` and is kept.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "request_id"}
_STANDARD |= {"trace_id", "span_id"}


def request_id_from(header: str | None) -> str:
    """The client's id when it is short and printable, else a new one (never log raw junk)."""
    if header and _VALID_ID.match(header):
        return header
    return new_request_id()


#: The version and variant bits of a UUID4 (RFC 4122), set in :func:`new_request_id`.
_UUID4_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_UUID4_SET = (0x4000 << 64) | (0x8000 << 48)


def new_request_id() -> str:
    """A random UUID4 in hex, as ``uuid.uuid4().hex`` gives, without its ``getrandom`` call per request.

    ``random`` (reseeded in every forked worker) is enough for an id that only
    has to be unique in logs; the system call cost 10 us of every request here.
    """
    return f"{random.getrandbits(128) & _UUID4_CLEAR | _UUID4_SET:032x}"


class RequestIdFilter(logging.Filter):
    """Adds ``record.request_id`` (and, while traces are on, ``trace_id`` and ``span_id``)
    so both formats (and user formats) can print them."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = current_request_id.get()
        if tracing.ON and not getattr(record, "trace_id", ""):
            record.trace_id, record.span_id = tracing.current_ids()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request_id, extras, exception."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None) or current_request_id.get()
        if request_id:
            entry["request_id"] = request_id
        for key in ("trace_id", "span_id"):
            if value := getattr(record, key, ""):
                entry[key] = value
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        request_id = getattr(record, "request_id", None) or current_request_id.get()
        trace_id = getattr(record, "trace_id", "")
        if trace_id:
            return f"{line} [request_id={request_id} trace_id={trace_id}]"
        return f"{line} [request_id={request_id}]" if request_id else line


def formatter(log_format: str) -> logging.Formatter:
    if log_format not in ("text", "json"):
        raise ValueError(f"log format must be 'text' or 'json', found {log_format!r}")
    return JsonFormatter() if log_format == "json" else TextFormatter()


def configure(log_format: str = "text", level: str = "info") -> None:
    """Point the root logger (and gunicorn's) at stderr in the chosen format.

    Handlers that exist already (gunicorn's) keep their place and get the format.
    """
    fmt = formatter(log_format)
    root = logging.getLogger()
    root.setLevel(level.upper())
    if not root.handlers:
        root.addHandler(logging.StreamHandler())
    for logger in (root, logging.getLogger("gunicorn.error")):
        for handler in logger.handlers:
            handler.setFormatter(fmt)
            if not any(isinstance(f, RequestIdFilter) for f in handler.filters):
                handler.addFilter(RequestIdFilter())


class AddressLogger(glogging.Logger):
    """gunicorn's own logger, its ``Listening at:`` line naming the address.

    Each worker binds its own ``SO_REUSEPORT`` listener, so gunicorn's master
    holds none and logs an empty ``Listening at:  (PID)``; this names the
    address the workers bind, as gunicorn does when the master binds it.
    """

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        self._cfg = cfg

    def info(self, msg: str, *args: Any, **kwargs: Any) -> None:
        if msg.startswith("Listening at:") and args and not args[0]:
            scheme = "https" if getattr(self._cfg, "is_ssl", False) else "http"
            bound = ",".join(_url(scheme, address) for address in self._cfg.address)
            args = (bound, *args[1:])
        super().info(msg, *args, **kwargs)


def _url(scheme: str, address: Any) -> str:
    if isinstance(address, tuple):  # (host, port)
        host, port = address[0], address[1]
        return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"
    return f"unix:{address}"


class GunicornLogger(AddressLogger):
    """gunicorn's own logger, writing its lines (the master's too) as JSON."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        for handler in self.error_log.handlers:
            handler.setFormatter(JsonFormatter())
            handler.addFilter(RequestIdFilter())


def gunicorn_logger_class(log_format: str) -> str:
    """The ``logger_class`` gunicorn setting for a log format."""
    formatter(log_format)  # reject an unknown format before forking
    return f"{__name__}.{'GunicornLogger' if log_format == 'json' else 'AddressLogger'}"
