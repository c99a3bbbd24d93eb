"""Where a server's model hosts live: one runtime folder, one owner, one shared-memory prefix.

The server's top process (gunicorn's master, before it forks) calls
:func:`prepare_server`: it makes a private folder for the hosts' sockets, lock
and pid files, and exports it with the owner's pid and a random server id
through the environment, so every HTTP worker, however the engine started it,
finds the same hosts.  A process that finds no such environment (an
in-process test app) becomes the owner itself.

Cleanup happens in three places, so nothing outlives the server:

- the owner's :func:`cleanup` (normal exit) stops the hosts and sweeps
  ``/dev/shm`` for the server's prefix;
- each host watches the owner's pid and exits when it is gone (a ``kill -9``
  of the server), sweeping as it goes;
- a worker that restarts a crashed host sweeps that host's prefix.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import signal
import tempfile
import time
from pathlib import Path

from servekit.hosts import channel

ENV_DIR = "SERVEKIT_HOSTS_DIR"
ENV_OWNER = "SERVEKIT_HOSTS_OWNER"
ENV_ID = "SERVEKIT_HOSTS_ID"
ENV_CALL_TIMEOUT = "SERVEKIT_HOSTS_CALL_TIMEOUT"
ENV_IN_HOST = "SERVEKIT_IN_MODEL_HOST"
ENV_PLACEMENT = "SERVEKIT_PLACEMENT"


def prepare_server(request_timeout: float = 0.0, placement: str | None = None) -> None:
    """Make this process the owner of the server's hosts (call before workers fork)."""
    if os.environ.get(ENV_OWNER) == str(os.getpid()):
        return
    folder = tempfile.mkdtemp(prefix="servekit-hosts-")
    os.environ[ENV_DIR] = folder
    os.environ[ENV_OWNER] = str(os.getpid())
    os.environ[ENV_ID] = secrets.token_hex(4)
    if request_timeout > 0:
        os.environ[ENV_CALL_TIMEOUT] = str(request_timeout)
    if placement:
        os.environ[ENV_PLACEMENT] = placement
    atexit.register(cleanup)


def ensure() -> Path:
    """The runtime folder, made now (this process the owner) if the server did not prepare one."""
    folder = os.environ.get(ENV_DIR)
    if not folder or not Path(folder).is_dir() or not _alive(owner_pid()):
        prepare_server()
        folder = os.environ[ENV_DIR]
    return Path(folder)


def owner_pid() -> int:
    return int(os.environ.get(ENV_OWNER, "0") or 0)


def server_id() -> str:
    return os.environ.get(ENV_ID, "local")


def shm_prefix(pid: int | None = None) -> str:
    """Slab names of this server (``pid=None``) or of one process of it."""
    base = f"servekit-{server_id()}-"
    return base if pid is None else f"{base}{pid}-"


def call_timeout() -> float | None:
    value = float(os.environ.get(ENV_CALL_TIMEOUT) or os.environ.get("SERVEKIT_REQUEST_TIMEOUT") or 0)
    return value if value > 0 else None


def default_placement() -> str:
    return os.environ.get(ENV_PLACEMENT, "worker")


def in_host() -> bool:
    return os.environ.get(ENV_IN_HOST) == "1"


def cleanup(grace: float = 5.0) -> None:
    """Owner exit: stop every host of this server, then remove its slabs and folder."""
    if os.environ.get(ENV_OWNER) != str(os.getpid()):
        return
    folder = Path(os.environ.get(ENV_DIR, ""))
    pids = host_pids(folder) if folder.is_dir() else []
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in pids:
        _signal(pid, signal.SIGKILL)
    channel.sweep(shm_prefix())
    shutil.rmtree(folder, ignore_errors=True)
    # the server is gone: nothing of it stays for a server this process starts later
    for key in (ENV_DIR, ENV_OWNER, ENV_ID, ENV_CALL_TIMEOUT, ENV_PLACEMENT):
        os.environ.pop(key, None)


def host_pids(folder: Path) -> list[int]:
    pids = []
    for entry in folder.glob("*.pid"):
        try:
            pids.append(int(entry.read_text().strip() or 0))
        except (OSError, ValueError):
            continue
    return [p for p in pids if p > 0]


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"
