"""Processes the suite starts: waited for until they answer, and ended as a crash would end them."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import requests


def wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    """Until ``url``'s ``/v2/health/ready`` answers 200; the log's end if ``proc`` exits or time runs out.

    A server started by hand (a command, not :class:`servekit.testing.ServerProcess`): a refused
    connection is a server not listening yet, and a read timeout one whose first worker is still
    starting (gunicorn's master listens before it forks, and on a loaded machine a worker's start
    takes more than the two seconds each try waits).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited with {proc.returncode}:\n{log.read_text()[-5000:]}")
        try:
            if requests.get(url + "/v2/health/ready", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"not ready after {timeout} s:\n{log.read_text()[-5000:]}")


def parent_of(pid: int) -> int:
    """The parent process id of ``pid``, from ``/proc/PID/stat`` (after the command's closing parenthesis)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def kill_tree(root: int) -> list[int]:
    """SIGKILL ``root`` and every process under it, all at once (as when a container dies); their ids."""
    tree = [root]
    for pid in tree:
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                if parent_of(int(stat.parent.name)) == pid:
                    tree.append(int(stat.parent.name))
            except (OSError, IndexError, ValueError):
                pass
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return tree
