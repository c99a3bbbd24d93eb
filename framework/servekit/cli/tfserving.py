"""``tensorflow_model_server``'s command line, served by servekit.

A deployment that replaces the ``tensorflow/serving`` image keeps its command:
``tensorflow_model_server --port=8500 --rest_api_port=8501 --model_name=m
--model_base_path=/models/m`` (or ``servekit tfserving ...``) runs the same
gunicorn server ``servekit serve`` runs, with TF Serving's flags mapped onto
:class:`servekit.server.settings.Settings`.  Flags are parsed as TensorFlow's flag
parser does (``--name=value``, ``--name value``, a bare ``--name`` for true),
and a flag that has no meaning here is refused by name unless it carries
TF Serving's default, so nothing is ignored silently.

``--model_config_file`` is TF Serving's text-format ``ModelServerConfig``,
parsed with protobuf's ``text_format`` against servekit's copy of the proto.
Each model's ``model_version_policy`` and ``version_labels`` become its
``servekit.yaml``: servekit serves a generated folder per model that links to
every entry of ``base_path`` and holds the merged ``servekit.yaml``; a thread
keeps the links in step with ``base_path`` (new versions appear) and, with
``--model_config_file_poll_wait_seconds``, re-reads the file: the control
plane (:mod:`servekit.control`) then adds, removes and re-versions models in
every worker, as ``HandleReloadConfigRequest`` over gRPC does.  Each worker
binds its gRPC and REST ports only after its first load, as tensorflow_model_server
does (``--ports-after-load``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from servekit.cli.tfserving_files import (
    DEFAULT_MAX_BATCH_SIZE,
    ConfigFileFolders,
    FlagError,
    check_monitoring_file,
    read_batching_file,
)
from servekit.server import settings as settings_mod
from servekit.version import __version__

log = logging.getLogger("servekit.tfserving")


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
    "ssl_config_file": Flag(str, ""),  # gRPC over TLS, as in TF Serving (servekit.server.tls)
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
    "use_alts_credentials": Flag(bool, False, False),
    "per_process_gpu_memory_fraction": Flag(float, 0.0, False),
    "saved_model_tags": Flag(str, "serve", False),
    "use_tflite_model": Flag(bool, False),  # TF Serving's older name for --prefer_tflite_model
    "prefer_tflite_model": Flag(bool, False),
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


# -- flags -> settings ---------------------------------------------------------------------------


def settings_values(flags: dict[str, Any]) -> dict[str, Any]:
    """The ``servekit serve`` settings TF Serving's flags stand for (paths excepted)."""
    get = lambda name: flags.get(name, FLAGS[name].default)  # noqa: E731 - a local shorthand
    values: dict[str, Any] = {"grpc_port": get("port"), "http_port": get("rest_api_port") or 8501}
    # as tensorflow_model_server: the ports answer once the models have loaded, and
    # ModelService.HandleReloadConfigRequest may change the models served
    values["ports_after_load"] = True
    values["model_control_mode"] = "explicit"
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
    if get("ssl_config_file"):
        from servekit.server.tls import read_tf_ssl_config

        values.update(read_tf_ssl_config(get("ssl_config_file")))
    values["grpc_socket_path"] = get("grpc_socket_path")
    values["grpc_channel_arguments"] = get("grpc_channel_arguments")
    try:
        settings_mod.channel_arguments(values["grpc_channel_arguments"])
    except ValueError as exc:
        raise FlagError(str(exc).replace("--grpc-channel-arguments", "--grpc_channel_arguments")) from None
    return values


#: read by the TensorFlow plugin in every worker: a version folder holding both a SavedModel
#: and ``model.tflite`` serves the TF Lite model (``options.prefer_tflite`` decides per model)
PREFER_TFLITE_ENV = "SERVEKIT_TENSORFLOW_PREFER_TFLITE"


def build(flags: dict[str, Any]) -> tuple[settings_mod.Settings, ConfigFileFolders | None]:
    """Settings for the flags, and the mirror of a ``--model_config_file`` (to close at exit)."""
    values = settings_values(flags)
    if flags.get("prefer_tflite_model") or flags.get("use_tflite_model"):
        os.environ[PREFER_TFLITE_ENV] = "true"
    config_file = flags.get("model_config_file", "")
    mirror = None
    if config_file:
        if flags.get("model_base_path"):
            raise FlagError("give either --model_config_file or --model_base_path, not both")
        mirror = ConfigFileFolders(config_file)
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


def serve(settings: settings_mod.Settings, mirror: ConfigFileFolders | None, flags: dict[str, Any]) -> int:
    from servekit.dataplane.repository import discover
    from servekit.folders.servekit_yaml import ConfigError
    from servekit.storage import prepare_paths

    try:
        prepare_paths(settings.paths)  # --model_base_path=s3://...: mirrored into the cache now
        discover(settings.model_paths, settings.model_name)  # fail fast, before forking workers
        if mirror is not None:
            mirror.watch(settings.poll_interval, float(flags.get("model_config_file_poll_wait_seconds", 0)))
        from servekit.server.engines import run

        # a reload over gRPC (HandleReloadConfigRequest) serves the mirror's folders too
        run(settings, mirror.adopt_documents if mirror is not None else None)
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
