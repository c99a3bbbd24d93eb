"""Model versions in one process: loading, unloading and looking them up.

Which models and versions to serve is decided by the control plane
(:mod:`servekit.control`): its :class:`~servekit.control.plan.Planner` reads the
folders once for the whole server and every worker's repository *applies* the
plans it publishes (:meth:`ModelRepository.apply`).  A repository used alone (a
test, a model host, a one-process app) keeps a planner of its own
(:meth:`ModelRepository.sync`).  A new version is loaded before the version it
replaces is unloaded, so no request fails during a reload, and a version that
fails to load leaves the previous one serving.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pluggy

from servekit.codecs.shared_memory import Regions
from servekit.control.plan import UNLOADED, Planner, config_key
from servekit.dataplane import classification
from servekit.dataplane.executor import LOCAL
from servekit.errors import BadRequest, NotFound, NotReady, ServekitError, UnknownModel, malformed_version
from servekit.folders import pipeline
from servekit.folders import triton_config as triton_model_config
from servekit.folders.layout import discover, is_model_dir, valid_name
from servekit.folders.servekit_yaml import ConfigError, parse_model_config
from servekit.hooks import manager as plugins
from servekit.types import BatchingConfig, Executor, ModelConfig, ModelMetadata, Placement

__all__ = ["Model", "ModelRepository", "ModelVersion", "State", "discover", "is_model_dir", "valid_name"]

log = logging.getLogger("servekit.repository")

#: how long a serving version stays up after the last request resolved to it, and the
#: longest an unload waits for the calls still inside its hooks (``ModelRepository._drain``)
DRAIN_SETTLE_S = 0.5
DRAIN_LIMIT_S = 30.0
_DRAIN_POLL_S = 0.05


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
    #: where its calls run: this process, or its model hosts' client (servekit.hosts.attach sets it)
    executor: Executor = LOCAL
    batcher: Any = None  # servekit.dataplane.batching: made on the first predict (batching.batcher_for)
    gate: Any = None  # servekit.dataplane.call_gate: made on the first unbatched predict (call_gate.turn)
    cache_load: str = ""  # servekit.dataplane.response_cache: this load's part of a key, on its first cached predict
    raw_config: dict[str, Any] = field(default_factory=dict)  # the settings it was loaded with
    warming: bool = False  # LOADING, answering its warm-up requests (servekit.protocols.warmup)
    #: calls now inside its hooks, and when a request last resolved to it (time.monotonic):
    #: unloading a serving version waits for both to settle (``ModelRepository._drain``)
    in_flight: int = 0
    last_resolved: float = 0.0
    _held: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def ready(self) -> bool:
        return self.state is State.AVAILABLE

    @property
    def in_model_hosts(self) -> bool:
        """Whether its hooks run in model hosts (``placement: process``), not in this process."""
        return self.executor is not LOCAL

    def in_use(self) -> ModelVersion:
        """Hold the version for one hook call (``with mv.in_use():``): it is not unloaded under the call."""
        return self

    def __enter__(self) -> ModelVersion:  # per request: a lock, no generator
        with self._held:
            if not (self.state is State.AVAILABLE or self.warming):
                raise NotReady(f"model {self.name!r} version {self.version} is not ready")
            self.in_flight += 1
        return self

    def __exit__(self, *exc: object) -> None:
        with self._held:
            self.in_flight -= 1


@dataclass
class Model:
    name: str
    base_path: Path
    versioned: bool  # False: the folder itself is version 1
    config: ModelConfig = field(default_factory=ModelConfig)
    config_error: str = ""
    versions: dict[int, ModelVersion] = field(default_factory=dict)
    unloaded: bool = False  # not served on purpose: unloaded through the API, or never loaded
    reason: str = ""  # why it is not served, when unloaded
    evicted: bool = False  # unloaded to keep within the memory budget: loads again when asked for
    bytes: int = 0  # what the memory budget counts for its versions (their files' size)
    last_used: float = 0.0  # time.time() of its last request here
    raw_config: dict[str, Any] = field(default_factory=dict)
    # the last load tried of each version: (fingerprint, config_key); retried only when it changes
    tried: dict[int, tuple[float, str]] = field(default_factory=dict)
    # labels already warned about: label -> (its version, the versions serving then)
    dangling_labels: dict[str, tuple[int, tuple[int, ...]]] = field(default_factory=dict)

    def available(self) -> list[ModelVersion]:
        return sorted((v for v in self.versions.values() if v.ready), key=lambda v: v.version)


class ModelRepository:
    """Every served model and its versions, in one process."""

    def __init__(
        self,
        folders: dict[str, Path],
        pm: pluggy.PluginManager,
        *,
        poll_interval: float = 1.0,
        batching: BatchingConfig | None = None,
        planner: Planner | None = None,
        placement: Placement | None = None,
    ):
        self.pm = pm
        self.poll_interval = poll_interval
        self.batching = batching or BatchingConfig()
        #: where versions run (``servekit.hosts``); ``None``: always in this process (a model host's own)
        self.placement = placement
        #: the plan maker when this repository decides alone (see :meth:`sync`)
        self.planner = planner or Planner(folders, batching=self.batching)
        #: replaced whole, never changed in place: readers iterate it without a lock
        self.models: dict[str, Model] = {
            name: Model(name, entry.base_path, entry.versioned) for name, entry in self.planner.entries.items()
        }
        self.generation = 0  # of the last plan applied
        #: Triton's registered shared-memory regions, as the plan says (servekit.codecs.shared_memory)
        self.shared_memory = Regions()
        self._lock = threading.RLock()
        # one apply at a time: the polling thread, the control plane, the repository API
        self._sync_lock = threading.Lock()
        self._first_load_done = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: runs a loading version's warm-up before it is AVAILABLE (servekit.protocols.warmup.Warmer)
        self.warm: Callable[[ModelVersion], None] | None = None
        #: runs after a plan that changed what is served was applied (a server's servekit.control.long_lived.settle)
        self.after_change: Callable[[], object] | None = None
        #: told of each version unloaded or replaced here (the response cache drops its entries)
        self.on_release: Callable[[ModelVersion], object] | None = None

    # -- lifecycle (a repository that decides alone) ------------------------

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

    def sync(self) -> None:
        """Read the folders with this repository's own planner and apply what it decides."""
        with self._sync_lock:
            self.planner.refresh()
            self._apply(self.planner.plan)

    def mark_ready(self) -> None:
        """The first load is over even though no plan was applied (it failed): requests stop waiting."""
        self._first_load_done.set()

    def expect_plan(self) -> None:
        """From now on the plans come from the control plane: hold requests until the first."""
        self._first_load_done.clear()

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
        models = self.models
        down = sorted(m.name for m in models.values() if not m.available())
        if len(down) == len(models):
            return False, f"no model has an AVAILABLE version ({', '.join(down) or 'none is served'})"
        failing = [name for name in down if not models[name].unloaded]
        if strict and failing:
            return False, (
                f"model(s) without an AVAILABLE version: {', '.join(failing)} (--no-strict-readiness serves the others)"
            )
        return True, ""

    def wait_ready(self, timeout: float | None = None) -> bool:
        return self._first_load_done.wait(timeout)

    # -- applying a plan -------------------------------------------------------

    def apply(self, plan: dict[str, Any]) -> dict[str, dict[int, tuple[str, str]]]:
        """Serve what ``plan`` says (see :mod:`servekit.control.plan`); returns :meth:`states`."""
        with self._sync_lock:
            self._apply(plan)
        self._first_load_done.set()
        return self.states()

    def _apply(self, plan: dict[str, Any]) -> None:
        wanted = plan["models"]
        models = dict(self.models)
        for name, doc in wanted.items():
            model = models.get(name)
            if model is None:  # listed at once: its requests see it LOADING, not unknown
                model = models[name] = Model(name, Path(doc["base_path"]), doc["versioned"])
                self.models = dict(models)
            elif str(model.base_path) != doc["base_path"]:
                # a new folder for the name (files sent with a load): it loads beside the
                # old one, which serves until the new one takes its place
                fresh = Model(name, Path(doc["base_path"]), doc["versioned"])
                self._apply_model(fresh, doc)
                models[name] = fresh
                self.models = dict(models)
                if model is not None:
                    self._unload_all(model)
                continue
            self._apply_model(model, doc)
        for name in [n for n in models if n not in wanted]:
            self._unload_all(models.pop(name))
        self.models = models
        self.shared_memory.apply(plan.get("shared_memory", {}))
        changed = plan["generation"] != self.generation
        self.generation = plan["generation"]
        if changed and self.after_change is not None:
            self.after_change()

    def _apply_model(self, model: Model, doc: dict[str, Any]) -> None:
        model.config_error = doc["config_error"]
        model.raw_config = doc["raw"]
        if not model.config_error:
            try:
                model.config = parse_model_config(doc["raw"], model.base_path, self.batching)
            except ConfigError as exc:
                model.config_error = str(exc)
        model.reason = doc["reason"]
        model.evicted = doc["enabled"] and not doc.get("resident", True)
        model.bytes = doc.get("bytes", 0)
        if not doc["enabled"] or model.evicted:
            model.unloaded = True
            self._unload_all(model)
            return
        model.unloaded = False
        wanted: dict[int, dict[str, Any]] = doc["versions"]
        key = config_key(doc["raw"])
        for version, where in sorted(wanted.items()):
            current, tried = model.versions.get(version), model.tried.get(version)
            stale = current is not None and current.ready and tried is not None and tried[1] != key
            retry = current is not None and current.state is State.END and tried != (where["fingerprint"], key)
            if current is None or stale or retry:
                model.tried[version] = (where["fingerprint"], key)
                self._load_version(model, version, Path(where["path"]), where["fingerprint"], where.get("error", ""))
        # Unload what is no longer wanted, but keep serving until every wanted
        # version is up: a broken new version must not take the old one away.
        on_disk = set(doc["on_disk"])
        wanted_up = all(model.versions[v].ready for v in wanted if v in model.versions)
        for version, mv in list(model.versions.items()):
            if version in wanted:
                continue
            if version not in on_disk or wanted_up or not mv.ready:
                self._unload_version(model, mv)
        for version in [v for v in model.tried if v not in model.versions]:
            del model.tried[version]
        self._warn_dangling_labels(model, on_disk)

    def _unload_all(self, model: Model) -> None:
        for mv in list(model.versions.values()):
            self._unload_version(model, mv)
        model.tried.clear()

    def usage(self) -> dict[str, float]:
        """When each model was last asked for here (the memory budget unloads the least recent)."""
        return {name: model.last_used for name, model in self.models.items() if model.last_used}

    def states(self) -> dict[str, dict[int, tuple[str, str]]]:
        """Every model's versions here: ``{name: {version: (state, error)}}``."""
        return {
            name: {v: (mv.state.value, mv.error) for v, mv in model.versions.items()}
            for name, model in self.models.items()
        }

    def _warn_dangling_labels(self, model: Model, on_disk: set[int]) -> None:
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

    def _load_version(self, model: Model, version: int, path: Path, fingerprint: float, error: str = "") -> None:
        """Load a version; it takes the place of a version of that number only once it is AVAILABLE.

        ``error``: why its files are not there (a failed download from storage): it fails with that.
        """
        mv = ModelVersion(model.name, version, path, model.config, State.LOADING, fingerprint=fingerprint)
        mv.raw_config = dict(model.raw_config)
        with self._lock:
            previous = model.versions.get(version)
            if previous is None or not previous.ready:
                model.versions[version] = mv
        if model.config_error or error:
            self._fail(mv, model.config_error or error)
        else:
            started = time.perf_counter()
            try:
                where = self._load_where_placed(model, mv)
                self._warm_up(mv)
                mv.load_seconds = time.perf_counter() - started
                mv.state = State.AVAILABLE
                log.info("loaded %s version %d in %.2fs (%s)", model.name, version, mv.load_seconds, where)
            except Exception as exc:
                self._fail(mv, _clean(_naming_artifacts(_describe_error(exc), mv.path), model.base_path), exc)
        with self._lock:
            if previous is not None and previous.ready and not mv.ready:
                log.error("model %s version %d keeps serving as it was loaded before", model.name, version)
                return
            model.versions[version] = mv
        if previous is not None and previous.ready:
            self._release(previous)  # replaced by a load with other settings

    def _warm_up(self, mv: ModelVersion) -> None:
        """Run the warm-up; a failing one releases what was loaded (the load then fails)."""
        if self.warm is None:
            return
        mv.warming = True
        try:
            self.warm(mv)
        except BaseException:
            self._release(mv)
            raise
        finally:
            mv.warming = False

    def _load_where_placed(self, model: Model, mv: ModelVersion) -> str:
        """Load ``mv`` here or in model hosts; says where, for the log."""
        placement, replicas = self.placement.placement_of(model.config) if self.placement else ("worker", 1)
        if placement == "process" and self.placement is not None:  # loaded once, in host processes
            self.placement.attach(mv, self.pm, self.batching, replicas)
            return f"{replicas} model host(s)"
        self._load_here(model, mv)
        return f"plugin {mv.loaded_by}"

    def _load_here(self, model: Model, mv: ModelVersion) -> None:
        """Load ``mv`` in this process; its hooks then go to the plugin whose ``load`` answered.

        That plugin, the folder's ``model.py`` and the wrappers make the
        version's relay (:func:`servekit.hooks.manager.model_hooks`): no other
        framework plugin is asked to predict with a model it did not load.
        """
        if model.config.pipeline is not None:
            self._load_pipeline(model, mv)
            return
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

    def _load_pipeline(self, model: Model, mv: ModelVersion) -> None:
        """A pipeline has no artifact: the data plane runs its steps on their own models."""

        def metadata_of(step: Any) -> ModelMetadata | None:
            try:
                return self.resolve(step.model, step.version).metadata
            except ServekitError:
                return None

        labels_of = classification.step_labels(self.resolve)  # an output's classes: its step's labels
        mv.model = pipeline.described(model.config.pipeline, metadata_of, labels_of)
        mv.loaded_by = "pipeline"
        mv.hooks = plugins.new_manager().hook  # no hooks of its own
        mv.metadata = mv.model.metadata()
        triton = triton_model_config.of_version(mv)
        if triton and triton.get("platform") == "ensemble":  # a Triton ensemble reports itself as one
            mv.metadata.platform = "ensemble"

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
        if isinstance(meta, ModelMetadata) and meta.signatures:
            return meta
        # a model without metadata of its own: the folder's Triton config.pbtxt says its tensors
        configured = triton_model_config.metadata(triton_model_config.of_version(mv))
        return configured or (meta if isinstance(meta, ModelMetadata) else ModelMetadata())

    def _manager_for(self, model: Model, path: Path) -> pluggy.PluginManager:
        """The hooks for the version in ``path``: a ``model.py`` runs afresh each time a version loads.

        So a changed ``model.py`` takes effect with the next version folder (or a
        reload of this one) without a restart; versions loaded side by side keep
        the code each was loaded with.
        """
        model_py = path / "model.py"
        if not model_py.is_file():
            model_py = model.base_path / "model.py"
        if not model_py.is_file():
            return self.pm
        return plugins.model_manager(self.pm, model_py)

    def _unload_version(self, model: Model, mv: ModelVersion) -> None:
        with self._lock:
            if model.versions.get(mv.version) is mv:
                model.versions.pop(mv.version, None)
        self._release(mv)
        log.info("unloaded %s version %d", mv.name, mv.version)

    def _release(self, mv: ModelVersion) -> None:
        if mv.ready:
            self._drain(mv)
        if mv.model is not None and mv.hooks is not None:
            mv.state = State.UNLOADING
            try:
                mv.executor.close()  # a model host's client tells its hosts
                mv.hooks.unload(model=mv.model)
            except Exception:
                log.exception("unload hook failed for %s version %d", mv.name, mv.version)
        mv.state = State.END
        if self.on_release is not None:
            self.on_release(mv)

    @staticmethod
    def _drain(mv: ModelVersion) -> None:
        """Let the requests on a serving version, no longer routed to it, finish first.

        TF Serving's servable handles: a request that resolved to the version just
        before a newer one took its place still runs on it.  Calls inside its hooks
        are counted; a request between resolving and its first call is not, so the
        version also stays up ``DRAIN_SETTLE_S`` after the last request resolved to
        it (a version nobody asked for lately goes at once).
        """
        deadline = time.monotonic() + DRAIN_LIMIT_S
        while time.monotonic() < deadline:
            if mv.in_flight == 0 and time.monotonic() >= mv.last_resolved + DRAIN_SETTLE_S:
                return
            time.sleep(_DRAIN_POLL_S)
        log.warning(
            "unloading %s version %d with %d calls still running after %.0fs",
            mv.name,
            mv.version,
            mv.in_flight,
            DRAIN_LIMIT_S,
        )

    # -- repository API, for a repository that decides alone ------------------------

    def load_model(self, name: str) -> Model:
        with self._sync_lock:
            self.planner.enable(name)
            self.planner.refresh()
            self._apply(self.planner.plan)
        return self.get_model(name)

    def unload_model(self, name: str) -> Model:
        with self._sync_lock:
            self.planner.disable(name)
            self.planner.refresh()
            self._apply(self.planner.plan)
        return self.get_model(name)

    def load_one(self, name: str, version: int, path: Path, fingerprint: float, raw: dict[str, Any]) -> ModelVersion:
        """Load one version with the settings given, whatever the folder says (a model host's)."""
        model = self.get_model(name)
        model.raw_config = dict(raw)
        model.config = parse_model_config(raw, model.base_path, self.batching)
        self._load_version(model, version, path, fingerprint)
        return model.versions[version]

    # -- lookups -------------------------------------------------------------

    def get_model(self, name: str) -> Model:
        model = self.models.get(name)
        if model is None:
            raise UnknownModel(name, list(self.models))
        return model

    def resolve(self, name: str, version: int | str | None = None, label: str | None = None) -> ModelVersion:
        """The version a request addresses: a number, a label, or the latest available."""
        model = self.get_model(name)
        model.last_used = time.time()
        mv = self._serving(model, version, label)
        mv.last_resolved = time.monotonic()  # an unload of it waits a moment past this (``_drain``)
        return mv

    def _serving(self, model: Model, version: int | str | None, label: str | None) -> ModelVersion:
        name = model.name
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
        if model.unloaded:
            raise NotFound(f"Servable not found for request: Latest({name}): the model is {model.reason or UNLOADED}")
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
        if not model.versions and model.unloaded:
            raise NotFound(f"Could not find any versions of model {name} (it is {model.reason or UNLOADED})")
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
        raise BadRequest(malformed_version(str(version)))
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
    """A load error as a reader needs it: messages like ``'32'`` (a KeyError) say nothing alone,
    and a missing framework library says which extra installs it."""
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        extra = plugins.EXTRAS.get(exc.name.split(".")[0])
        if extra is not None:
            return f"{exc}: install it with pip install 'servekit[{extra}]'"
    message = str(exc)
    if isinstance(exc, (RuntimeError, ValueError)) and message:
        return message
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _naming_artifacts(message: str, folder: Path) -> str:
    """A load error that names no file of the version folder (a bare ``MemoryError``, say),
    prefixed with the folder's artifacts, so the reader knows which file failed."""
    try:
        files = sorted(p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    except OSError:
        return message
    artifacts = [f for f in files if f not in ("model.py", "servekit.yaml")] or files
    if not artifacts or any(name in message for name in files):
        return message
    named = ", ".join(str(folder / name) for name in artifacts[:3])
    return f"{named}: {message}"


def _clean(message: str, base: Path) -> str:
    """Strip file-system paths from an error message that clients will read."""
    for prefix in {str(base.resolve().parent), str(base.parent)}:
        if prefix and prefix != ".":
            message = message.replace(prefix + "/", "").replace(prefix, "")
    return message[:2000]
