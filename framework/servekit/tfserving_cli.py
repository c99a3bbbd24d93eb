"""``tensorflow_model_server``'s command line, served by servekit.

A deployment that replaces the ``tensorflow/serving`` image keeps its command:
``tensorflow_model_server --port=8500 --rest_api_port=8501 --model_name=m
--model_base_path=/models/m`` (or ``servekit tfserving ...``) runs the same
gunicorn server ``servekit serve`` runs, with TF Serving's flags mapped onto
:class:`servekit.settings.Settings`.  Flags are parsed as TensorFlow's flag
parser does (``--name=value``, ``--name value``, a bare ``--name`` for true),
and a flag that has no meaning here is refused by name unless it carries
TF Serving's default, so nothing is ignored silently.

``--model_config_file`` is TF Serving's text-format ``ModelServerConfig``,
parsed with protobuf's ``text_format`` against servekit's copy of the proto.
Each model's ``model_version_policy`` and ``version_labels`` become its
``servekit.yaml``: servekit serves a generated folder per model that links to
every entry of ``base_path`` and holds the merged ``servekit.yaml``; a thread
keeps the links in step with ``base_path`` (new versions appear) and, with
``--model_config_file_poll_wait_seconds``, re-reads the file so changed
policies and labels apply.  Adding or removing models needs a restart (logged).
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import __version__
from . import settings as settings_mod

log = logging.getLogger("servekit.tfserving")

#: TF Serving's default Prometheus path (also served without a monitoring config).
PROMETHEUS_PATH = "/monitoring/prometheus/metrics"
#: TF Serving's default batching parameters when ``--enable_batching`` has no file.
DEFAULT_MAX_BATCH_SIZE = 1000


class FlagError(ValueError):
    """A flag or a config file servekit cannot honour; the message names it."""


# -- the flag table --------------------------------------------------------------------------


@dataclass(frozen=True)
class Flag:
    kind: type  # bool, int, float or str
    default: Any
    #: ``None``: no servekit counterpart; only ``default`` is accepted.
    supported: bool = True


FLAGS: dict[str, Flag] = {
    "port": Flag(int, 8500),
    "grpc_socket_path": Flag(str, ""),
    "rest_api_port": Flag(int, 0),
    "rest_api_num_threads": Flag(int, 0),
    "rest_api_timeout_in_ms": Flag(int, 30000),
    "model_name": Flag(str, "default"),
    "model_base_path": Flag(str, ""),
    "model_config_file": Flag(str, ""),
    "model_config_file_poll_wait_seconds": Flag(int, 0),
    "file_system_poll_wait_seconds": Flag(int, 1),
    "enable_batching": Flag(bool, False),
    "batching_parameters_file": Flag(str, ""),
    "monitoring_config_file": Flag(str, ""),
    "grpc_channel_arguments": Flag(str, ""),
    "grpc_max_threads": Flag(int, 0),
    "enable_serialization_as_tensor_content": Flag(bool, False),
    "version": Flag(bool, False),
    # accepted at TF Serving's default only: servekit has no such knob
    "allow_version_labels_for_unavailable_models": Flag(bool, False, False),
    "enable_per_model_batching_parameters": Flag(bool, False, False),
    "enable_model_warmup": Flag(bool, True, False),
    "num_request_iterations_for_warmup": Flag(int, 1, False),
    "num_load_threads": Flag(int, 0, False),
    "num_unload_threads": Flag(int, 0, False),
    "max_num_load_retries": Flag(int, 5, False),
    "load_retry_interval_micros": Flag(int, 60_000_000, False),
    "flush_filesystem_caches": Flag(bool, True, False),
    "tensorflow_session_parallelism": Flag(int, 0, False),
    "tensorflow_intra_op_parallelism": Flag(int, 0, False),
    "tensorflow_inter_op_parallelism": Flag(int, 0, False),
    "tensorflow_session_config_file": Flag(str, "", False),
    "platform_config_file": Flag(str, "", False),
    "ssl_config_file": Flag(str, "", False),
    "use_alts_credentials": Flag(bool, False, False),
    "per_process_gpu_memory_fraction": Flag(float, 0.0, False),
    "saved_model_tags": Flag(str, "serve", False),
    "use_tflite_model": Flag(bool, False, False),
    "prefer_tflite_model": Flag(bool, False, False),
    "xla_cpu_compilation_enabled": Flag(bool, False, False),
    "enable_signature_method_name_check": Flag(bool, False, False),
    "remove_unused_fields_from_bundle_metagraph": Flag(bool, True, False),
    "rest_api_enable_cors_support": Flag(bool, False, False),
    "enable_profiler": Flag(bool, True, False),
    "enable_grpc_healthcheck_service": Flag(bool, False, False),
    "mixed_precision": Flag(str, "", False),
    "skip_initialize_tpu": Flag(bool, False, False),
    "thread_pool_factory_config_file": Flag(str, "", False),
}

_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")


def parse_flags(argv: list[str]) -> dict[str, Any]:
    """TF Serving's flags as ``{name: value}``, only those given.

    :raises FlagError: an unknown flag, a bad value, or a flag servekit cannot honour.
    """
    given: dict[str, Any] = {}
    args = list(argv)
    while args:
        arg = args.pop(0)
        if not arg.startswith("-") or arg.strip("-") == "":
            raise FlagError(f"unexpected argument {arg!r}; every setting is a --flag=value")
        name, has_value, raw = arg.lstrip("-").partition("=")
        flag = FLAGS.get(name)
        if flag is None:
            raise FlagError(f"unknown flag --{name} (see tensorflow_model_server --help)")
        if not has_value:
            if flag.kind is bool:
                raw = "true"
            elif args:
                raw = args.pop(0)
            else:
                raise FlagError(f"--{name} needs a value")
        given[name] = _value(name, flag, raw)
    for name, value in given.items():
        if not FLAGS[name].supported and value != FLAGS[name].default:
            raise FlagError(
                f"--{name}={raw_text(value)} is not supported by servekit (it has no such setting); "
                f"leave it at TF Serving's default ({raw_text(FLAGS[name].default)}) or drop it"
            )
    return given


def raw_text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _value(name: str, flag: Flag, raw: str) -> Any:
    if flag.kind is bool:
        if raw.lower() in _TRUE:
            return True
        if raw.lower() in _FALSE:
            return False
        raise FlagError(f"--{name}: expected true or false, found {raw!r}")
    try:
        return flag.kind(raw)
    except ValueError:
        raise FlagError(f"--{name}: expected {flag.kind.__name__}, found {raw!r}") from None


# -- text-format config files ----------------------------------------------------------------


def _parse_text(path: str, message: Any, flag: str) -> Any:
    from google.protobuf import text_format

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise FlagError(f"--{flag}: cannot read {path}: {exc.strerror}") from None
    try:
        return text_format.Parse(text, message)
    except text_format.ParseError as exc:
        raise FlagError(f"--{flag}: {path} is not a valid {type(message).__name__}: {exc}") from None


@dataclass
class ServedModel:
    """One ``ModelConfig`` entry of a ``--model_config_file``, as servekit will serve it."""

    name: str
    base_path: Path
    version_policy: Any = None  # servekit.yaml's form; None: the folder's own
    labels: dict[str, int] = field(default_factory=dict)


def read_model_config_file(path: str) -> list[ServedModel]:
    from .protocols.grpc.protos.tensorflow_serving.config import model_server_config_pb2 as pb

    config = _parse_text(path, pb.ModelServerConfig(), "model_config_file")
    if config.WhichOneof("config") == "custom_model_config":
        raise FlagError("--model_config_file: custom_model_config is not supported; use model_config_list")
    models = [_served_model(entry, Path(path).parent) for entry in config.model_config_list.config]
    names = [m.name for m in models]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise FlagError(f"--model_config_file: model {repeated[0]!r} is configured twice")
    return models


def _served_model(entry: Any, here: Path) -> ServedModel:
    where = f"--model_config_file: model {entry.name!r}"
    if not entry.name or not entry.base_path:
        raise FlagError(f"{where}: every config needs a name and a base_path")
    if entry.model_platform not in ("", "tensorflow"):
        raise FlagError(
            f"{where}: model_platform {entry.model_platform!r} is not supported; servekit picks "
            "the plugin from the model folder ('tensorflow' or leave it out)"
        )
    if entry.HasField("logging_config"):
        raise FlagError(f"{where}: logging_config is not supported; use servekit's --request-log-url")
    return ServedModel(
        name=entry.name,
        base_path=Path(entry.base_path),
        version_policy=_policy(entry.model_version_policy) if entry.HasField("model_version_policy") else None,
        labels=dict(entry.version_labels),
    )


def _policy(policy: Any) -> Any:
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return "all"
    if choice == "specific":
        if not policy.specific.versions:
            raise FlagError("--model_config_file: a specific version policy needs versions")
        return {"specific": list(policy.specific.versions)}
    n = policy.latest.num_versions if choice == "latest" else 1
    return {"latest": max(1, n)}


def read_batching_file(path: str) -> tuple[int, float]:
    """``(max_batch_size, max_batch_time_ms)`` from a ``--batching_parameters_file``."""
    from .protocols.grpc.protos.tensorflow_serving.config import batching_parameters_pb2 as pb

    params = _parse_text(path, pb.BatchingParameters(), "batching_parameters_file")
    if params.allowed_batch_sizes or params.pad_variable_length_inputs:
        raise FlagError(
            "--batching_parameters_file: allowed_batch_sizes and pad_variable_length_inputs are not "
            "supported; servekit batches requests of equal trailing shape, any batch size"
        )
    for name in (
        "num_batch_threads",
        "max_enqueued_batches",
        "thread_pool_name",
        "max_execution_batch_size",
        "enable_large_batch_splitting",
    ):
        if params.HasField(name):
            # scheduler tuning of TF's batcher: servekit's batcher runs in the request threads
            log.warning("--batching_parameters_file: %s has no servekit counterpart; not applied", name)
    size = params.max_batch_size.value if params.HasField("max_batch_size") else DEFAULT_MAX_BATCH_SIZE
    micros = params.batch_timeout_micros.value if params.HasField("batch_timeout_micros") else 0
    return int(size), micros / 1000.0


def check_monitoring_file(path: str) -> None:
    """Prometheus is always on; a custom path other than TF Serving's or ``/metrics`` is refused."""
    from .protocols.grpc.protos.tensorflow_serving.config import monitoring_config_pb2 as pb

    config = _parse_text(path, pb.MonitoringConfig(), "monitoring_config_file")
    wanted = config.prometheus_config.path
    if wanted and wanted not in (PROMETHEUS_PATH, "/metrics"):
        raise FlagError(
            f"--monitoring_config_file: prometheus_config.path {wanted!r} is not supported; "
            f"servekit serves metrics at {PROMETHEUS_PATH} and /metrics"
        )


# -- serving a model config file ----------------------------------------------------------------

_CONFIG = "servekit.yaml"


class Mirror:
    """Generated model folders for a ``--model_config_file``: links to ``base_path`` + servekit.yaml."""

    def __init__(self, config_file: str):
        self.config_file = config_file
        self.root = Path(tempfile.mkdtemp(prefix="servekit-tfserving-"))
        self.models = {m.name: m for m in read_model_config_file(config_file)}
        self._stop = threading.Event()
        self.sync()

    @property
    def paths(self) -> list[str]:
        return [str(self.root / name) for name in sorted(self.models)]

    def sync(self) -> None:
        for model in self.models.values():
            _sync_folder(self.root / model.name, model)

    def reload(self) -> None:
        """Re-read the config file: policies and labels apply; a changed model set is logged."""
        try:
            fresh = {m.name: m for m in read_model_config_file(self.config_file)}
        except FlagError as exc:
            log.error("%s; keeping the previous configuration", exc)
            return
        if sorted(fresh) != sorted(self.models):
            log.warning(
                "--model_config_file now names models %s; adding or removing models needs a restart, serving %s",
                sorted(fresh),
                sorted(self.models),
            )
        self.models.update({n: m for n, m in fresh.items() if n in self.models})

    def watch(self, poll_seconds: float, reload_seconds: float) -> None:
        """Keep the folders in step in a daemon thread (in gunicorn's master)."""
        interval = min(s for s in (poll_seconds, reload_seconds, 60.0) if s > 0)
        thread = threading.Thread(
            target=self._run, args=(interval, reload_seconds), name="servekit-tfserving-config", daemon=True
        )
        thread.start()

    def _run(self, interval: float, reload_seconds: float) -> None:
        waited = 0.0
        while not self._stop.wait(interval):
            waited += interval
            if reload_seconds > 0 and waited >= reload_seconds:
                waited = 0.0
                self.reload()
            try:
                self.sync()
            except OSError as exc:  # a base_path may vanish for a while; keep watching
                log.warning("cannot mirror a model folder: %s", exc)

    def close(self) -> None:
        self._stop.set()
        shutil.rmtree(self.root, ignore_errors=True)


def _sync_folder(folder: Path, model: ServedModel) -> None:
    folder.mkdir(exist_ok=True)
    base = model.base_path.resolve()
    wanted = {e.name: e for e in base.iterdir() if e.name != _CONFIG} if base.is_dir() else {}
    for entry in folder.iterdir():
        if entry.name != _CONFIG and entry.name not in wanted:
            entry.unlink()
    for name, target in wanted.items():
        link = folder / name
        if not link.is_symlink():
            link.symlink_to(target, target_is_directory=target.is_dir())
    text = yaml.safe_dump(_merged_config(base, model), sort_keys=True)
    config = folder / _CONFIG
    if not config.is_file() or config.read_text() != text:
        tmp = folder / (_CONFIG + ".tmp")  # written whole, then renamed: a poll never reads half
        tmp.write_text(text)
        tmp.replace(config)


def _merged_config(base: Path, model: ServedModel) -> dict[str, Any]:
    own = base / _CONFIG
    merged = (yaml.safe_load(own.read_text()) or {}) if own.is_file() else {}
    if model.version_policy is not None:
        merged["version_policy"] = model.version_policy
    if model.labels:
        merged["labels"] = dict(model.labels)
    return merged


# -- flags -> settings ---------------------------------------------------------------------------


def settings_values(flags: dict[str, Any]) -> dict[str, Any]:
    """The ``servekit serve`` settings TF Serving's flags stand for (paths excepted)."""
    get = lambda name: flags.get(name, FLAGS[name].default)  # noqa: E731 - a local shorthand
    values: dict[str, Any] = {"grpc_port": get("port"), "http_port": get("rest_api_port") or 8501}
    if get("rest_api_port") == 0:
        log.warning("--rest_api_port is 0: servekit always serves REST, on 8501")
    if "rest_api_timeout_in_ms" in flags:
        values["request_timeout"] = get("rest_api_timeout_in_ms") / 1000.0
    threads = max(get("rest_api_num_threads"), get("grpc_max_threads"))
    if threads > 0:
        values["threads"] = threads
    values["poll_interval"] = float(get("file_system_poll_wait_seconds"))
    if get("enable_serialization_as_tensor_content"):
        values["grpc_tensor_content"] = True
    if get("batching_parameters_file") and not get("enable_batching"):
        raise FlagError("--batching_parameters_file needs --enable_batching")
    if get("enable_batching"):
        size, ms = (
            read_batching_file(get("batching_parameters_file"))
            if get("batching_parameters_file")
            else (DEFAULT_MAX_BATCH_SIZE, 0.0)
        )
        values["max_batch_size"], values["max_batch_time_ms"] = size, ms
    if get("monitoring_config_file"):
        check_monitoring_file(get("monitoring_config_file"))
    values["grpc_socket_path"] = get("grpc_socket_path")
    values["grpc_channel_arguments"] = get("grpc_channel_arguments")
    try:
        settings_mod.channel_arguments(values["grpc_channel_arguments"])
    except ValueError as exc:
        raise FlagError(str(exc).replace("--grpc-channel-arguments", "--grpc_channel_arguments")) from None
    return values


def build(flags: dict[str, Any]) -> tuple[settings_mod.Settings, Mirror | None]:
    """Settings for the flags, and the mirror of a ``--model_config_file`` (to close at exit)."""
    values = settings_values(flags)
    config_file = flags.get("model_config_file", "")
    mirror = None
    if config_file:
        if flags.get("model_base_path"):
            raise FlagError("give either --model_config_file or --model_base_path, not both")
        mirror = Mirror(config_file)
        values["paths"] = mirror.paths
    elif flags.get("model_base_path"):
        values["paths"] = [flags["model_base_path"]]
        values["model_name"] = flags.get("model_name", FLAGS["model_name"].default)
    else:
        raise FlagError("either --model_config_file or --model_base_path must be given")
    try:
        settings = settings_mod.resolve(argparse.Namespace(**values))
    except ValueError:
        if mirror:
            mirror.close()
        raise
    return settings, mirror


# -- entry points ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """``tensorflow_model_server [flags]`` (also ``servekit tfserving [flags]``)."""
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("--help", "-h", "--helpfull") for a in argv):
        print(usage())
        return 0
    try:
        flags = parse_flags(argv)
        if flags.get("version"):
            print(f"TensorFlow ModelServer: servekit {__version__}")
            return 0
        settings, mirror = build(flags)
    except (FlagError, ValueError) as exc:
        print(f"tensorflow_model_server: {exc}", file=sys.stderr)
        return 2
    return serve(settings, mirror, flags)


def serve(settings: settings_mod.Settings, mirror: Mirror | None, flags: dict[str, Any]) -> int:
    from .config import ConfigError
    from .repository import discover

    try:
        discover(settings.model_paths, settings.model_name)  # fail fast, before forking workers
        if mirror is not None:
            mirror.watch(settings.poll_interval, float(flags.get("model_config_file_poll_wait_seconds", 0)))
        from .server.engines import run

        run(settings)
    except ConfigError as exc:
        print(f"tensorflow_model_server: {exc}", file=sys.stderr)
        return 2
    finally:
        if mirror is not None:
            mirror.close()
    return 0


def usage() -> str:
    lines = ["usage: tensorflow_model_server [--flag=value ...]  (servekit " + __version__ + ")", ""]
    for name, flag in FLAGS.items():
        note = "" if flag.supported else "  (only the default is accepted)"
        lines.append(f"  --{name}={raw_text(flag.default)}  {flag.kind.__name__}{note}")
    return "\n".join(lines)


def add_command(sub: Any) -> Callable[[argparse.Namespace], int]:
    """``servekit tfserving``: the same flags, passed through unparsed."""
    parser = sub.add_parser(
        "tfserving", help="serve with tensorflow_model_server's flags", add_help=False, prefix_chars="\0"
    )
    parser.add_argument("tf_flags", nargs=argparse.REMAINDER)
    return lambda args: main(args.tf_flags)


if __name__ == "__main__":
    sys.exit(main())
