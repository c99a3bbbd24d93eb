"""A Docker engine of the test session's own, and a local Debian base image for it.

Nothing here touches a system daemon or pulls from a registry:

- :func:`docker_daemon` starts ``containerd`` and ``dockerd`` (Debian's
  ``docker.io``) with their own state, sockets and data root under a temporary
  folder, ``--bridge=none --iptables=false``: builds and containers use the
  host's network (``--network host``) and are reached on 127.0.0.1 only.  It
  stops both at the end.
- :func:`base_image` makes a small Debian image from Debian's packages
  (``debootstrap`` of the running release with ``python3``, ``python3-venv`` and
  ``python3-pip``), caches its root file system as a tarball under the
  repository's git-ignored ``.cache/`` and ``docker import``s it.

Each step that cannot run here (not root, no ``dockerd``, no ``debootstrap``, a
daemon that does not start) raises :class:`Unavailable` with the reason, which
the tests turn into a skip.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from repo_paths import REPO as ROOT

CACHE = ROOT / ".cache" / "docker"
RELEASE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("python3", "python3-venv", "python3-pip", "ca-certificates")
BASE_TAG = f"servekit-test/debian-python:{RELEASE}"
#: Debian's client (the docker.io package), which drives the daemon's built-in BuildKit.
DEBIAN_CLIENT = Path("/usr/bin/docker")


class Unavailable(RuntimeError):
    """Docker cannot run here; the message says why (a test skips with it)."""


@dataclass
class Daemon:
    """A running engine: its socket, the client to drive it and the environment that points there."""

    host: str
    client: str
    bin_dir: Path
    log: Path

    @property
    def env(self) -> dict[str, str]:
        """``os.environ`` with ``docker`` on PATH being this client and ``DOCKER_HOST`` this engine."""
        return {
            **os.environ,
            "DOCKER_HOST": self.host,
            "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        }

    def docker(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([self.client, *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)} failed: {result.stdout[-2000:]}{result.stderr[-3000:]}")
        return result


def _needs(*programs: str) -> None:
    if os.name != "posix" or os.geteuid() != 0:
        raise Unavailable("starting a Docker daemon needs root (the test runs its own dockerd)")
    for program in programs:
        if shutil.which(program) is None and not Path("/usr/sbin", program).exists():
            raise Unavailable(f"{program} is not installed (Debian: apt-get install docker.io debootstrap)")


def _which(program: str) -> str:
    return shutil.which(program) or str(Path("/usr/sbin", program))


def _client() -> str:
    if DEBIAN_CLIENT.is_file():
        return str(DEBIAN_CLIENT)
    found = shutil.which("docker")
    if found is None:
        raise Unavailable("no docker client is installed (Debian: apt-get install docker.io)")
    return found


def _stop(proc: subprocess.Popen[bytes], grace: float = 20) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def _wait_for(path: Path, proc: subprocess.Popen[bytes], log: Path, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            raise Unavailable(f"{what} exited ({proc.returncode}): {' | '.join(tail)}")
        if path.exists():
            return
        time.sleep(0.2)
    raise Unavailable(f"{what} did not open {path.name} within {timeout:.0f} s")


@contextlib.contextmanager
def docker_daemon() -> Iterator[Daemon]:
    """containerd + dockerd of this session's own under a temporary folder, stopped at the end."""
    _needs("dockerd", "containerd")
    client = _client()
    with tempfile.TemporaryDirectory(prefix="servekit-docker-") as tmp:
        top = Path(tmp)
        for name in ("containerd", "containerd-state", "data", "exec", "bin"):
            (top / name).mkdir()
        # sockets live in a short path of their own (unix socket paths are limited to 108 bytes)
        run = Path(tempfile.mkdtemp(prefix="sk-d-", dir="/run" if os.access("/run", os.W_OK) else None))
        containerd_sock, docker_sock = run / "containerd.sock", run / "docker.sock"
        config = top / "containerd.toml"
        config.write_text(
            "version = 2\n"
            f'root = "{top / "containerd"}"\n'
            f'state = "{top / "containerd-state"}"\n'
            'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
            f'[grpc]\n  address = "{containerd_sock}"\n'
            f'[ttrpc]\n  address = "{containerd_sock}.ttrpc"\n'
            f'[debug]\n  address = "{run / "containerd-debug.sock"}"\n'
            '[metrics]\n  address = ""\n'
        )
        (top / "bin" / "docker").symlink_to(client)
        log = top / "dockerd.log"
        procs: list[subprocess.Popen[bytes]] = []
        try:
            with (top / "containerd.log").open("wb") as sink:
                procs.append(
                    subprocess.Popen(
                        [_which("containerd"), "--config", str(config)], stdout=sink, stderr=subprocess.STDOUT
                    )
                )
            _wait_for(containerd_sock, procs[0], top / "containerd.log", "containerd")
            with log.open("wb") as sink:
                procs.append(
                    subprocess.Popen(
                        [
                            _which("dockerd"),
                            "--bridge=none",
                            "--iptables=false",
                            "--ip6tables=false",
                            "--ip-masq=false",
                            "--containerd",
                            str(containerd_sock),
                            "--data-root",
                            str(top / "data"),
                            "--exec-root",
                            str(top / "exec"),
                            "--pidfile",
                            str(top / "dockerd.pid"),
                            "-H",
                            f"unix://{docker_sock}",
                        ],
                        stdout=sink,
                        stderr=subprocess.STDOUT,
                    )
                )
            _wait_for(docker_sock, procs[1], log, "dockerd")
            daemon = Daemon(host=f"unix://{docker_sock}", client=client, bin_dir=top / "bin", log=log)
            deadline = time.monotonic() + 60
            while daemon.docker("info", check=False, timeout=30).returncode != 0:
                if time.monotonic() > deadline or procs[1].poll() is not None:
                    raise Unavailable(f"dockerd does not answer: {log.read_text(errors='replace')[-500:]}")
                time.sleep(0.5)
            yield daemon
        finally:
            for proc in reversed(procs):
                _stop(proc)
            shutil.rmtree(run, ignore_errors=True)
            _unmount_under(top)  # what the daemon left mounted (its network namespace, overlays)


def _unmount_under(top: Path) -> None:
    """Unmount every mount below ``top``, deepest first, so the folder can be removed."""
    try:
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return
    for point in sorted((m for m in mounts if m.startswith(f"{top}/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


def _base_key() -> str:
    return hashlib.sha256(" ".join((RELEASE, MIRROR, *PACKAGES)).encode()).hexdigest()[:12]


def base_tarball(cache: Path = CACHE) -> Path:
    """The root file system of a Debian image with Python (built once with debootstrap, then cached)."""
    tarball = cache / f"debian-{RELEASE}-python-{_base_key()}.tar"
    if tarball.is_file():
        return tarball
    _needs("debootstrap")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="servekit-rootfs-", dir=cache) as tmp:
        rootfs = Path(tmp) / "rootfs"
        log = Path(tmp) / "debootstrap.log"
        with log.open("wb") as sink:
            result = subprocess.run(
                [
                    _which("debootstrap"),
                    "--variant=minbase",
                    f"--include={','.join(PACKAGES)}",
                    RELEASE,
                    str(rootfs),
                    MIRROR,
                ],
                stdout=sink,
                stderr=subprocess.STDOUT,
                timeout=1200,
            )
        if result.returncode != 0:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            raise Unavailable(f"debootstrap of {RELEASE} failed: {' | '.join(tail)}")
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for item in (rootfs / leftover).glob("*"):
                if item.is_file():
                    item.unlink()
        partial = tarball.with_suffix(".partial")
        subprocess.run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(partial), "."], check=True)
        partial.rename(tarball)
    return tarball


def base_image(daemon: Daemon, cache: Path = CACHE) -> str:
    """Import the cached Debian root file system into ``daemon`` as :data:`BASE_TAG`; returns the tag."""
    tarball = base_tarball(cache)
    daemon.docker("import", "--change", "ENV LANG=C.UTF-8", str(tarball), BASE_TAG, timeout=300)
    return BASE_TAG
