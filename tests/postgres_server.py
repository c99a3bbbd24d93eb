"""A PostgreSQL of the test's own: ``start_postgres(folder) -> (url, stop)``.

``initdb`` and ``postgres`` from Debian's ``postgresql`` package on 127.0.0.1, a
free port, trust authentication, durability off (a test's data is thrown
away).  PostgreSQL refuses to run as root: as root the cluster belongs to the
package's ``postgres`` user, in a folder of that user's.  A test that needs it
is skipped, with the reason, where PostgreSQL is not installed.

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


def _program(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or [shutil.which(name) or ""]
    if not found[-1]:
        pytest.skip("PostgreSQL is not installed (Debian: apt-get install -y postgresql; scripts/test.sh does as root)")
    return found[-1]


def _runs_as() -> tuple[dict[str, Any], Path | None]:
    """``subprocess`` arguments that run PostgreSQL as a user it accepts, and, as root, that user's folder."""
    if os.geteuid() != 0:
        return {}, None
    try:
        user = pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("running as root, and there is no 'postgres' user for PostgreSQL to run as")
    home = Path(tempfile.mkdtemp(prefix="servekit-pg-"))
    os.chown(home, user.pw_uid, user.pw_gid)
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}, home


def start_postgres(folder: Path) -> tuple[str, Callable[[], None]]:
    """A new cluster, started; returns its URL and the function that stops it (and removes it)."""
    folder.mkdir(parents=True, exist_ok=True)
    owner, own = _runs_as()
    home = own or folder
    made = subprocess.run(
        [_program("initdb"), "-D", str(home / "data"), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"],
        capture_output=True,
        text=True,
        cwd=home,
        **owner,
    )
    if made.returncode != 0:
        raise RuntimeError(f"initdb failed:\n{made.stdout}{made.stderr}")
    port = free_port()
    log = open(folder / "postgres.log", "w")  # noqa: SIM115 - the server writes to it for its whole life
    settings = ["fsync=off", "synchronous_commit=off", "full_page_writes=off", "max_connections=200"]
    command = [_program("postgres"), "-D", str(home / "data"), "-h", "127.0.0.1", "-p", str(port), "-k", str(home)]
    for setting in settings:
        command += ["-c", setting]
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=home, **owner)
    deadline = time.monotonic() + 60
    while subprocess.run([_program("pg_isready"), "-h", "127.0.0.1", "-p", str(port), "-q"]).returncode != 0:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            log.close()
            raise RuntimeError(f"postgres did not start:\n{(folder / 'postgres.log').read_text()}")
        time.sleep(0.1)

    def stop() -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # fast shutdown: open sessions are ended
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        if own is not None:
            shutil.rmtree(own, ignore_errors=True)

    return f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres", stop
