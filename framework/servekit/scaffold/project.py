"""``servekit new`` and ``servekit build``: project templates, Dockerfiles and manifests.

The templates ship inside the package (``servekit/scaffold/templates``; the
repository's top-level ``cookiecutter/`` and ``templates/`` point there), so a
plain ``pip install servekit`` can create and containerise a model.  Every
Dockerfile and manifest comes from one Jinja source, ``templates/*.j2``, through
one renderer (:mod:`servekit.scaffold.render`) that the container cookiecutter
template also loads, so ``servekit new``, plain ``cookiecutter`` and
``servekit build`` write the same files.

A servekit that is not a published release (installed from a source tree or a
local file) is not on any package index, so ``servekit build`` puts a wheel of
it into the build context and the Dockerfile installs that wheel.
"""

from __future__ import annotations

import collections
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from servekit.folders.artifacts import is_lightgbm_text
from servekit.folders.layout import is_model_dir, version_of
from servekit.scaffold import build_failures
from servekit.scaffold import build_settings as scaffold_settings
from servekit.scaffold import render as _render
from servekit.scaffold.render import (
    BUILD_FILES,
    DEFAULT_CUDA,
    DEFAULT_PYTHON,
    DOCKER_TEMPLATES,
    MARKER,
    PIP_CERT_SECRET,
    WHEELS,
    build_file,
    needs_torch,
    render,
)
from servekit.version import __version__

__all__ = [
    "BUILD_FILES",
    "DEFAULT_CUDA",
    "DEFAULT_PYTHON",
    "DOCKER_TEMPLATES",
    "MARKER",
    "BuildOptions",
    "ScaffoldError",
    "build",
    "new_project",
    "render",
    "render_dockerfile",
    "render_manifests",
    "write_build_files",
]

TEMPLATES_ROOT = Path(__file__).parent / "templates"
CONTAINER_TEMPLATE = TEMPLATES_ROOT / "cookiecutter" / "container"
PLUGIN_TEMPLATE = TEMPLATES_ROOT / "cookiecutter" / "plugin"
#: The artifact that tells which extra a bare model folder needs (the file names each plugin loads).
_ARTIFACT_EXTRAS = (
    (("model.joblib", "model.pkl", "model.skops"), "sklearn"),
    (("model.pt", "model.pt2", "model.pth"), "torch"),
    (("saved_model.pb",), "tensorflow"),
    (("config.json",), "huggingface"),
    (("model.json", "model.ubj"), "xgboost"),
    (("model.txt",), "lightgbm"),
    (("model.onnx",), "onnx"),
    # a pyfunc model needs mlflow itself; a flavor servekit serves natively needs its own
    # library (read from the MLmodel below), and mlflow for nothing but pyfunc
    (("MLmodel",), "mlflow"),
)


class ScaffoldError(ValueError):
    """A ``servekit new`` / ``servekit build`` problem the CLI reports on one line.

    ``exit_status`` is 2 for a mistake on the command line, 1 for anything else.
    """

    def __init__(self, message: str, exit_status: int = 1):
        super().__init__(message)
        self.exit_status = exit_status


@dataclass
class BuildOptions(_render.BuildOptions):
    """:class:`servekit.scaffold.render.BuildOptions` for the servekit that runs."""

    servekit_version: str = __version__


def render_dockerfile(options: _render.BuildOptions) -> str:
    return render("Dockerfile.j2", options)


def render_manifests(options: _render.BuildOptions) -> dict[str, str]:
    """``deploy/kubernetes.yaml``, ``deploy/kserve.yaml`` and ``deploy/kserve-runtime.yaml`` for the image (and, for
    ``autoscale="hpa"``, ``deploy/prometheus-adapter.yaml``)."""
    manifests = {
        "kubernetes.yaml": render("kubernetes.yaml.j2", options),
        "kserve.yaml": render("kserve.yaml.j2", options),
        "kserve-runtime.yaml": render("kserve-runtime.yaml.j2", options),
    }
    if _render.wanted("deploy/prometheus-adapter.yaml", options):
        manifests["prometheus-adapter.yaml"] = render("prometheus-adapter.yaml.j2", options)
    return manifests


def detect_extras(folder: Path) -> list[str]:
    """servekit extras a bare model folder needs, from the artifacts in it and its version folders."""
    files = [p for p in folder.iterdir() if p.is_file()]
    for sub in folder.iterdir():
        if sub.is_dir() and sub.name.isdigit():
            files += [p for p in sub.iterdir() if p.is_file()]
    names = {p.name for p in files}
    extras = [extra for artifacts, extra in _ARTIFACT_EXTRAS if names & set(artifacts)]
    found = [("lightgbm" if is_lightgbm_text(p) else "xgboost") for p in files if p.name == "model.bst"]
    found += [flavor for p in files if p.name == "MLmodel" for flavor in _mlflow_flavors(p)]
    return extras + [e for e in dict.fromkeys(found) if e not in extras]


def _mlflow_flavors(mlmodel: Path) -> list[str]:
    """The servekit extras of an MLflow model's flavors (its framework plugin's library)."""
    import yaml

    try:
        flavors = (yaml.safe_load(mlmodel.read_text()) or {}).get("flavors") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        return []
    return [f for f in ("sklearn", "xgboost", "lightgbm", "onnx") if f in flavors]


def default_requirements(folder: Path) -> str:
    """servekit with the extras of the folder's artifacts, and ``grpc``: the image serves gRPC on 8081."""
    extras = [*detect_extras(folder), "grpc"]
    spec = f"servekit[{','.join(extras)}]"
    return f"# Written by `servekit build`: what the image installs before copying the model.\n{spec}=={__version__}\n"


def _generated(path: Path) -> bool:
    """True when ``path`` is absent or still carries servekit's header (safe to rewrite)."""
    if not path.exists():
        return True
    head = path.read_text(errors="replace")[:400]
    return MARKER in head


@dataclass
class WrittenFiles:
    written: list[Path] = field(default_factory=list)
    kept: list[Path] = field(default_factory=list)


#: Written once: the user owns them afterwards, header or not.
_WRITE_ONCE = (".dockerignore", "gunicorn.conf.py")


def write_build_files(folder: Path, options: _render.BuildOptions, *, manifests: bool = True) -> WrittenFiles:
    """Write the Dockerfile (and what it copies) into a model folder.

    Files servekit rendered before are re-rendered; a file the user wrote or
    edited (no servekit header) is kept, as are ``requirements.txt``,
    ``.dockerignore`` and ``gunicorn.conf.py`` once they exist.
    """
    result = WrittenFiles()
    requirements = folder / "requirements.txt"
    if not requirements.exists():
        requirements.write_text(default_requirements(folder))
        result.written.append(requirements)
    options.torch = options.torch or needs_torch(requirements.read_text())
    for name in BUILD_FILES:
        path = folder / name
        if (name.startswith("deploy/") and not manifests) or (name in _WRITE_ONCE and path.exists()):
            continue
        if not _render.wanted(name, options):
            continue
        if not _generated(path):
            result.kept.append(path)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(build_file(name, options))
        result.written.append(path)
    return result


# -- a wheel of an unpublished servekit -----------------------------------------------------


def installed_from() -> tuple[str, Path | None]:
    """Where the running servekit came from: ``("source", DIR)``, ``("wheel", FILE)``,
    ``("index", None)`` or ``("url", None)`` (a VCS or remote URL: nothing local to build).

    Code running from a source tree (an editable install, or ``PYTHONPATH``) is
    ``source``.  Otherwise pip's record of a direct install (PEP 610
    ``direct_url.json``) tells a local wheel file or a URL; an install from a
    package index has none.
    """
    root = Path(__file__).resolve().parents[3]  # servekit/scaffold/project.py -> the source tree
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and re.search(r'^name\s*=\s*"servekit"', pyproject.read_text(), re.MULTILINE):
        return "source", root
    try:
        text = importlib.metadata.distribution("servekit").read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        return "url", None
    if not text:
        return "index", None
    info = json.loads(text)
    url = urlparse(info.get("url", ""))
    path = Path(unquote(url.path))
    if url.scheme == "file" and path.suffix == ".whl":
        return "wheel", path
    if url.scheme == "file" and "dir_info" in info:
        return "source", path
    return "url", None


#: pyproject.toml's build-system requirement (an SPDX ``license`` string needs 77).
SETUPTOOLS_NEEDED = 77


def _setuptools_major() -> int:
    """The installed setuptools' major version (0 when absent): an older one cannot build servekit,
    so pip then builds in an isolated environment with its own."""
    try:
        return int(importlib.metadata.version("setuptools").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return 0


#: The timestamp of every file in a wheel ``servekit build`` makes (1980-01-01, the earliest a zip
#: file holds): the same source gives the same bytes, so docker keeps its dependency layer cached.
WHEEL_EPOCH = "315532800"


def build_wheel(source: Path, into: Path) -> Path:
    """``pip wheel --no-deps`` of a servekit source tree; returns the wheel, copied into ``into``.

    The wheel is reproducible (``SOURCE_DATE_EPOCH``, unless the environment sets its own), so a
    wheel built once from the same files is kept in :func:`wheel_cache` and copied from there:
    ``servekit new`` and ``servekit build`` build one only when the source changed.
    """
    if not (source / "pyproject.toml").is_file():
        raise ScaffoldError(f"servekit's source tree {source} is gone; pass --wheel PATH to a servekit wheel")
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q"]
    if _setuptools_major() >= SETUPTOOLS_NEEDED:
        command.append("--no-build-isolation")  # the build backend is here: build offline
    epoch = os.environ.get("SOURCE_DATE_EPOCH") or WHEEL_EPOCH
    names = _source_files(source)
    cache = _cache_folder(source, names, epoch) if names is not None else None
    kept = sorted(cache.glob("servekit-*.whl")) if cache is not None and cache.is_dir() else []
    if kept:
        return Path(shutil.copy2(kept[0], into / kept[0].name))
    with tempfile.TemporaryDirectory(prefix="servekit-wheel-") as tmp:
        out, tree = Path(tmp) / "dist", _source_copy(source, Path(tmp) / "src", names)
        env = {**os.environ, "SOURCE_DATE_EPOCH": epoch}
        result = subprocess.run([*command, "-w", str(out), str(tree)], capture_output=True, text=True, env=env)
        wheels = sorted(out.glob("servekit-*.whl"))
        if result.returncode != 0 or not wheels:
            last = (result.stderr.strip().splitlines() or ["no wheel written"])[-1]
            raise ScaffoldError(f"building a servekit wheel from {source} failed: {last}")
        if cache is not None:
            _keep(wheels[0], cache)
        return Path(shutil.move(str(wheels[0]), into / wheels[0].name))


_NOT_SOURCE = (".git", ".venv", "venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache")


def wheel_cache() -> Path:
    """Where built servekit wheels are kept: ``$SERVEKIT_CACHE_DIR/wheels``, else the user's cache."""
    root = os.environ.get("SERVEKIT_CACHE_DIR")
    if not root:
        root = str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "servekit")
    return Path(root) / "wheels"


def _cache_folder(source: Path, names: list[str], epoch: str) -> Path:
    """The cache's folder for the wheel of these files (their names and bytes, the build's settings)."""
    digest = hashlib.sha256(f"{sys.version_info[:2]} {_setuptools_major()} {epoch} {__version__}".encode())
    for name in sorted(names):
        path = source / name
        if path.is_symlink():
            digest.update(f"{name} -> {os.readlink(path)}\0".encode())
        elif path.is_file():
            digest.update(f"{name}\0".encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return wheel_cache() / digest.hexdigest()[:32]


def _keep(wheel: Path, folder: Path) -> None:
    """Copy a built wheel into its cache folder (atomically: another process may build the same one)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f".{wheel.name}.{os.getpid()}"
        shutil.copy2(wheel, partial)
        os.replace(partial, folder / wheel.name)
    except OSError:
        pass  # a cache that cannot be written only costs the next build


def _source_files(source: Path) -> list[str] | None:
    """The files of a git checkout: what git tracks or would track (``None`` outside git)."""
    if not (source / ".git").exists() or not shutil.which("git"):
        return None
    listed = subprocess.run(
        ["git", "-C", str(source), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        text=True,
    )
    if listed.returncode != 0:
        return None
    return [name for name in listed.stdout.split("\0") if name and os.path.lexists(source / name)]


def _source_copy(source: Path, into: Path, names: list[str] | None = None) -> Path:
    """The source tree's files without build leftovers, copied to ``into``.

    setuptools builds inside the tree it is given and keeps stale files in
    ``build/``; a copy leaves the checkout untouched and the wheel exact.  In a
    git checkout (``names``, else :func:`_source_files`) the files are what git tracks or would track.
    """
    names = names if names is not None else _source_files(source)
    if names is None:
        shutil.copytree(source, into, symlinks=True, ignore=shutil.ignore_patterns(*_NOT_SOURCE))
        return into
    for name in names:
        origin, target = source / name, into / name
        if origin.is_symlink() or origin.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, target, follow_symlinks=False)
    return into


def vendor_wheel(folder: Path, wheel: str | None) -> Path | None:
    """Put the servekit wheel the image installs into ``folder/wheels/``; ``None`` when the index has it.

    ``wheel``: a path to a wheel, ``"auto"`` (a wheel whenever servekit is not
    from an index), ``"build"`` (always one, built from the source tree) or
    ``None`` (never).
    """
    given = checked_wheel(Path(wheel)) if wheel not in (None, "auto", "build") else None
    into = folder / WHEELS
    for stale in into.glob("servekit-*.whl"):
        stale.unlink()  # only the wheel of this build stays in the context
    if wheel is None:
        return None
    origin, where = installed_from()
    if wheel == "auto" and origin == "index":
        return None
    into.mkdir(exist_ok=True)
    if given is not None:
        return Path(shutil.copy2(given, into / given.name))
    if origin == "wheel" and where is not None and where.is_file():
        return Path(shutil.copy2(where, into / where.name))
    if origin == "source" and where is not None:
        return build_wheel(where, into)
    raise ScaffoldError(
        "servekit was installed from a URL or a file that is gone, so there is no wheel of it to put "
        "in the image; pass --wheel PATH to a servekit wheel"
    )


def checked_wheel(wheel: Path) -> Path:
    """``--wheel PATH``, when it names a servekit wheel file; a usage error otherwise."""
    if not wheel.is_file() or not re.match(r"servekit-[^-]+-.*\.whl$", wheel.name):
        raise ScaffoldError(f"--wheel: expected a servekit wheel file (servekit-VERSION-....whl), found {wheel}", 2)
    return wheel


def pin_mismatch(requirements: str, wheel: str) -> str | None:
    """The servekit version ``requirements.txt`` pins when the wheel is another one (pip would refuse)."""
    version = wheel.split("-")[1]
    for line in requirements.splitlines():
        match = re.match(r"^\s*servekit\s*(?:\[[^\]]*\])?\s*==\s*([^\s;#]+)", line)
        if match and match.group(1) != version:
            return match.group(1)
    return None


# -- docker -----------------------------------------------------------------------


def docker_clients() -> list[str]:
    """Every ``docker`` executable on PATH, in PATH's order (one per file)."""
    found: dict[str, str] = {}
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidate = shutil.which("docker", path=folder) if folder else None
        if candidate is not None:
            found.setdefault(os.path.realpath(candidate), candidate)
    return list(found.values())


#: Docker's first CLI release that runs BuildKit through the buildx plugin only (before it, built in).
BUILDX_ONLY_FROM = 23


def drives_buildkit(client: str) -> bool:
    """Whether this ``docker`` client can run a BuildKit build: it has the buildx plugin, or it is
    older than Docker 23 (Debian's ``docker.io`` 20.10), whose BuildKit is built in."""
    try:
        if subprocess.run([client, "buildx", "version"], capture_output=True, timeout=20).returncode == 0:
            return True
        version = subprocess.run(
            [client, "version", "--format", "{{.Client.Version}}"], capture_output=True, text=True, timeout=20
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return False
    match = re.match(r"(\d+)\.", version)
    return match is not None and int(match.group(1)) < BUILDX_ONLY_FROM


def docker_client(buildkit: bool) -> str | None:
    """The ``docker`` to run: the first on PATH, unless the build needs BuildKit (a build secret), that one
    cannot run it (Docker 23 or later without buildx) and a later one on PATH can."""
    clients = docker_clients()
    if not clients:
        return None
    if buildkit:
        for client in clients:
            if drives_buildkit(client):
                return client
    return clients[0]


def docker_available(client: str | None = None) -> bool:
    """A Docker engine answers (``docker info`` succeeds), not merely a ``docker`` binary on PATH."""
    docker = client or shutil.which("docker")
    if docker is None:
        return False
    try:
        return subprocess.run([docker, "info"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def build_command(
    folder: Path, tag: str, settings: scaffold_settings.BuildSettings | None = None, *, shown: bool = False
) -> list[str]:
    """``docker build`` of the context with the settings' build args, pip secret and docker options.

    ``shown``: the command to print, with passwords in index URLs masked.
    """
    settings = settings or scaffold_settings.BuildSettings()
    show = scaffold_settings.masked if shown else str
    command = ["docker", "build", "--tag", tag]
    build_args: dict[str, str | None] = {}
    if settings.pip_index_url:
        build_args["PIP_INDEX_URL"] = show(settings.pip_index_url)
    if settings.pip_extra_index_urls:
        build_args["PIP_EXTRA_INDEX_URL"] = " ".join(show(u) for u in settings.pip_extra_index_urls)
    build_args.update(settings.build_args)
    for key, value in build_args.items():
        command += ["--build-arg", key if value is None else f"{key}={value}"]
    if settings.pip_cert is not None:
        command += ["--secret", f"id={PIP_CERT_SECRET},src={settings.pip_cert}"]
    return [*command, *settings.docker_args, str(folder)]


def needs_buildkit(command: list[str]) -> bool:
    """Build secrets (``--secret``, ``--ssh``) exist only in BuildKit; the classic builder refuses them."""
    return any(arg in ("--secret", "--ssh") or arg.startswith(("--secret=", "--ssh=")) for arg in command)


def untrained(folder: Path) -> bool:
    """No version folder, and a project's ``train.py`` (or no model at all) at the top: the image
    would never become ready.  A repository (a folder of model folders) has its models below."""
    entries = list(folder.iterdir())
    if any(version_of(e) is not None for e in entries):
        return False
    if (folder / "train.py").is_file():
        return True  # a project from `servekit new`: train.py writes 1/
    if any(e.is_file() and _is_model_file(e.name) for e in entries):
        return False
    folders = [e for e in entries if e.is_dir() and not e.name.startswith(".") and e.name not in _NOT_MODEL_FOLDERS]
    return not any(is_model_dir(e) for e in folders)


#: Files of a project that belong to its build or its docs, not to its model.
_NOT_MODEL_FILES = {"Dockerfile", "servekit.yaml", "gunicorn.conf.py", "requirements.txt"}
_NOT_MODEL_FOLDERS = {"deploy", "requests", "tests", WHEELS, "__pycache__"}


def _is_model_file(name: str) -> bool:
    if name in _NOT_MODEL_FILES or name.startswith(".") or name.endswith((".md", ".txt")):
        return False
    return name == "model.py" or not name.endswith(".py")


def lacks_grpc(requirements: str) -> bool:
    """``requirements.txt`` installs servekit without its ``grpc`` extra (so port 8081 would stay off)."""
    for line in requirements.splitlines():
        match = re.match(r"^\s*servekit\s*\[([^\]]*)\]", line.split("#", 1)[0])
        if match and {e.strip() for e in match.group(1).split(",")} & {"grpc", "all"}:
            return False
    return True


def _with_wheel(options: _render.BuildOptions, wheel: Path | None) -> _render.BuildOptions:
    options.servekit_wheel = wheel.name if wheel is not None else None
    return options


def _report(folder: Path, files: WrittenFiles, vendored: Path | None, echo) -> None:
    """What was written and kept, and one line for each choice that breaks the image."""
    if vendored is not None:
        echo(f"wrote {vendored.relative_to(folder)} (the image installs servekit from it)")
        pinned = pin_mismatch((folder / "requirements.txt").read_text(), vendored.name)
        if pinned:
            echo(
                f"warning: requirements.txt pins servekit=={pinned} but the wheel is {vendored.name}; "
                "pip will refuse both: change the pin"
            )
        if folder / "Dockerfile" in files.kept and vendored.name not in (folder / "Dockerfile").read_text():
            echo(f"warning: your Dockerfile does not install {WHEELS}/{vendored.name}")
    if lacks_grpc((folder / "requirements.txt").read_text()):
        echo(
            "warning: requirements.txt installs servekit without the grpc extra, so the image serves no gRPC "
            "on 8081: add grpc to its extras, e.g. servekit[sklearn,grpc]"
        )
    for path in files.written:
        echo(f"wrote {path.relative_to(folder)}")
    for path in files.kept:
        echo(f"kept {path.relative_to(folder)} (edited by you; delete it to regenerate)")


def build(
    folder: Path,
    options: _render.BuildOptions,
    *,
    run_docker: bool | None = None,
    wheel: str | None = "auto",
    settings: scaffold_settings.BuildSettings | None = None,
    echo=print,
) -> int:
    """``servekit build``: the build context (wheel, Dockerfile, manifests), then ``docker build``.

    ``run_docker=False`` writes the context only; ``None`` builds when an engine
    answers and fails with one line when none does.  An untrained project (no
    version folder) is refused before docker runs, and is one warning line otherwise.
    """
    folder = folder.resolve()
    if not folder.is_dir():
        raise ScaffoldError(f"not a folder: {folder}", 2)
    settings = settings or scaffold_settings.BuildSettings()
    options.pip_cert = settings.pip_cert is not None
    if untrained(folder):
        problem = f"{folder} holds no trained version (no 1/, 2/... folder): the image would never become ready"
        fix = "; run `python train.py` first" if (folder / "train.py").is_file() else ""
        if run_docker is not False:
            raise ScaffoldError(problem + fix)
        echo(f"warning: {problem}{fix}")
    vendored = vendor_wheel(folder, wheel)
    files = write_build_files(folder, _with_wheel(options, vendored))
    _report(folder, files, vendored, echo)
    command = build_command(folder, options.image_ref, settings)
    shown = " ".join(build_command(folder, options.image_ref, settings, shown=True))
    if run_docker is False:
        echo("build context ready; build it with:  " + shown)
        return 0
    client = docker_client(needs_buildkit(command))
    if not docker_available(client):
        raise ScaffoldError(
            "no Docker engine answered (`docker info` failed), so no image was built; the build context is "
            f"written: run `{shown}` where Docker runs, or pass --context-only"
        )
    clients = docker_clients()
    first = clients[0] if clients else client
    if client is not None and client != first:
        echo(f"{first} cannot run BuildKit (no buildx plugin), which --pip-cert's build secret needs: using {client}")
        command[0], shown = client, client + shown.removeprefix("docker")
    env = dict(os.environ)
    if needs_buildkit(command) and "DOCKER_BUILDKIT" not in env:
        env["DOCKER_BUILDKIT"] = "1"  # the classic builder has no build secrets
        shown = "DOCKER_BUILDKIT=1 " + shown
    echo("$ " + shown)
    attempt = build_failures.Attempt(
        pip_cert=settings.pip_cert is not None,
        host_network=any(re.fullmatch(r"--net(work)?(=| )host", a) for a in _joined(settings.docker_args)),
        base_image=options.base_image,
        buildkit_secret=needs_buildkit(command),
    )
    return run_docker_build(command, env, attempt, echo)


def _joined(args: list[str]) -> list[str]:
    """``["--network", "host"]`` as ``["--network host"]``, so one pattern reads either spelling."""
    return [" ".join(args[i : i + 2]) if args[i] in ("--network", "--net") else args[i] for i in range(len(args))]


#: Lines of Docker's output kept to diagnose a failure (pip's errors come last).
KEPT_LINES = 4000


def run_docker_build(command: list[str], env: dict[str, str], attempt: build_failures.Attempt, echo=print) -> int:
    """Run ``docker build``, relaying its output line by line; a failure Docker or pip explain in a
    known way ends with one line naming the ``servekit build`` option that fixes it."""
    kept: collections.deque[str] = collections.deque(maxlen=KEPT_LINES)
    with subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            echo(line.rstrip("\n"))
            kept.append(line)
    if proc.returncode != 0:
        fix = build_failures.diagnose("".join(kept), attempt)
        if fix is not None:
            print(f"servekit build: {fix}", file=sys.stderr, flush=True)
    return proc.returncode


# -- cookiecutter -------------------------------------------------------------------


def new_project(
    output_dir: Path,
    *,
    plugin: bool = False,
    no_input: bool = False,
    extra_context: dict[str, Any] | None = None,
    overwrite: bool = False,
    wheel: str | None = "auto",
) -> Path:
    """Run the container (or ``plugin``) cookiecutter template; returns the new project's folder.

    ``extra_context`` is checked against the template's variables first
    (:class:`ScaffoldError`, exit status 2), so a typo or an unknown choice is
    one line, not cookiecutter's traceback.

    A container project is self-contained: when servekit is not from a package
    index (``wheel="auto"``; see :func:`vendor_wheel` for the other values), the
    wheel of this servekit (which holds the first-party plugins too) goes into
    ``wheels/`` and ``requirements.txt`` finds it there (``--find-links wheels``),
    so ``pip install -r requirements.txt`` works in a fresh virtualenv and the
    image installs the same file.
    """
    from cookiecutter.main import cookiecutter

    template = PLUGIN_TEMPLATE if plugin else CONTAINER_TEMPLATE
    answers = dict(extra_context or {})
    check_answers(template, answers)
    carries_wheel = not plugin and wheel is not None and (wheel != "auto" or installed_from()[0] != "index")
    internal = {"_servekit_version": __version__}
    if not plugin:
        internal["_wheels"] = WHEELS if carries_wheel else ""
    created = Path(
        cookiecutter(
            str(template),
            no_input=no_input,
            extra_context={**internal, **answers},
            output_dir=str(output_dir),
            overwrite_if_exists=overwrite,
            default_config=True,
        )
    )
    if carries_wheel:
        vendor_wheel(created, wheel)
    return created


_BOOLEAN = ("1", "true", "t", "yes", "y", "on", "0", "false", "f", "no", "n", "off")


def check_answers(template: Path, answers: dict[str, Any]) -> None:
    """Refuse ``--set`` keys the template does not ask for, and values its choices do not allow."""
    variables = json.loads((template / "cookiecutter.json").read_text())
    public = [k for k in variables if not k.startswith("_")]
    for key, value in answers.items():
        if key not in public:
            raise ScaffoldError(f"--set {key}: no such template variable; expected one of {', '.join(public)}", 2)
        default = variables[key]
        if isinstance(default, list) and value not in default:
            raise ScaffoldError(f"--set {key}={value}: expected one of {', '.join(default)}", 2)
        if isinstance(default, bool) and str(value).strip().lower() not in _BOOLEAN:
            raise ScaffoldError(f"--set {key}={value}: expected yes or no", 2)
