"""Model folders, versions, labels and policies, loading and file-system polling.

The layout is TF Serving's: ``BASE/NAME/VERSION/<artifact>``.  A model folder
without numeric sub-folders is served as version 1; a folder holding only
sub-folders is a repository of models.  Each worker process keeps its own
repository and polls the disk: a new version is loaded before the version it
replaces is unloaded, so no request fails during a reload, and a version that
fails to load leaves the previous one serving.
"""

from __future__ import annotations

import enum
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pluggy

from . import hosts, plugins
from .config import ConfigError, read_model_config, select_versions
from .errors import BadRequest, NotFound, NotReady, UnknownModel
from .types import BatchingConfig, ModelConfig, ModelMetadata

log = logging.getLogger("servekit.repository")

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_IGNORED_FILES = re.compile(r"^(\..*|README.*|LICENSE.*|.*\.md|.*\.txt)$", re.IGNORECASE)


class State(str, enum.Enum):
    """TF Serving's ModelVersionStatus.State."""

    UNKNOWN = "UNKNOWN"
    START = "START"
    LOADING = "LOADING"
    AVAILABLE = "AVAILABLE"
    UNLOADING = "UNLOADING"
    END = "END"


@dataclass
class ModelVersion:
    name: str
    version: int
    path: Path
    config: ModelConfig
    state: State = State.START
    error: str = ""
    model: Any = None
    hooks: Any = None  # the model's hook relay: the plugin that loaded it, its model.py, wrappers
    loaded_by: str | None = None  # the registered name of the plugin whose ``load`` answered
    metadata: ModelMetadata = field(default_factory=ModelMetadata)
    load_seconds: float = 0.0
    fingerprint: float = 0.0  # newest mtime in the folder when the load was tried
    host: Any = None  # servekit.hosts.client.HostClient when the version runs in model host processes
    batcher: Any = None  # servekit.batching: made on the first predict (batching.batcher_for)

    @property
    def ready(self) -> bool:
        return self.state is State.AVAILABLE


@dataclass
class Model:
    name: str
    base_path: Path
    versioned: bool  # False: the folder itself is version 1
    config: ModelConfig = field(default_factory=ModelConfig)
    config_error: str = ""
    versions: dict[int, ModelVersion] = field(default_factory=dict)
    unloaded: bool = False  # unloaded through the repository API
    # labels already warned about: label -> (its version, the versions serving then)
    dangling_labels: dict[str, tuple[int, tuple[int, ...]]] = field(default_factory=dict)

    def available(self) -> list[ModelVersion]:
        return sorted((v for v in self.versions.values() if v.ready), key=lambda v: v.version)


def valid_name(name: str) -> bool:
    return bool(_NAME_RE.match(name)) and ".." not in name


def _version_of(entry: Path) -> int | None:
    if entry.is_dir() and entry.name.isascii() and entry.name.isdigit() and int(entry.name) > 0:
        return int(entry.name)
    return None


def is_model_dir(path: Path) -> bool:
    """A model folder holds numeric version folders or artifact files; a repository holds neither."""
    for entry in path.iterdir():
        if _version_of(entry) is not None:
            return True
        if entry.is_file() and not _IGNORED_FILES.match(entry.name):
            return True
    return False


def discover(paths: list[Path], model_name: str | None = None) -> dict[str, Path]:
    """Model names and folders from the paths given on the command line."""
    found: dict[str, Path] = {}
    for path in paths:
        path = Path(path)
        if not path.is_dir():
            raise ConfigError(f"model path not found: {path}")
        folders = (
            [path]
            if is_model_dir(path)
            else sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
        )
        for folder in folders:
            name = folder.name
            if name in found:
                raise ConfigError(f"two model folders are named {name!r}: {found[name]} and {folder}")
            found[name] = folder
    if model_name:
        if len(found) != 1:
            raise ConfigError(f"--model-name names one model, but {len(found)} model folders were found")
        found = {model_name: next(iter(found.values()))}
    for name in found:
        if not valid_name(name):
            raise ConfigError(f"invalid model name {name!r}: use letters, digits, '.', '_' and '-'")
    return found


def _fingerprint(path: Path) -> float:
    try:
        return max([path.stat().st_mtime] + [p.stat().st_mtime for p in path.iterdir()])
    except OSError:
        return 0.0


class ModelRepository:
    """Every served model and its versions, in one worker process."""

    def __init__(
        self,
        folders: dict[str, Path],
        pm: pluggy.PluginManager,
        *,
        poll_interval: float = 1.0,
        batching: BatchingConfig | None = None,
    ):
        self.pm = pm
        self.poll_interval = poll_interval
        self.batching = batching or BatchingConfig()
        self.models: dict[str, Model] = {}
        for name, folder in folders.items():
            versioned = any(_version_of(e) is not None for e in folder.iterdir())
            self.models[name] = Model(name, folder, versioned)
        self._lock = threading.RLock()
        # one sync at a time: the polling thread and the repository API
        self._sync_lock = threading.Lock()
        self._first_load_done = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._managers: dict[Path, pluggy.PluginManager] = {}

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> None:
        """Load every model in the background, then keep polling the disk."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="servekit-repository", daemon=True)
            self._thread.start()

    def load_now(self) -> None:
        """Load every model in this thread (tests, ``--preload``)."""
        self.sync()
        self._first_load_done.set()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        try:
            self.sync()
        finally:
            self._first_load_done.set()
        while not self._stop.wait(self.poll_interval if self.poll_interval > 0 else 3600):
            if self.poll_interval > 0:
                try:
                    self.sync()
                except Exception:  # polling must never die
                    log.exception("polling the model folders failed")

    @property
    def ready(self) -> bool:
        """Every model has finished its first load attempt, succeeded or failed."""
        return self._first_load_done.is_set()

    def readiness(self, strict: bool = True) -> tuple[bool, str]:
        """Whether this repository should receive traffic, and why not ("" when it should).

        Both modes need every first load finished and one model AVAILABLE (a
        server with nothing to serve is not ready).  ``strict`` (Triton's
        ``--strict-readiness``) also needs every model AVAILABLE, so a container
        whose model failed gets no traffic; a model unloaded on purpose through
        the repository API is not counted against it.
        """
        if not self.ready:
            return False, "models are still loading"
        down = sorted(m.name for m in self.models.values() if not m.available())
        if len(down) == len(self.models):
            return False, f"no model has an AVAILABLE version ({', '.join(down) or 'none is served'})"
        failing = [name for name in down if not self.models[name].unloaded]
        if strict and failing:
            return False, (
                f"model(s) without an AVAILABLE version: {', '.join(failing)} (--no-strict-readiness serves the others)"
            )
        return True, ""

    def wait_ready(self, timeout: float | None = None) -> bool:
        return self._first_load_done.wait(timeout)

    # -- polling -----------------------------------------------------------

    def sync(self) -> None:
        with self._sync_lock:
            for model in list(self.models.values()):
                if not model.unloaded:
                    self._sync_model(model)

    def _on_disk(self, model: Model) -> dict[int, Path]:
        if not model.base_path.is_dir():
            return {}
        if not model.versioned:
            versioned = {v: e for e in model.base_path.iterdir() if (v := _version_of(e)) is not None}
            return versioned or {1: model.base_path}
        return {v: e for e in model.base_path.iterdir() if (v := _version_of(e)) is not None}

    def _sync_model(self, model: Model) -> None:
        try:
            model.config = read_model_config(model.base_path, self.batching)
            model.config_error = ""
        except ConfigError as exc:
            model.config_error = str(exc)
        on_disk = self._on_disk(model)
        if model.config_error:
            wanted = sorted(on_disk)[-1:]
        else:
            wanted = select_versions(model.config.version_policy, list(on_disk))
        for version in wanted:
            current = model.versions.get(version)
            fingerprint = _fingerprint(on_disk[version])
            if current is None or (current.state is State.END and current.fingerprint != fingerprint):
                self._load_version(model, version, on_disk[version], fingerprint)
        # Unload what is no longer wanted, but keep serving until every wanted
        # version is up: a broken new version must not take the old one away.
        wanted_up = all(model.versions[v].ready for v in wanted if v in model.versions)
        for version, mv in list(model.versions.items()):
            if version in wanted:
                continue
            if version not in on_disk or wanted_up or not mv.ready:
                self._unload_version(model, mv)
        self._warn_dangling_labels(model, on_disk)

    def _warn_dangling_labels(self, model: Model, on_disk: dict[int, Path]) -> None:
        """Warn when a label points at a version that is not serving, once per change.

        Called after every sync (the first load, each poll, the repository API).
        A label already warned about stays quiet until its version or the
        versions serving change, so a poll every second does not repeat it.
        """
        serving = tuple(mv.version for mv in model.available())
        dangling = {label: (v, serving) for label, v in model.config.labels.items() if v not in serving}
        for label, (version, _) in sorted(dangling.items()):
            if model.dangling_labels.get(label) == dangling[label]:
                continue
            if version in model.versions:
                why = f"it is in state {model.versions[version].state.value}"
            elif version in on_disk:
                why = f"version_policy {model.config.version_policy!r} does not load it"
            else:
                why = "there is no such version folder"
            log.warning(
                "model %s: label %r points at version %d, which is not loaded (%s; serving: %s); "
                "requests for the label fail until it is",
                model.name,
                label,
                version,
                why,
                ", ".join(map(str, serving)) or "none",
            )
        model.dangling_labels = dangling

    def _load_version(self, model: Model, version: int, path: Path, fingerprint: float) -> None:
        mv = ModelVersion(model.name, version, path, model.config, State.LOADING, fingerprint=fingerprint)
        with self._lock:
            previous = model.versions.get(version)
            model.versions[version] = mv if previous is None or not previous.ready else previous
        if model.config_error:
            self._fail(mv, model.config_error)
        else:
            started = time.perf_counter()
            try:
                placement, replicas = hosts.placement_of(model.config)
                if placement == "process":  # loaded once, in host processes (servekit.hosts)
                    hosts.attach(mv, self.pm, self.batching, replicas)
                    mv.load_seconds = time.perf_counter() - started
                    mv.state = State.AVAILABLE
                    log.info("loaded %s version %d in %d model host(s)", model.name, version, replicas)
                    with self._lock:
                        model.versions[version] = mv
                    return
                self._load_here(model, mv)
                mv.load_seconds = time.perf_counter() - started
                mv.state = State.AVAILABLE
                log.info(
                    "loaded %s version %d in %.2fs (plugin %s)", model.name, version, mv.load_seconds, mv.loaded_by
                )
            except Exception as exc:
                self._fail(mv, _clean(_describe_error(exc), model.base_path), exc)
        with self._lock:
            model.versions[version] = mv

    def _load_here(self, model: Model, mv: ModelVersion) -> None:
        """Load ``mv`` in this process; its hooks then go to the plugin whose ``load`` answered.

        That plugin, the folder's ``model.py`` and the wrappers make the
        version's relay (:func:`servekit.plugins.model_hooks`): no other
        framework plugin is asked to predict with a model it did not load.
        """
        pm = self._manager_for(model, mv.path)
        load = plugins.load_caller(pm, model.config.plugin)
        loaded, mv.loaded_by = plugins.call_load(
            pm, load, path=mv.path, config=model.config, name=model.name, version=mv.version
        )
        if loaded is None:
            raise RuntimeError(_no_plugin_message(mv.path))
        mv.model = loaded
        mv.hooks = plugins.model_hooks(pm, mv.loaded_by, model.config.plugin)
        mv.metadata = self._describe(mv)

    def _fail(self, mv: ModelVersion, message: str, exc: BaseException | None = None) -> None:
        """Mark ``mv`` failed; the client reads ``message``, the log also gets the traceback."""
        mv.state = State.END
        mv.error = message
        log.error("model %s version %d failed to load: %s", mv.name, mv.version, message, exc_info=exc)

    def _describe(self, mv: ModelVersion) -> ModelMetadata:
        try:
            meta = mv.hooks.metadata(model=mv.model, name=mv.name, version=mv.version)
        except Exception:
            log.exception("metadata hook failed for %s version %d", mv.name, mv.version)
            meta = None
        return meta if isinstance(meta, ModelMetadata) else ModelMetadata()

    def _manager_for(self, model: Model, path: Path) -> pluggy.PluginManager:
        model_py = path / "model.py"
        if not model_py.is_file():
            model_py = model.base_path / "model.py"
        if not model_py.is_file():
            return self.pm
        key = model_py.resolve()
        if key not in self._managers:
            self._managers[key] = plugins.model_manager(self.pm, model_py)
        return self._managers[key]

    def _unload_version(self, model: Model, mv: ModelVersion) -> None:
        with self._lock:
            model.versions.pop(mv.version, None)
        if mv.model is not None and mv.hooks is not None:
            mv.state = State.UNLOADING
            try:
                if mv.host is not None:
                    mv.host.close()
                mv.hooks.unload(model=mv.model)
            except Exception:
                log.exception("unload hook failed for %s version %d", mv.name, mv.version)
        mv.state = State.END
        log.info("unloaded %s version %d", mv.name, mv.version)

    # -- repository API (V2 repository extension) ---------------------------

    def load_model(self, name: str) -> Model:
        model = self.get_model(name)
        with self._sync_lock:
            model.unloaded = False
            self._sync_model(model)
        return model

    def unload_model(self, name: str) -> Model:
        model = self.get_model(name)
        with self._sync_lock:
            model.unloaded = True
            for mv in list(model.versions.values()):
                self._unload_version(model, mv)
        return model

    # -- lookups -------------------------------------------------------------

    def get_model(self, name: str) -> Model:
        model = self.models.get(name)
        if model is None:
            raise UnknownModel(name, list(self.models))
        return model

    def resolve(self, name: str, version: int | str | None = None, label: str | None = None) -> ModelVersion:
        """The version a request addresses: a number, a label, or the latest available."""
        model = self.get_model(name)
        number = _addressed_version(model, version, label)
        if number is not None:
            mv = model.versions.get(number)
            if mv is None:
                raise NotFound(f"Servable not found for request: Specific({name}, {number})")
            if not mv.ready:
                raise NotReady(_not_ready_message(mv))
            return mv
        available = model.available()
        if available:
            return available[-1]
        if model.versions:
            latest = model.versions[max(model.versions)]
            raise NotReady(_not_ready_message(latest))
        if not self.ready:
            raise NotReady(f"model {name!r} is loading")
        if model.config_error:
            raise NotReady(f"model {name!r} failed to load: {model.config_error}")
        raise NotFound(f"Servable not found for request: Latest({name})")

    def statuses(self, name: str, version: int | str | None = None, label: str | None = None) -> list[ModelVersion]:
        model = self.get_model(name)
        number = _addressed_version(model, version, label)
        if number is not None:
            if number not in model.versions:
                raise NotFound(f"Could not find version {number} of model {name}")
            return [model.versions[number]]
        if not model.versions and not self.ready:
            return [ModelVersion(name, 0, model.base_path, model.config, State.LOADING)]
        return sorted(model.versions.values(), key=lambda v: v.version, reverse=True)


def _addressed_version(model: Model, version: int | str | None, label: str | None) -> int | None:
    """The version number a request names, directly or through a label; ``None`` for the latest."""
    if label is not None:
        if label not in model.config.labels:
            raise NotFound(f"Unrecognized servable version label: {label}")
        return model.config.labels[label]
    return None if version is None else _parse_version(version)


def _parse_version(version: int | str) -> int:
    if isinstance(version, int):
        return version
    if not (str(version).isascii() and str(version).isdigit()):  # "¹" is a digit int() refuses
        # a malformed number is the client's mistake, not a missing version
        raise BadRequest(f"invalid model version {version!r}: expected a positive integer")
    return int(version)


def _not_ready_message(mv: ModelVersion) -> str:
    if mv.state is State.END and mv.error:
        return f"model {mv.name!r} version {mv.version} failed to load: {mv.error}"
    return f"model {mv.name!r} version {mv.version} is not ready (state {mv.state.value})"


def _no_plugin_message(path: Path) -> str:
    files = sorted(p.name for p in path.iterdir())[:10]
    return (
        "no plugin could load this model folder (files: "
        + (", ".join(files) or "none")
        + "); expected e.g. model.joblib, model.skops, model.pt, saved_model.pb, config.json "
        "or a model.py with a load hook; see `servekit plugins`"
    )


def _describe_error(exc: Exception) -> str:
    """A load error as a reader needs it: messages like ``'32'`` (a KeyError) say nothing alone."""
    message = str(exc)
    if isinstance(exc, (RuntimeError, ValueError)) and message:
        return message
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _clean(message: str, base: Path) -> str:
    """Strip file-system paths from an error message that clients will read."""
    for prefix in {str(base.resolve().parent), str(base.parent)}:
        if prefix and prefix != ".":
            message = message.replace(prefix + "/", "").replace(prefix, "")
    return message[:2000]
