"""Ports: refuse one another server holds, and say at start-up what each port serves.

Workers of one server share its ports: gunicorn's workers inherit one HTTP
socket, and each worker binds the gRPC port with ``SO_REUSEPORT`` so the kernel
spreads connections between them.  ``SO_REUSEPORT`` would just as happily let a
second server bind the same gRPC port and take a share of the first one's
traffic without a word.  So before forking, :func:`check_ports` binds a probe
socket *without* ``SO_REUSEPORT`` to each port; that bind fails while any other
socket holds the port, whichever options it was bound with, and the server
stops with one line naming the port and the flag that changes it.
"""

from __future__ import annotations

import socket
import tempfile

from servekit.server.settings import Settings
from servekit.version import __version__

#: gRPC services a server answers on ``--grpc-port`` (fully qualified, as clients name them).
GRPC_SERVICES = (
    "tensorflow.serving.PredictionService",
    "tensorflow.serving.ModelService",
    "inference.GRPCInferenceService",
)
_ALL_INTERFACES = ("", "0.0.0.0", "::", "[::]")


class PortTaken(RuntimeError):
    """A port this server needs is held by another socket (or may not be bound at all)."""


class NoTempDir(RuntimeError):
    """No temporary folder is writable (a read-only root file system without a tmpfs)."""


def check_temp_dir() -> None:
    """The server's shared folders (metrics, control socket, model hosts) need a temporary folder.

    :raises NoTempDir: with a one-line message saying how to give it one.
    """
    try:
        tempfile.gettempdir()
    except FileNotFoundError:
        raise NoTempDir(
            "no writable temporary folder (TMPDIR, /tmp): on a read-only root file system mount one, "
            "e.g. docker run --read-only --tmpfs /tmp (on Kubernetes an emptyDir at /tmp)"
        ) from None


def grpc_enabled(settings: Settings) -> bool:
    """gRPC is served when ``--grpc-port`` is not 0 and the ``grpc`` extra is installed."""
    from servekit.server import grpc_engine as grpc

    return bool(settings.grpc_port) and not grpc.missing_libraries()


def check_ports(settings: Settings) -> None:
    """Every port this server will bind is free; call before forking workers.

    :raises PortTaken: with a one-line message naming the port and its flag.
    """
    ports = [(settings.http_port, "--http-port")]
    if grpc_enabled(settings):
        if settings.grpc_port == settings.http_port:
            raise PortTaken(f"--http-port and --grpc-port are both {settings.http_port}; give gRPC another port")
        ports.append((settings.grpc_port, "--grpc-port"))
    for port, flag in ports:
        check_free(settings.host, port, flag)


def check_free(host: str, port: int, flag: str) -> None:
    """Bind ``host:port`` once without ``SO_REUSEPORT``; :class:`PortTaken` if that fails."""
    try:
        family, _, _, _, address = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise PortTaken(f"--host {host!r} is not an address this machine can bind: {exc.strerror}") from None
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # as gunicorn and gRPC set it: a connection of an earlier run in TIME_WAIT
        # does not hold the port, a listening socket does
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise PortTaken(_taken_message(host, port, flag, exc)) from None


def _taken_message(host: str, port: int, flag: str, exc: OSError) -> str:
    where = f"port {port} ({flag}) on {host or 'all interfaces'}"
    if isinstance(exc, PermissionError):
        return f"{where}: permission denied (ports below 1024 need privileges); choose another with {flag}"
    return (
        f"{where} is already in use (another servekit or another program holds it); "
        f"stop that server or choose a free port with {flag}"
    )


# -- what each port serves -------------------------------------------------------------


def startup_lines(
    settings: Settings, models: list[str], plugins: list[str], not_installed: dict[str, str] | None = None
) -> list[str]:
    """The start-up summary: models and the plugins that can load them, then which URL serves which protocol.

    ``not_installed``: the plugins whose library is missing, with what installs it
    (:func:`servekit.hooks.manager.usable`); they are named apart, never as usable.
    """
    http = _display_host(settings.host)
    bound = " (all interfaces)" if settings.host in _ALL_INTERFACES else ""
    missing = "".join(f"; {name} not installed ({how})" for name, how in sorted((not_installed or {}).items()))
    lines = [
        f"servekit {__version__}: {len(models)} model(s): {', '.join(models) or 'none'}; "
        f"plugins: {', '.join(plugins) or 'none'}{missing}",
        f"HTTP http://{http}:{settings.http_port}{bound}: TF Serving REST /v1/models/NAME, "
        "V2 /v2 and /v2/models/NAME, OpenAI /v1/chat/completions, /v1/completions, /v1/embeddings "
        "(also under /openai/v1), health /v2/health/live|ready, metrics /metrics, status page /, "
        "API docs /docs",
    ]
    if not settings.grpc_port:
        lines.append("gRPC off (--grpc-port 0)")
    elif not grpc_enabled(settings):
        lines.append("gRPC off: grpcio is not installed (pip install 'servekit[grpc]', or pass --grpc-port 0)")
    else:
        lines.append(f"gRPC {http}:{settings.grpc_port}{bound}: {', '.join(GRPC_SERVICES)}")
    return lines


def _display_host(host: str) -> str:
    if host in _ALL_INTERFACES:
        return "localhost"
    return f"[{host}]" if ":" in host else host
