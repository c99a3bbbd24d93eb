"""``servekit``: serve models, list plugins, create and build model containers."""

from __future__ import annotations

import argparse
import sys

from . import __version__, plugins
from . import settings as settings_mod


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="servekit", description="Serve models over TF Serving, V2 and OpenAI APIs.")
    parser.add_argument("--version", action="version", version=f"servekit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve model folders, base paths or repositories")
    settings_mod.add_arguments(serve)

    listing = sub.add_parser("plugins", help="installed plugins and the hooks each implements")
    listing.add_argument("--plugin", action="append", default=[], help="also load this plugin module or file")
    listing.add_argument("--json", action="store_true", help="print JSON")

    from . import scaffold

    scaffold.add_commands(sub)

    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command in scaffold.COMMANDS:
        return scaffold.run_command(args)
    return _plugins(args)


def _serve(args: argparse.Namespace) -> int:
    try:
        settings = settings_mod.resolve(args)
    except (ValueError, OSError) as exc:
        print(f"servekit: {exc}", file=sys.stderr)
        return 2
    if not settings.paths:
        print("servekit: no model path given (pass PATH, SERVEKIT_PATHS or MODEL_BASE_PATH)", file=sys.stderr)
        return 2
    from .config import ConfigError
    from .repository import discover

    try:
        discover(settings.model_paths, settings.model_name)  # fail fast, before forking workers
    except ConfigError as exc:
        print(f"servekit: {exc}", file=sys.stderr)
        return 2
    from .server.gunicorn_app import run

    run(settings)
    return 0


def _plugins(args: argparse.Namespace) -> int:
    pm = plugins.build_manager(args.plugin)
    infos = plugins.describe(pm)
    if args.json:
        import json

        print(json.dumps([vars(i) for i in infos], indent=2))
        return 0
    for info in infos:
        print(f"{info.name}  ({info.source})")
        print("  hooks: " + (", ".join(info.hooks) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
