"""Server settings: one table that makes the CLI flags, their ``SERVEKIT_*`` twins and ``--config``.

Precedence, highest first: command-line flag, ``SERVEKIT_*`` environment
variable, ``--config`` YAML file, default.  TF Serving's ``MODEL_NAME`` and
``MODEL_BASE_PATH`` work as in its image: with no paths given, servekit serves
``$MODEL_BASE_PATH/$MODEL_NAME`` under the name ``$MODEL_NAME``.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml


def _opt(default: Any, help: str, **kw: Any) -> Any:
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class Settings:
    paths: list[str] = field(default_factory=list, metadata={"help": "model folders, base paths or repositories", "positional": True})
    model_name: str | None = _opt(None, "serve the single model folder under this name")
    host: str = _opt("0.0.0.0", "address to bind")
    http_port: int = _opt(8080, "HTTP port (REST: V1, V2, OpenAI)")
    grpc_port: int = _opt(8081, "gRPC port (TF Serving and V2 services); 0 disables gRPC")
    grpc_max_message_size: int = _opt(64 * 1024 * 1024, "largest gRPC message in bytes, either way (RESOURCE_EXHAUSTED above)")
    workers: int = _opt(1, "gunicorn worker processes (each loads every model)")
    threads: int = _opt(16, "threads per worker (concurrent requests and streams per worker)")
    plugin: list[str] = field(default_factory=list, metadata={"help": "plugin module or .py file (repeatable)", "repeat": True})
    config: str | None = _opt(None, "YAML file with any of these settings")
    api_key: str | None = _opt(None, "require 'Authorization: Bearer KEY' on inference routes")
    max_request_size: int = _opt(64 * 1024 * 1024, "largest request body in bytes (413 above)")
    request_timeout: float = _opt(0.0, "seconds a request may take before it is answered 504; 0 (default) sets no limit")
    poll_interval: float = _opt(1.0, "seconds between file-system polls for new model versions; 0 disables")
    max_batch_size: int = _opt(0, "default adaptive batch size per model; 0 disables batching")
    max_batch_time_ms: float = _opt(2.0, "default longest wait to fill a batch, in milliseconds")
    log_level: str = _opt("info", "debug, info, warning or error")
    preload: bool = _opt(False, "load models once in the master before forking workers", flag=True)
    # -- production hardening (docs/operations.md) --
    open_paths: list[str] = field(default_factory=lambda: ["/v2/health/", "/metrics"], metadata={"help": "path prefixes that stay open when --api-key is set (repeatable)", "repeat": True})
    max_inflight: int = _opt(0, "requests one worker runs at once; 0 means its thread count")
    max_queue: int = _opt(16, "requests one worker keeps waiting for a free slot; more are answered 429")
    drain_seconds: float = _opt(30.0, "after SIGTERM, seconds in-flight requests and streams get to finish")
    shutdown_delay: float = _opt(0.0, "after SIGTERM, seconds to keep accepting while readiness answers 503")
    request_log_url: str = _opt("off", "request/prediction log store: 'sqlite' (a file in a temporary folder), sqlite:///FILE, a SQLAlchemy URL, or 'off'")
    log_format: str = _opt("text", "log lines as 'text' or 'json'")
    access_log: bool = _opt(False, "log one line per request", flag=True)

    @property
    def model_paths(self) -> list[Path]:
        return [Path(p) for p in self.paths]


_ENV_PREFIX = "SERVEKIT_"


def env_name(name: str) -> str:
    return _ENV_PREFIX + name.upper()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every setting as a flag; defaults are left unset so precedence can be applied."""
    for f in fields(Settings):
        meta = f.metadata
        if meta.get("positional"):
            parser.add_argument(f.name, nargs="*", default=None, help=meta["help"])
            continue
        flag = "--" + f.name.replace("_", "-")
        help_text = f"{meta['help']} (env {env_name(f.name)})"
        if meta.get("flag"):
            parser.add_argument(flag, action="store_true", default=None, help=help_text)
        elif meta.get("repeat"):
            parser.add_argument(flag, action="append", default=None, help=help_text)
        else:
            parser.add_argument(flag, dest=f.name, default=None, help=help_text)


def resolve(args: argparse.Namespace | None = None, environ: dict[str, str] | None = None) -> Settings:
    environ = dict(os.environ if environ is None else environ)
    given = {k: v for k, v in vars(args or argparse.Namespace()).items() if v not in (None, [])}
    config_file = given.get("config") or environ.get(env_name("config"))
    values: dict[str, Any] = {}
    if config_file:
        loaded = yaml.safe_load(Path(config_file).read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{config_file}: expected a mapping of settings")
        known = {f.name for f in fields(Settings)}
        unknown = set(k.replace("-", "_") for k in loaded) - known
        if unknown:
            raise ValueError(f"{config_file}: unknown setting(s) {', '.join(sorted(unknown))}")
        values.update({k.replace("-", "_"): v for k, v in loaded.items()})
    for f in fields(Settings):
        if env_name(f.name) in environ:
            raw = environ[env_name(f.name)]
            values[f.name] = raw.split(",") if f.name in ("paths", "plugin", "open_paths") else raw
    values.update(given)
    if not values.get("paths") and environ.get("MODEL_BASE_PATH"):
        model = environ.get("MODEL_NAME", "model")
        values["paths"] = [str(Path(environ["MODEL_BASE_PATH"]) / model)]
        values.setdefault("model_name", model)
    return _coerce(values)


def _coerce(values: dict[str, Any]) -> Settings:
    settings = Settings()
    for f in fields(Settings):
        if f.name not in values:
            continue
        raw = values[f.name]
        default = getattr(settings, f.name)
        try:
            if isinstance(default, bool):
                value = raw if isinstance(raw, bool) else str(raw).lower() in ("1", "true", "yes", "on")
            elif isinstance(default, int):
                value = int(raw)
            elif isinstance(default, float):
                value = float(raw)
            elif isinstance(default, list):
                value = list(raw) if isinstance(raw, (list, tuple)) else [raw]
            else:
                value = None if raw is None else str(raw)
        except ValueError:
            raise ValueError(f"setting {f.name}: expected a {type(default).__name__}, found {raw!r}") from None
        setattr(settings, f.name, value)
    return settings
