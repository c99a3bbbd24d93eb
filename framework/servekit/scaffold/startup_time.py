"""How long a replica takes to start: import servekit and the plugins, load and warm up the models.

``servekit build`` sizes the Kubernetes ``startupProbe`` from it (docs/scaling.md),
so a pod still loading is neither restarted by its liveness probe nor sent
traffic.  The measurement runs in a fresh Python process, as a pod would: the
frameworks' imports count, and the build process does not keep them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

#: The longest a measurement may run before ``servekit build`` gives up on it.
TIMEOUT = 600.0


def measure(folder: Path, model_name: str, timeout: float = TIMEOUT) -> tuple[float | None, str]:
    """Seconds a server takes to make ``folder``'s models ready, or ``None`` and why not."""
    command = [sys.executable, "-m", "servekit.scaffold.startup_time", str(folder), model_name]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"the models did not load within {timeout:g} s"
    lines = done.stdout.strip().splitlines()
    try:
        found = json.loads(lines[-1]) if lines else {}
    except ValueError:
        found = {}
    if done.returncode == 0 and isinstance(found.get("seconds"), float):
        return found["seconds"], ""
    reason = found.get("error") or (done.stderr.strip().splitlines() or ["no output"])[-1]
    return None, str(reason)


def _load(folder: str, model_name: str) -> dict[str, object]:
    started = time.perf_counter()
    from servekit.server.app import create_app
    from servekit.server.settings import Settings

    app = create_app(Settings(paths=[folder], model_name=model_name, poll_interval=0), start=False)
    repository = app.extensions["servekit"].repository
    repository.load_now()
    failed = [
        f"{name} version {version}: {mv.error}"
        for name, model in repository.models.items()
        for version, mv in model.versions.items()
        if not mv.ready
    ]
    if failed or not repository.models:
        return {"error": "; ".join(failed) or "no model found"}
    return {"seconds": round(time.perf_counter() - started, 3)}


def main(argv: list[str]) -> int:
    try:
        result = _load(argv[0], argv[1])
    except Exception as exc:  # any failure: the build falls back to the default allowance
        result = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(result))
    return 0 if "seconds" in result else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
