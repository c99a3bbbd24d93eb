"""The owner's socket: workers follow its plans and send their control calls over it.

One Unix socket per server, in a private temporary folder, authenticated with a
random key (``multiprocessing.connection``: its handshake, then pickled
messages).  The engine's top process opens it before forking and exports its
address and key through the environment, so every worker finds it however the
engine started it.  Two kinds of connection:

- a *follower* (one per worker, for its life) sends ``("follow", pid)``, then
  receives ``("plan", plan)`` and answers ``("applied", generation, states)``
  after applying each;
- a *call* sends ``("call", op, kwargs)`` and gets ``("ok", result)`` or
  ``("error", kind, message, status, grpc_code)`` back.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import socket
import tempfile
import threading
from multiprocessing.connection import Client, Connection, answer_challenge, deliver_challenge
from pathlib import Path
from typing import Any

from servekit import errors
from servekit.control.owner import Owner

log = logging.getLogger("servekit.control")

ENV_ADDRESS = "SERVEKIT_CONTROL_ADDRESS"
ENV_KEY = "SERVEKIT_CONTROL_KEY"
ENV_OWNER = "SERVEKIT_CONTROL_OWNER"

_owner: Owner | None = None  # the owner this process runs, if it runs one
#: How often a worker tells the owner which models it served (at most).
USAGE_SECONDS = 1.0


def local_owner() -> Owner | None:
    """The owner running in this process (the engine's top process), ``None`` elsewhere."""
    if _owner is not None and os.environ.get(ENV_OWNER) == str(os.getpid()):
        return _owner
    return None


def address() -> str | None:
    """The owner's socket when this process is one of a server's workers."""
    found = os.environ.get(ENV_ADDRESS)
    return found if found and os.environ.get(ENV_OWNER) != str(os.getpid()) else None


def _key() -> bytes:
    return bytes.fromhex(os.environ.get(ENV_KEY, ""))


# -- the owner's side ----------------------------------------------------------------------


def serve(owner: Owner) -> Any:
    """Open the owner's socket in this process and export where it is; returns a closer."""
    global _owner
    folder = tempfile.mkdtemp(prefix="servekit-control-")
    path = str(Path(folder) / "control.sock")
    key = secrets.token_bytes(16)
    # a plain socket, not multiprocessing's Listener: the Listener removes its file when any
    # process holding it exits, and every forked worker would hold it
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    os.environ.update({ENV_ADDRESS: path, ENV_KEY: key.hex(), ENV_OWNER: str(os.getpid())})
    _owner = owner
    threading.Thread(target=_accept, args=(listener, key, owner), name="servekit-control", daemon=True).start()

    def close() -> None:
        global _owner
        owner.stop()
        listener.close()
        shutil.rmtree(folder, ignore_errors=True)
        # no longer the owner: a server this process starts later makes its own
        if _owner is owner:
            _owner = None
        if os.environ.get(ENV_ADDRESS) == path:
            for name in (ENV_ADDRESS, ENV_KEY, ENV_OWNER):
                os.environ.pop(name, None)

    return close


def _accept(listener: socket.socket, key: bytes, owner: Owner) -> None:
    while True:
        try:
            sock, _ = listener.accept()
        except OSError:
            return  # closed
        threading.Thread(target=_handshake, args=(sock, key, owner), name="servekit-control-conn", daemon=True).start()


def _handshake(sock: socket.socket, key: bytes, owner: Owner) -> None:
    """multiprocessing's mutual challenge (HMAC over the key), then the connection's messages."""
    conn = Connection(sock.detach())
    try:
        deliver_challenge(conn, key)
        answer_challenge(conn, key)
    except Exception as exc:  # not one of ours
        log.warning("control socket: refused a connection: %s", exc)
        conn.close()
        return
    _connection(conn, owner)


class RemoteLink:
    """A worker's repository, as the owner sees it."""

    def __init__(self, conn: Connection, pid: int):
        self.conn = conn
        self.label = f"worker {pid}"
        self.generation = 0
        self.states: dict[str, Any] = {}
        self.used: dict[str, float] = {}
        self._lock = threading.Lock()

    def send(self, plan: dict[str, Any]) -> None:
        with self._lock:
            self.conn.send(("plan", plan))

    def usage(self) -> dict[str, float]:
        return self.used


def _connection(conn: Connection, owner: Owner) -> None:
    with conn:
        try:
            first = conn.recv()
        except (EOFError, OSError):
            return
        if first[0] == "follow":
            _follower(conn, owner, int(first[1]))
        elif first[0] == "call":
            conn.send(_answer(owner, first[1], first[2]))


def _follower(conn: Connection, owner: Owner, pid: int) -> None:
    link = RemoteLink(conn, pid)
    try:
        owner.join(link)
        while True:
            message = conn.recv()
            if message[0] == "used":
                link.used = message[1]
            else:
                _, generation, states = message
                owner.acknowledge(link, generation, states)
    except (EOFError, OSError):
        pass
    finally:
        owner.leave(link)


def _answer(owner: Owner, op: str, kwargs: dict[str, Any]) -> tuple[Any, ...]:
    try:
        return ("ok", owner.call(op, **kwargs))
    except errors.ServekitError as exc:
        return ("error", type(exc).__name__, exc.message, exc.status, exc.grpc_code)
    except Exception:
        # the log gets the reason; the client no server path or error number
        log.exception("control call %s failed", op)
        message = f"control call {op} failed in the server (its log says why)"
        return ("error", "ServekitError", message, 500, errors.ServekitError.grpc_code)


# -- a worker's side -------------------------------------------------------------------------


def call(op: str, timeout: float | None = None, **kwargs: Any) -> Any:
    """Send one control call to the owner and wait for its answer (raised as the owner raised it)."""
    where = address()
    if where is None:
        raise errors.NotReady("the control plane is not reachable from this process")
    try:
        with Client(where, family="AF_UNIX", authkey=_key()) as conn:
            conn.send(("call", op, kwargs))
            if timeout is not None and not conn.poll(timeout):
                raise errors.Timeout(f"the control plane did not answer {op} within {timeout:g}s")
            reply = conn.recv()
    except (OSError, EOFError) as exc:
        raise errors.NotReady(f"the control plane is not reachable: {exc}") from None
    if reply[0] == "ok":
        return reply[1]
    raise _error(*reply[1:])


def _error(kind: str, message: str, status: int, grpc_code: str | None = None) -> errors.ServekitError:
    """The owner's error as it raised it: its class when :mod:`servekit.errors` has it, its status and gRPC code."""
    cls = getattr(errors, kind, None)
    try:
        error = cls(message) if isinstance(cls, type) and issubclass(cls, errors.ServekitError) else None
    except TypeError:
        error = None
    if error is None:
        error = errors.NotFound(message) if status == 404 else errors.ServekitError(message)
        error.status = status
    if grpc_code and grpc_code != error.grpc_code:
        error.grpc_code = grpc_code  # a subclass of the owner's, such as uploads.UploadRefused
    return error


def follow(repository: Any) -> threading.Thread:
    """Keep ``repository`` in step with the owner's plans, in a daemon thread."""
    thread = threading.Thread(target=_follow, args=(repository,), name="servekit-control-follow", daemon=True)
    thread.start()
    return thread


def _follow(repository: Any) -> None:
    where = address() or ""
    try:
        conn = Client(where, family="AF_UNIX", authkey=_key())
    except (OSError, EOFError) as exc:
        log.error("cannot reach the control plane (%s): this worker serves its model folders alone", exc)
        repository.sync()
        return
    with conn:
        conn.send(("follow", os.getpid()))
        reported: dict[str, float] = {}
        while True:
            try:
                if conn.poll(USAGE_SECONDS):
                    _, plan = conn.recv()
                    conn.send(("applied", plan["generation"], _apply(repository, plan)))
                used = repository.usage()
                if used != reported:  # for the memory budget: which models were asked for lately
                    conn.send(("used", used))
                    reported = used
            except (EOFError, OSError):
                log.warning("the control plane went away; this worker keeps serving what it has")
                return


def _apply(repository: Any, plan: dict[str, Any]) -> Any:
    try:
        if plan["generation"] > repository.generation or not repository.ready:
            return repository.apply(plan)
    except Exception:
        log.exception("applying plan %d failed", plan["generation"])
    return repository.states()
