"""Headless Chromium driven over the DevTools protocol: load a page, evaluate JavaScript, screenshot.

Real time passes (unlike ``--virtual-time-budget``), so a page that polls the
server shows what the server did meanwhile.  The test skips when Debian's
``chromium`` is missing (scripts/test.sh installs it when run as root).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
)


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if not found:
        pytest.skip(
            "headless Chromium is not installed (Debian: apt-get install -y chromium; "
            "scripts/test.sh installs it when run as root)"
        )
    return found


class Browser:
    """One Chromium with one page; ``evaluate`` and ``screenshot`` talk to that page."""

    def __init__(self, profile: Path, url: str, size: tuple[int, int] = (1280, 1000)):
        self.proc = subprocess.Popen(
            [chromium(), *FLAGS, f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}", url],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._ids = itertools.count(1)
        port = self._devtools_port()
        deadline = time.monotonic() + 30
        while True:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as r:
                pages = [t for t in json.load(r) if t.get("type") == "page"]
            if pages or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        self.ws_url = pages[0]["webSocketDebuggerUrl"]

    def _devtools_port(self) -> int:
        assert self.proc.stderr is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line and self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode}")
            found = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            if found:
                return int(found[1])
        raise TimeoutError("chromium did not open its DevTools port")

    async def _call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        import aiohttp

        async with aiohttp.ClientSession() as session, session.ws_connect(self.ws_url, max_msg_size=0) as ws:
            number = next(self._ids)
            await ws.send_json({"id": number, "method": method, "params": params})
            async for message in ws:
                reply = json.loads(message.data)
                if reply.get("id") == number:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply["result"]
        raise RuntimeError(f"{method}: the DevTools connection closed")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        return asyncio.run(self._call(method, params))

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, target: Path) -> bytes:
        data = base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        return data

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
