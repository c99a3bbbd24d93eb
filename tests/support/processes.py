"""Processes the suite starts, ended as a crash would end them."""

from __future__ import annotations

import os
import signal
from pathlib import Path


def kill_tree(root: int) -> list[int]:
    """SIGKILL ``root`` and every process under it, all at once (as when a container dies); their ids."""
    tree = [root]
    for pid in tree:
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    tree.append(int(stat.parent.name))
            except (OSError, IndexError, ValueError):
                pass
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return tree
