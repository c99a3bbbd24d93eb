"""``servekit``: serve models, list plugins, create and build model containers, search and replay the request log."""

from __future__ import annotations

import argparse
import logging
import sys

import yaml

from servekit.hooks import manager as plugins
from servekit.server import settings as settings_mod
from servekit.version import __version__

log = logging.getLogger("servekit.server")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="servekit", description="Serve models over TF Serving, V2 and OpenAI APIs.")
    parser.add_argument("--version", action="version", version=f"servekit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve model folders, base paths or repositories")
    settings_mod.add_arguments(serve)

    listing = sub.add_parser("plugins", help="installed plugins and the hooks each implements")
    listing.add_argument("--plugin", action="append", default=[], help="also load this plugin module or file")
    listing.add_argument("--json", action="store_true", help="print JSON")

    from servekit.cli import logs as log_commands
    from servekit.cli import scaffold as scaffold_cli

    scaffold_cli.add_commands(sub)
    log_commands.add_commands(sub)
    from servekit.cli import tfserving as tfserving_cli  # `servekit tfserving`: tensorflow_model_server's flags

    tfserving = tfserving_cli.add_command(sub)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(scaffold_cli.joined_option_values(argv) if "build" in argv else argv)
    if args.command == "tfserving":
        return tfserving(args)
    if args.command == "serve":
        return _serve(args)
    if args.command in scaffold_cli.COMMANDS:
        return scaffold_cli.run_command(args)
    if args.command in log_commands.COMMANDS:
        return log_commands.run_command(args)
    return _plugins(args)


def _serve(args: argparse.Namespace) -> int:
    """Check everything a user can get wrong, each answered in one line (status 2), then serve.

    The checks run here, before gunicorn forks, so a mistake never surfaces as a
    worker's traceback or a server that starts and then cannot work.
    """
    try:
        settings = settings_mod.resolve(args)
        models, (plugin_names, not_installed) = _check_serve(settings)
    except (ValueError, OSError, yaml.YAMLError, _Refused) as exc:
        print(f"servekit: {exc}", file=sys.stderr)
        return 2
    from servekit.observability import logging as log_setup
    from servekit.server import ports

    log_setup.configure(settings.log_format, settings.log_level)
    for line in ports.startup_lines(settings, models, plugin_names, not_installed):
        log.info("%s", line)
    from servekit.server.engines import run

    run(settings)
    return 0


class _Refused(Exception):
    """A setting that would make the server fail; the message is the one line to print."""


def _check_serve(settings: settings_mod.Settings) -> tuple[list[str], tuple[list[str], dict[str, str]]]:
    """The served model names and the plugins (usable, and not installed with what installs them);
    :class:`_Refused` for the first mistake."""
    if not settings.paths:
        raise _Refused("no model path given (pass PATH, SERVEKIT_PATHS or MODEL_BASE_PATH)")
    if settings.threads < 1:
        raise _Refused(f"--threads must be at least 1 (threads per worker), found {settings.threads}")
    from servekit.dataplane.repository import discover
    from servekit.folders.servekit_yaml import ConfigError
    from servekit.server.ports import NoTempDir, PortTaken, check_ports, check_temp_dir
    from servekit.storage import prepare_paths

    try:
        # s3://, gs:// and https:// paths: mirrored here, in the process that will own the
        # model set, so a missing bucket or credential is this one line
        prepare_paths(settings.paths)
        models = sorted(discover(settings.model_paths, settings.model_name))
    except ConfigError as exc:
        raise _Refused(str(exc)) from None
    try:
        # imported once here so a missing or broken --plugin is one line, not a worker's traceback
        pm = plugins.build_manager(settings.plugin)
    except Exception as exc:
        raise _Refused(f"--plugin: {_one_line(exc)}") from None
    try:
        check_temp_dir()
        check_ports(settings)  # last: the nearer the bind, the smaller the window
    except (NoTempDir, PortTaken) as exc:
        raise _Refused(str(exc)) from None
    return models, plugins.usable(plugins.describe(pm))


def _one_line(exc: BaseException) -> str:
    message = " ".join(str(exc).split())
    if isinstance(exc, plugins.PluginError) and message:
        return message
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _plugins(args: argparse.Namespace) -> int:
    try:
        pm = plugins.build_manager(args.plugin)
    except Exception as exc:  # a missing or broken --plugin: one line, not a traceback
        print(f"servekit plugins: --plugin: {_one_line(exc)}", file=sys.stderr)
        return 2
    infos = plugins.describe(pm)
    if args.json:
        import json

        print(json.dumps([vars(i) for i in infos], indent=2))
        return 0
    _, not_installed = plugins.usable(infos)
    for info in infos:
        print(f"{info.name}  ({info.source})")
        if info.name in not_installed:
            print(f"  not installed: {', '.join(info.missing)} is missing ({not_installed[info.name]})")
        print("  hooks: " + (", ".join(info.hooks) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
