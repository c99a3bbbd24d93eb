"""Where one servekit worker spends its time under load: py-spy samples, summed per function.

bench/run.py calls :func:`profile_worker` while ``wrk`` drives the server: it
picks the busiest worker of the process tree, records it with
``py-spy record --gil -f raw --function`` (folded stacks, one
``frame;frame;... N`` line per distinct stack) and sums the samples two ways:

- **own time**: the innermost frame of each sample, where the CPU actually was;
- **cumulative**: every frame on the stack, each counted once per sample, kept
  for servekit's own modules (``servekit/`` and ``servekit_*/`` files) to show
  which layer the time goes through.

``--gil`` keeps only the samples where a thread of the worker holds the GIL: the
Python work that serialises a worker.  Without it, threads parked in the
thread pool's queue or waiting for the GIL count as busy (py-spy's idle
detection misses them while it pauses the process), which buries the signal;
C work that releases the GIL (socket writes) is left out instead.  The share of
ticks with a sample is how busy the GIL was.

py-spy needs ptrace rights on the worker (root, or ``kernel.yama.ptrace_scope``
0 for the same user); a failure comes back as ``{"error": ...}`` for the report,
never as an exception.
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from pathlib import Path

RATE_HZ = 200
SERVEKIT_FRAME = re.compile(r"\((?:\S*/)?servekit(?:_\w+)?/")


def busiest_child(root: int, pids: list[int]) -> int | None:
    """The descendant of ``root`` with the most CPU time so far: a worker that has been serving."""
    best, best_ticks = None, -1
    for pid in pids:
        if pid == root:
            continue
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks = int(fields[11]) + int(fields[12])  # utime + stime
        if ticks > best_ticks:
            best, best_ticks = pid, ticks
    return best


def record(py_spy: str, pid: int, seconds: int, out: Path) -> str | None:
    """Run py-spy on ``pid``; None when it worked, else why not."""
    if not Path(py_spy).exists():
        return f"py-spy not found at {py_spy} (run without --skip-install to create bench/.venvs/tools)"
    cmd = [
        py_spy,
        "record",
        "--pid",
        str(pid),
        "-d",
        str(seconds),
        "-r",
        str(RATE_HZ),
        "--gil",
        "-f",
        "raw",
        "--function",
        "-o",
        str(out),
    ]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"py-spy did not run: {exc}"
    if done.returncode != 0 or not out.exists():
        return f"py-spy exited {done.returncode}: {' '.join((done.stderr or done.stdout).split())[-400:]}"
    return None


def summarise(folded: str, top: int = 15) -> dict:
    """Own and cumulative samples per function from py-spy's folded stacks."""
    own: Counter[str] = Counter()
    cumulative: Counter[str] = Counter()
    total = 0
    for line in folded.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        total += n
        own[frames[-1]] += n
        for frame in set(frames):
            if SERVEKIT_FRAME.search(frame):
                cumulative[frame] += n

    def table(counter: Counter[str]) -> list[list]:
        return [[frame, n, round(100 * n / total, 1)] for frame, n in counter.most_common(top)]

    return {"samples": total, "own": table(own), "servekit_cumulative": table(cumulative)}


def profile_worker(py_spy: str, root: int, pids: list[int], seconds: int, out: Path) -> dict:
    """Record the busiest worker under ``root`` for ``seconds``; the summary, or ``{"error": ...}``."""
    pid = busiest_child(root, pids)
    if pid is None:
        return {"error": "no worker process found under the server"}
    failed = record(py_spy, pid, seconds, out)
    if failed:
        return {"error": failed, "pid": pid}
    return {"pid": pid, "seconds": seconds, "rate_hz": RATE_HZ, **summarise(out.read_text())}
