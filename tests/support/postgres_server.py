"""A throwaway PostgreSQL for tests: ``start_postgres(folder) -> (url, stop)``.

``initdb`` and ``postgres`` from Debian's ``postgresql`` package (scripts/test.sh
installs it when missing and run as root), listening on 127.0.0.1 on a free port
with trust authentication, its data and socket in ``folder``.  PostgreSQL will
not run as root, so as root the server runs as the package's ``postgres`` user,
its cluster in a temporary folder of that user's.
Skips the calling test, with the reason, when PostgreSQL is not installed.

The URL names SQLAlchemy's psycopg (v3) driver:
``postgresql+psycopg://postgres@127.0.0.1:PORT/postgres``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from servekit.testing import free_port


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if found:
        return found[-1]  # the newest installed major version
    on_path = shutil.which(name)
    if on_path is None:
        pytest.skip("PostgreSQL is not installed (Debian: apt-get install -y postgresql; scripts/test.sh does as root)")
    return on_path


def _as_owner() -> tuple[dict[str, Any], Path | None]:
    """The ``subprocess`` arguments that run PostgreSQL as a user it accepts, and (as root) a folder of
    that user's.

    The caller's folder may sit under folders only root can enter (pytest's are),
    so as root the cluster lives in a temporary folder of its own.
    """
    if os.geteuid() != 0:
        return {}, None
    try:
        user = pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("running as root and there is no 'postgres' user for PostgreSQL to run as")

    own = Path(tempfile.mkdtemp(prefix="servekit-postgres-"))
    os.chown(own, user.pw_uid, user.pw_gid)
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}, own


def start_postgres(folder: Path) -> tuple[str, Callable[[], None]]:
    """Initialise a cluster in ``folder`` and start it; returns its URL and a function that stops it."""
    initdb, postgres = _bin("initdb"), _bin("postgres")
    folder.mkdir(parents=True, exist_ok=True)
    owner, own = _as_owner()
    home = own or folder
    data = home / "data"
    made = subprocess.run(
        [initdb, "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"],
        capture_output=True,
        text=True,
        cwd=home,
        **owner,
    )
    if made.returncode != 0:
        raise RuntimeError(f"initdb failed:\n{made.stdout}{made.stderr}")
    port = free_port()
    log = open(folder / "postgres.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            postgres,
            "-D",
            str(data),
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-k",
            str(home),  # its Unix socket here, not in the system's folder
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "full_page_writes=off",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=home,
        **owner,
    )
    ready = _bin("pg_isready")
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            log.close()
            raise RuntimeError(f"postgres exited with {proc.returncode}:\n{(folder / 'postgres.log').read_text()}")
        if subprocess.run([ready, "-h", "127.0.0.1", "-p", str(port), "-q"]).returncode == 0:
            break
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError("postgres did not accept connections within 60 s")
        time.sleep(0.1)

    def stop() -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # a fast shutdown: open sessions are ended
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        if own is not None:
            shutil.rmtree(own, ignore_errors=True)

    return f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres", stop
