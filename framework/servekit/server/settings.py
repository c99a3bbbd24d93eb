"""Server settings: one table that makes the CLI flags, their ``SERVEKIT_*`` twins and ``--config``.

Precedence, highest first: command-line flag, ``SERVEKIT_*`` environment
variable, ``--config`` YAML file, default.  TF Serving's ``MODEL_NAME`` and
``MODEL_BASE_PATH`` work as in its image: with no paths given, servekit serves
``$MODEL_BASE_PATH/$MODEL_NAME`` under the name ``$MODEL_NAME``.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from servekit.routes import OPEN_PATHS


def _opt(default: Any, help: str, **kw: Any) -> Any:
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class Settings:
    paths: list[str] = field(
        default_factory=list, metadata={"help": "model folders, base paths or repositories", "positional": True}
    )
    model_name: str | None = _opt(None, "serve the single model folder under this name")
    host: str = _opt("0.0.0.0", "address to bind")
    http_port: int = _opt(8080, "HTTP port (REST: V1, V2, OpenAI)")
    grpc_port: int = _opt(8081, "gRPC port (TF Serving and V2 services); 0 disables gRPC")
    grpc_max_message_size: int = _opt(
        64 * 1024 * 1024, "largest gRPC message in bytes, either way (RESOURCE_EXHAUSTED above)"
    )
    workers: str = _opt(
        "auto",
        "HTTP worker processes: a number, or 'auto' for the CPUs this process may use (affinity and cgroup quota)",
    )
    server: str = _opt(
        "gunicorn",
        "HTTP engine for the WSGI app: 'gunicorn' (default) or 'granian' (Rust HTTP, higher throughput)",
        choices=("gunicorn", "granian"),
    )
    threads: int = _opt(16, "threads per worker (concurrent requests and streams per worker)")
    plugin: list[str] = field(
        default_factory=list, metadata={"help": "plugin module or .py file (repeatable)", "repeat": True}
    )
    config: str | None = _opt(None, "YAML file with any of these settings")
    api_key: str | None = _opt(
        None, "one key with every scope: 'Authorization: Bearer KEY' (visible in ps; prefer --api-key-file)"
    )
    api_key_file: str = _opt(
        "",
        "API keys with scopes, one 'SCOPES KEY' (or 'SCOPES sha256:HEX') per line, re-read when it changes; scopes infer, admin, metrics (docs/security.md)",
    )
    max_request_size: int = _opt(
        64 * 1024 * 1024, "largest request body in bytes, however it is framed (length, chunked, gzip); 413 above"
    )
    request_timeout: float = _opt(
        0.0, "seconds a request may take before it is answered 504; 0 (default) sets no limit"
    )
    poll_interval: float = _opt(
        1.0,
        "seconds between polls of the model folders (and s3://, gs://, https:// paths) for new versions; 0 disables",
    )
    model_cache_dir: str = _opt(
        "", "local cache of s3://, gs:// and https:// model paths (default ~/.cache/servekit/models)"
    )
    response_cache_bytes: int = _opt(
        64 * 1024 * 1024,
        "bytes the response cache may hold, shared by every worker (models opt in with 'cache:'); 0 turns it off",
    )
    max_batch_size: int = _opt(0, "default adaptive batch size per model; 0 disables batching")
    max_batch_time_ms: float = _opt(2.0, "default longest wait to fill a batch, in milliseconds")
    log_level: str = _opt("info", "debug, info, warning or error")
    preload: bool | None = _opt(
        None,
        "load models once before forking workers, shared copy-on-write (default auto: with several workers, when every model is a scikit-learn artifact; TensorFlow, torch, CUDA and model.py load in each worker)",
        flag=True,
    )
    fast_lane: bool = _opt(
        True,
        "answer inference routes (V2 infer, V1 predict/classify/regress, /predict) without Flask's request machinery; --no-fast-lane sends them through Flask",
        flag=True,
    )
    strict_readiness: bool = _opt(
        True,
        "/v2/health/ready is 200 only when every model has an AVAILABLE version; --no-strict-readiness: every first load finished and one model AVAILABLE",
        flag=True,
    )
    model_control_mode: str = _opt(
        "none",
        "V2 repository load/unload: 'none' refuses them (4xx), 'explicit' allows them (Triton's flag)",
        choices=("none", "explicit"),
    )
    grpc_after_load: bool = _opt(
        False,
        "each worker opens its gRPC port only after its first load, as tensorflow_model_server does (servekit tfserving sets it)",
        flag=True,
    )
    ports_after_load: bool = _opt(
        False,
        "each worker binds its HTTP and gRPC ports only after its first load, as tensorflow_model_server does (servekit tfserving sets it; gunicorn only)",
        flag=True,
    )
    grpc_socket_path: str = _opt("", "also serve gRPC on this Unix socket (TF Serving's --grpc_socket_path)")
    grpc_channel_arguments: str = _opt(
        "", "extra gRPC server arguments as key=value,key=value (TF Serving's --grpc_channel_arguments)"
    )
    grpc_threads: int = _opt(
        0,
        "threads per worker running gRPC calls (0: as --threads)",
    )
    grpc_tensor_content: bool = _opt(
        False,
        "TF Serving gRPC answers in tensor_content instead of the typed fields (TF Serving's --enable_serialization_as_tensor_content)",
        flag=True,
    )
    placement: str = _opt(
        "worker",
        "where models run unless servekit.yaml says: 'worker' (inside each HTTP worker) or 'process' (a model host process shared by all workers)",
        choices=("worker", "process"),
    )
    # -- production hardening (docs/operations.md) --
    open_paths: list[str] = field(
        default_factory=lambda: list(OPEN_PATHS),
        metadata={"help": "path prefixes that stay open when --api-key is set (repeatable)", "repeat": True},
    )
    max_inflight: int = _opt(0, "requests one worker runs at once; 0 means its thread count")
    model_memory_budget: int = _opt(
        0,
        "bytes of models resident at once (their files' size); the least recently used unpinned ones unload to make room and load again on their next request; 0: no budget",
    )
    max_queue: int = _opt(16, "requests one worker keeps waiting for a free slot; more are answered 429")
    drain_seconds: float = _opt(30.0, "after SIGTERM, seconds in-flight requests and streams get to finish")
    shutdown_delay: float = _opt(0.0, "after SIGTERM, seconds to keep accepting while readiness answers 503")
    request_log_url: str = _opt(
        "off",
        "request/prediction log store: 'sqlite' (a file in a temporary folder), sqlite:///FILE, a SQLAlchemy URL, or 'off'",
    )
    request_log_spool: str = _opt(
        "",
        "folder where each process spools its request logs before they reach the store; default: FILE-spool beside a SQLite file, else a folder in the temporary directory named after the URL",
    )
    log_format: str = _opt("text", "log lines as 'text' or 'json'")
    # -- security (docs/security.md) --
    body_timeout: float = _opt(60.0, "seconds a client has to send a request body (408 after); 0 sets no limit")
    header_timeout: float = _opt(
        10.0, "seconds a client has to send a request's line and headers (the connection is closed after)"
    )
    max_header_size: int = _opt(8190, "largest request line and largest header line in bytes (gunicorn: 431/400)")
    max_headers: int = _opt(100, "most header fields a request may send")
    max_tensor_elements: int = _opt(
        0, "most elements one request tensor may declare in its shape; 0 means --max-request-size"
    )
    max_request_inputs: int = _opt(1024, "most inputs (tensors) one V2 or TF Serving request may hold")
    tls_cert: str = _opt("", "TLS certificate chain (PEM) for HTTP and gRPC; reloaded when the file changes")
    tls_key: str = _opt("", "TLS private key (PEM) for --tls-cert")
    tls_client_ca: str = _opt("", "CA certificates (PEM): clients must present a certificate it signed (mutual TLS)")
    tls_scope: str = _opt(
        "all",
        "which ports TLS covers: 'all' (HTTP and gRPC) or 'grpc' (TF Serving's --ssl_config_file)",
        choices=("all", "grpc"),
    )
    access_log: bool = _opt(False, "log one line per request", flag=True)

    @property
    def model_paths(self) -> list[Path]:
        """The model paths as local folders: an ``s3://``, ``gs://`` or ``https://`` path as its
        cache folder, which the server's owner fills (:func:`servekit.storage.prepare_paths`)."""
        from servekit import storage

        return storage.local_paths(self.paths)


_ENV_PREFIX = "SERVEKIT_"


def env_name(name: str) -> str:
    return _ENV_PREFIX + name.upper()


#: The arguments KServe passes a serving runtime (its ``ServingRuntime`` ``args``, and
#: ``--workers`` it may add), as KServe's own model servers spell them (docs/scaling.md).
KSERVE_SPELLINGS = {
    "model_name": "--model_name",
    "http_port": "--http_port",
    "grpc_port": "--grpc_port",
    "threads": "--max_threads",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every setting as a flag; defaults are left unset so precedence can be applied."""
    parser.add_argument(
        "--model_dir",
        dest="model_dir",
        default=None,
        help="KServe's spelling of a single model folder to serve (where its storage initializer left the model)",
    )
    for f in fields(Settings):
        meta = f.metadata
        if meta.get("positional"):
            parser.add_argument(f.name, nargs="*", default=None, help=meta["help"])
            continue
        flag = "--" + f.name.replace("_", "-")
        flags = [flag, KSERVE_SPELLINGS[f.name]] if f.name in KSERVE_SPELLINGS else [flag]
        default = None if f.default is MISSING else f.default
        shown = "" if default in (None, "", []) or meta.get("flag") else f"default {default}; "
        help_text = f"{meta['help']} ({shown}env {env_name(f.name)})"
        if meta.get("flag"):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif meta.get("choices"):
            parser.add_argument(flag, dest=f.name, default=None, choices=meta["choices"], help=help_text)
        elif meta.get("repeat"):
            parser.add_argument(flag, action="append", default=None, help=help_text)
        else:
            parser.add_argument(*flags, dest=f.name, default=None, help=help_text)


def _config_file(config_file: str) -> dict[str, Any]:
    """The settings a ``--config`` YAML file gives; :class:`ValueError` in one line if it is unreadable."""
    try:
        loaded = yaml.safe_load(Path(config_file).read_text()) or {}
    except yaml.YAMLError as exc:  # one line naming the file and where, not the parser's dump
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise ValueError(f"--config {config_file}: not valid YAML{where}: {problem}") from None
    except OSError as exc:
        raise ValueError(f"--config {config_file}: cannot read it: {exc.strerror}") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"{config_file}: expected a mapping of settings")
    known = {f.name for f in fields(Settings)}
    unknown = set(k.replace("-", "_") for k in loaded) - known
    if unknown:
        raise ValueError(f"{config_file}: unknown setting(s) {', '.join(sorted(unknown))}")
    return {k.replace("-", "_"): v for k, v in loaded.items()}


def resolve(args: argparse.Namespace | None = None, environ: dict[str, str] | None = None) -> Settings:
    environ = dict(os.environ if environ is None else environ)
    given = {k: v for k, v in vars(args or argparse.Namespace()).items() if v not in (None, [])}
    model_dir = given.pop("model_dir", None)
    if model_dir:
        if given.get("paths"):
            raise ValueError("--model_dir: give the model folder once, as --model_dir or as a path, not both")
        given["paths"] = [model_dir]
    config_file = given.get("config") or environ.get(env_name("config"))
    values: dict[str, Any] = _config_file(config_file) if config_file else {}
    #: where each value came from, as the user wrote it: the config file's key, the variable, the flag
    origin = {name: f"{config_file}: {name}" for name in values}
    for f in fields(Settings):
        if env_name(f.name) in environ:
            raw = environ[env_name(f.name)]
            values[f.name] = raw.split(",") if f.name in ("paths", "plugin", "open_paths") else raw
            origin[f.name] = env_name(f.name)
    values.update(given)
    origin.update({name: "--" + name.replace("_", "-") for name in given})
    if not values.get("paths") and environ.get("MODEL_BASE_PATH"):
        model = environ.get("MODEL_NAME", "model")
        base = environ["MODEL_BASE_PATH"]
        values["paths"] = [f"{base.rstrip('/')}/{model}" if "://" in base else str(Path(base) / model)]
        values.setdefault("model_name", model)
    if not values.get("paths") and environ.get("STORAGE_URI"):  # KServe's model-server images
        values["paths"] = [environ["STORAGE_URI"]]
    settings = _coerce(values, origin)
    if settings.model_cache_dir:  # the storage cache is found through the environment by every process
        from servekit.storage import CACHE_ENV

        os.environ[CACHE_ENV] = settings.model_cache_dir
    return settings


#: What a value of each type must look like, for the one-line error.
_EXPECTED = {int: "an integer", float: "a number", str: "a string", list: "a list"}


def _coerce(values: dict[str, Any], origin: dict[str, str] | None = None) -> Settings:
    settings = Settings()
    for f in fields(Settings):
        if f.name not in values:
            continue
        where = (origin or {}).get(f.name) or "--" + f.name.replace("_", "-")
        raw = values[f.name]
        default = getattr(settings, f.name)
        value: Any
        try:
            if isinstance(default, bool) or f.metadata.get("flag"):
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
            expected = _EXPECTED.get(type(default), f"a {type(default).__name__}")
            raise ValueError(f"{where}: expected {expected}, found {raw!r}") from None
        choices = f.metadata.get("choices")
        if choices and value not in choices:
            raise ValueError(f"{where}: expected one of {', '.join(choices)}, found {raw!r}")
        setattr(settings, f.name, value)
    _validate(settings)
    return settings


_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _validate(settings: Settings) -> None:
    """Refuse values no server could start with, naming the flag (the CLI prints one line)."""
    if settings.log_level.lower() not in _LOG_LEVELS:
        raise ValueError(f"--log-level: expected one of {', '.join(_LOG_LEVELS)}, found {settings.log_level!r}")
    settings.log_level = settings.log_level.lower()
    if not 1 <= settings.http_port <= 65535:
        raise ValueError(f"--http-port: expected a port between 1 and 65535, found {settings.http_port}")
    if not 0 <= settings.grpc_port <= 65535:
        raise ValueError(
            f"--grpc-port: expected a port between 1 and 65535 (0 disables gRPC), found {settings.grpc_port}"
        )
    channel_arguments(settings.grpc_channel_arguments)
    if settings.grpc_threads < 0:
        raise ValueError(
            f"--grpc-threads: expected 0 (as --threads) or a positive number, found {settings.grpc_threads}"
        )
    if settings.response_cache_bytes < 0:
        raise ValueError(
            f"--response-cache-bytes: expected a number of bytes (0 turns the cache off), found {settings.response_cache_bytes}"
        )
    _check_key_file(settings.api_key_file)
    from servekit.server.tls import files_of

    files_of(settings, "grpc")  # a cert without its key, an unreadable file
    if settings.workers != "auto" and not (settings.workers.isdigit() and int(settings.workers) > 0):
        raise ValueError(f"--workers: expected a positive number or 'auto', found {settings.workers!r}")
    if settings.ports_after_load and settings.server != "gunicorn":
        raise ValueError(
            f"--ports-after-load: the {settings.server} server binds its HTTP port before its worker loads; "
            "use --server gunicorn (or --grpc-after-load for the gRPC port only)"
        )


def _check_key_file(path: str) -> None:
    """A key file's bad line or bound, named before any worker starts (a missing file is the app's to report)."""
    if not path or not os.path.isfile(path):
        return
    from servekit.server.auth import parse_entries

    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--api-key-file: cannot read {path}: {exc}") from None
    parse_entries(text, f"--api-key-file {path}")


def channel_arguments(text: str) -> list[tuple[str, Any]]:
    """``--grpc-channel-arguments``: ``key=value,key=value``, integers as numbers."""
    out: list[tuple[str, Any]] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = part.partition("=")
        if not eq or not key:
            raise ValueError(f"--grpc-channel-arguments: expected key=value, found {part!r}")
        out.append((key, int(value) if value.lstrip("-").isdigit() else value))
    return out


def worker_count(settings: Settings) -> int:
    """``--workers`` as a number: ``auto`` is the CPUs this process may use."""
    if settings.workers == "auto":
        from servekit.server.cpus import available_cpus

        return available_cpus()
    return int(settings.workers)
