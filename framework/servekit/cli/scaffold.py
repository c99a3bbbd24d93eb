"""The ``servekit new`` and ``servekit build`` command lines: their options, and running them.

The work itself is :mod:`servekit.scaffold.project`'s; a mistake is one line on stderr and a
non-zero status, never a traceback.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from servekit.scaffold import build_settings as scaffold_settings
from servekit.scaffold.project import BuildOptions, ScaffoldError, build, checked_wheel, new_project, untrained
from servekit.scaffold.render import DEFAULT_CUDA, DEFAULT_PYTHON, PROMETHEUS_URL

COMMANDS = ("new", "build")


def add_commands(sub: Any) -> None:
    """``servekit new`` and ``servekit build`` on the CLI's sub-command parser."""
    new = sub.add_parser("new", help="create a model container project (or a plugin package) from a template")
    new.add_argument("--plugin", action="store_true", help="create a plugin package instead of a model container")
    new.add_argument("--no-input", action="store_true", help="take the defaults (and --set values) without prompting")
    new.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="answer a prompt up front, e.g. --set framework=torch (repeatable)",
    )
    new.add_argument("--output-dir", default=".", help="where the new folder is created (default: here)")
    new.add_argument("--force", action="store_true", help="write into an existing folder of the same name")

    build_ = sub.add_parser(
        "build", help="write the build context (Dockerfile, manifests) of a model folder and docker build it"
    )
    build_.add_argument("path", help="the model folder (a project from `servekit new`, or any model folder)")
    device = build_.add_mutually_exclusive_group()
    device.add_argument(
        "--gpu",
        dest="gpu",
        action="store_const",
        const=True,
        help="CUDA runtime base image and CUDA torch wheels (default: what the project chose)",
    )
    device.add_argument(
        "--cpu", dest="gpu", action="store_const", const=False, help="a CPU image, whatever the project chose"
    )
    build_.add_argument("--tag", help="image tag (default: MODEL_NAME:latest)")
    build_.add_argument("--model-name", help="served model name (default: the folder's name)")
    build_.add_argument(
        "--python-version", help=f"Python of the CPU image (default: the project's, else {DEFAULT_PYTHON})"
    )
    build_.add_argument("--cuda-version", help=f"CUDA of the GPU image (default: the project's, else {DEFAULT_CUDA})")
    build_.add_argument(
        "--base-image",
        help="the image both stages start from, with python3 and its venv module (a mirror, a hardened or a "
        "local image); default: python:X-slim, or nvidia/cuda for --gpu",
    )
    build_.add_argument("--build-arg", action="append", metavar="KEY=VALUE", help="passed to docker build (repeatable)")
    build_.add_argument(
        "--docker-arg",
        action="append",
        metavar="ARG",
        help="an option for docker build, e.g. --docker-arg --network=host, --docker-arg --platform=linux/arm64 "
        "(repeatable)",
    )
    build_.add_argument("--pip-index-url", metavar="URL", help="the package index pip in the build uses")
    build_.add_argument(
        "--pip-extra-index-url", action="append", metavar="URL", help="a further package index (repeatable)"
    )
    build_.add_argument(
        "--pip-cert",
        metavar="FILE",
        help="a CA bundle pip trusts in the build (an intercepting proxy's), given as a BuildKit secret: "
        "never written into a layer",
    )
    build_.add_argument(
        "--tls-secret",
        default="",
        help="Kubernetes TLS Secret (tls.crt, tls.key) the manifests serve HTTP and gRPC from",
    )
    build_.add_argument(
        "--tls-client-ca", action="store_true", help="with --tls-secret: its ca.crt verifies client certificates"
    )
    build_.add_argument(
        "--api-keys-secret", default="", help="Kubernetes Secret whose api-keys entry is --api-key-file"
    )
    build_.add_argument(
        "--autoscale",
        choices=["keda", "hpa"],
        default="",
        help="scale on servekit's load signal: a KEDA ScaledObject, or an HPA with a prometheus-adapter rule "
        "(default: an HPA on CPU); docs/scaling.md",
    )
    build_.add_argument(
        "--target-concurrency",
        type=int,
        default=0,
        metavar="N",
        help="requests waiting or running per replica the autoscaler aims at (default: workers x threads)",
    )
    build_.add_argument("--min-replicas", type=int, default=1, metavar="N", help="fewest replicas (default 1)")
    build_.add_argument("--max-replicas", type=int, default=4, metavar="N", help="most replicas (default 4)")
    build_.add_argument("--prometheus-url", default=PROMETHEUS_URL, help="the Prometheus KEDA's trigger queries")
    build_.add_argument(
        "--startup-seconds",
        type=float,
        default=None,
        metavar="S",
        help="seconds a replica takes to load and warm up its models (default: measured by loading them "
        "here; 600 when that fails); sizes the startup probe",
    )
    build_.add_argument(
        "--context-only",
        "--no-docker",
        dest="context_only",
        action="store_true",
        help="only write the build context; without it, no Docker engine is an error",
    )
    wheel = build_.add_mutually_exclusive_group()
    wheel.add_argument(
        "--wheel",
        nargs="?",
        const="build",
        default="auto",
        metavar="WHEEL",
        help="install servekit in the image from this wheel (or, with no WHEEL, one built from "
        "servekit's source); default: only when servekit is not from a package index",
    )
    wheel.add_argument(
        "--no-wheel",
        dest="wheel",
        action="store_const",
        const=None,
        help="install servekit from the package index, whatever this install is",
    )


def run_command(args: Any) -> int:
    """Run ``new`` or ``build``; a mistake is one line on stderr and a non-zero status, never a traceback."""
    try:
        return _new(args) if args.command == "new" else _build(args)
    except ScaffoldError as exc:
        print(f"servekit {args.command}: {exc}", file=sys.stderr)
        return exc.exit_status


def _new(args: Any) -> int:
    import logging

    from cookiecutter.exceptions import CookiecutterException, FailedHookException

    context = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ScaffoldError(f"--set expects KEY=VALUE, found {item!r}", 2)
        context[key] = value
    # cookiecutter logs a failed hook with its traceback; the hook has said what was wrong
    logging.getLogger("cookiecutter").addHandler(logging.NullHandler())
    logging.getLogger("cookiecutter").propagate = False
    try:
        created = new_project(
            Path(args.output_dir),
            plugin=args.plugin,
            no_input=args.no_input,
            extra_context=context,
            overwrite=args.force,
        )
    except ScaffoldError:
        raise
    except FailedHookException:
        return 2  # the pre-generation hook printed one line per invalid name
    except (CookiecutterException, ValueError) as exc:
        raise ScaffoldError(f"no project created: {exc}", 2) from None
    print(f"created {created}")
    return 0


def _build(args: Any) -> int:
    folder = Path(args.path)
    if not folder.is_dir():
        raise ScaffoldError(f"not a folder: {folder}", 2)
    if args.tls_client_ca and not args.tls_secret:
        raise ScaffoldError("--tls-client-ca needs --tls-secret (its ca.crt)", 2)
    given = {
        "gpu": args.gpu,
        "python_version": args.python_version,
        "cuda_version": args.cuda_version,
        "base_image": args.base_image,
        "build_args": args.build_arg,
        "docker_args": args.docker_arg,
        "pip_index_url": args.pip_index_url,
        "pip_extra_index_urls": args.pip_extra_index_url,
        "pip_cert": args.pip_cert,
        "tag": args.tag,
        "model_name": args.model_name,
    }
    try:
        settings = scaffold_settings.resolve(folder.resolve(), given)
    except scaffold_settings.BuildSettingsError as exc:
        raise ScaffoldError(str(exc), 2) from None
    options = BuildOptions(
        model_name=settings.model_name or _model_name_of(folder.resolve()),
        gpu=settings.gpu,
        image=settings.tag,
        python_version=settings.python_version,
        cuda_version=settings.cuda_version,
        base_image=settings.base_image,
        tls_secret=args.tls_secret,
        tls_client_ca=args.tls_client_ca,
        api_keys_secret=args.api_keys_secret,
        autoscale=args.autoscale,
        target_concurrency=args.target_concurrency,
        min_replicas=args.min_replicas,
        max_replicas=args.max_replicas,
        prometheus_url=args.prometheus_url,
        startup_seconds=args.startup_seconds,
    )
    _check_scaling(args)
    if args.wheel not in (None, "auto", "build"):
        checked_wheel(Path(args.wheel))  # refused before the model is timed, which takes as long as its start
    if options.startup_seconds is None and not untrained(folder):  # an untrained one is refused or warned about
        options.startup_seconds = _measured_startup(folder.resolve(), options.model_name)
    return build(folder, options, run_docker=False if args.context_only else None, wheel=args.wheel, settings=settings)


def joined_option_values(argv: list[str]) -> list[str]:
    """``--docker-arg --network=host`` as ``--docker-arg=--network=host``: argparse would read the value,
    which starts with ``-``, as an option of its own."""
    joined: list[str] = []
    items = iter(argv)
    for item in items:
        if item == "--docker-arg":
            value = next(items, None)
            joined.append(item if value is None else f"{item}={value}")
        else:
            joined.append(item)
    return joined


def _check_scaling(args: Any) -> None:
    if args.min_replicas < 0 or args.max_replicas < 1 or args.min_replicas > args.max_replicas:
        raise ScaffoldError(
            f"--min-replicas {args.min_replicas} and --max-replicas {args.max_replicas}: "
            "expected 0 <= min <= max and max >= 1",
            2,
        )
    if args.target_concurrency < 0:
        raise ScaffoldError(f"--target-concurrency {args.target_concurrency}: expected 1 or more (0: the default)", 2)
    if args.startup_seconds is not None and not 0 < args.startup_seconds < 86400:
        raise ScaffoldError(f"--startup-seconds {args.startup_seconds:g}: expected a positive number of seconds", 2)


def _measured_startup(folder: Path, model_name: str, echo=print) -> float | None:
    """The models' load and warm-up time, measured here, for the startup probe."""
    from servekit.scaffold import startup_time

    seconds, why = startup_time.measure(folder, model_name)
    if seconds is None:
        echo(f"could not time the model's start here ({why}); the startup probe allows 600 s (--startup-seconds)")
    else:
        echo(f"the model loaded and warmed up in {seconds:.1f} s; the startup probe allows three times that")
    return seconds


def _model_name_of(folder: Path) -> str:
    """The name a previous build wrote into the Dockerfile, else the folder's name."""
    dockerfile = folder / "Dockerfile"
    if dockerfile.is_file():
        match = re.search(r"^\s*SERVEKIT_MODEL_NAME=(\S+)", dockerfile.read_text(), re.MULTILINE)
        if match:
            return match.group(1).rstrip("\\").strip()
    return folder.name
