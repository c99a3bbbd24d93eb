"""The owner of a server's model set, and the followers it keeps in step.

One :class:`Owner` per server decides what is served: it holds the
:class:`~servekit.control.plan.Planner`, polls the model folders (once for the
whole server, not once per worker), takes the control calls (a V2 repository
load or unload over HTTP or gRPC, a TF Serving config reload) and publishes
each new plan to every *follower* — the repository of each HTTP worker, whose
gRPC server and model hosts go with it.  A control call answers only when
every follower has applied its plan (or with an error naming the one that did
not), so after it answers no request anywhere sees the old state.  A follower
that joins later (a replaced worker, a new one) gets the current plan first.

Under ``servekit serve`` the owner runs in the engine's top process (gunicorn's
master, granian's main process), which forks the workers and outlives them; a
one-process app (tests, a notebook) has an owner of its own with its one
repository as the only follower.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from servekit import storage
from servekit.codecs import shared_memory
from servekit.control import triton_load_config, uploads
from servekit.control.plan import UNLOADED, Planner
from servekit.errors import BadRequest, NotFound, NotReady, UnknownModel

log = logging.getLogger("servekit.control")

#: The longest a control call waits for every follower to apply it (a large model loads slowly).
APPLY_TIMEOUT = 600.0

States = dict[str, dict[int, tuple[str, str]]]

#: Where the models of a TF Serving config reload are served from: the models (as
#: :func:`servekit.folders.tf_serving_config.served_model` gives them) in, what
#: :meth:`Owner.replace` takes out (name -> (folder, settings over its servekit.yaml)).
ConfigFolders = Callable[[list[dict[str, Any]]], dict[str, tuple[str, dict[str, Any]]]]


def base_path_folders(models: list[dict[str, Any]]) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each model served from its ``base_path``, with its version policy and labels laid over."""
    return {m["name"]: (m["base_path"], m["overrides"]) for m in models}


class Link(Protocol):
    """One follower as the owner sees it."""

    label: str
    generation: int  # the last plan it applied
    states: States  # its versions' states after that plan

    def send(self, plan: dict[str, Any]) -> None: ...

    def usage(self) -> dict[str, float]:
        """When it last served each model (``time.time()``)."""
        ...


class LocalLink:
    """A repository in the owner's own process: a plan is applied at once, in the caller's thread."""

    label = "this process"

    def __init__(self, repository: Any):
        self.repository = repository
        self.generation = 0
        self.states: States = {}

    def send(self, plan: dict[str, Any]) -> None:
        self.states = self.repository.apply(plan)
        self.generation = plan["generation"]

    def usage(self) -> dict[str, float]:
        return self.repository.usage()


class Owner:
    def __init__(
        self,
        planner: Planner,
        *,
        poll_interval: float = 0.0,
        apply_timeout: float = APPLY_TIMEOUT,
        memory_budget: int = 0,
        config_folders: ConfigFolders | None = None,
    ):
        self.planner = planner
        self.poll_interval = poll_interval
        self.apply_timeout = apply_timeout
        #: ``--model-memory-budget``: bytes of models resident at once (0: no budget)
        self.memory_budget = memory_budget
        #: where a TF Serving config reload's models are served from: their base paths, unless
        #: the front door that built the server says otherwise (``tensorflow_model_server
        #: --model_config_file`` serves a generated folder per model: ConfigFileFolders)
        self.config_folders: ConfigFolders = config_folders or base_path_folders
        self._asked: dict[str, float] = {}  # models loaded on demand, when (a use not yet reported)
        self.links: list[Link] = []
        self.uploads = uploads.Uploads()
        self._changes = threading.RLock()  # one change, and its publication, at a time
        self._acks = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- followers ------------------------------------------------------------------

    def join(self, link: Link) -> None:
        """A new follower: it gets the current plan first."""
        with self._acks:
            self.links.append(link)
        link.send(self.planner.plan)

    def leave(self, link: Link) -> None:
        with self._acks:
            if link in self.links:
                self.links.remove(link)
            self._acks.notify_all()

    def acknowledge(self, link: Link, generation: int, states: States) -> None:
        with self._acks:
            # a join that raced a publish may deliver the older plan last: it never counts back
            if generation >= link.generation:
                link.generation, link.states = generation, states
            self._acks.notify_all()

    # -- polling --------------------------------------------------------------------

    def start(self) -> None:
        """Read the folders now, then poll them in a daemon thread (``poll_interval`` > 0)."""
        with self._changes:
            self._refresh()
        if self.poll_interval > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._poll, name="servekit-control-poll", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _poll(self) -> None:
        while not self._stop.wait(self.poll_interval):
            try:
                with self._changes:
                    if self._refresh():
                        self._publish()
            except Exception:  # polling must never die
                log.exception("polling the model folders failed")

    def refresh_now(self) -> None:
        """Read the folders and publish the result to every follower (a one-process app's first load)."""
        with self._changes:
            self._refresh()
            self._publish()

    def _refresh(self, keep: str | None = None) -> bool:
        """Read the folders, then keep the resident models within the budget; whether the plan changed."""
        changed = self.planner.refresh()
        if self._fit(keep):
            self.planner.refresh()
            changed = True
        return changed

    # -- the memory budget -----------------------------------------------------------

    def _fit(self, keep: str | None = None) -> bool:
        """Unload the least recently used unpinned models until the resident ones fit the budget.

        ``keep`` (a model being loaded on demand) stays; pinned models always stay, so
        the resident bytes may pass the budget by what they and ``keep`` take.  Whether
        a model was unloaded.
        """
        if self.memory_budget <= 0:
            return False
        models = self.planner.plan["models"]
        resident = sorted(n for n, d in models.items() if d["enabled"] and d["resident"])
        total = sum(models[n]["bytes"] for n in resident)
        rank = {name: i for i, name in enumerate(resident)}
        used = self.usage()
        candidates = sorted(
            (n for n in resident if n != keep and not models[n]["pinned"]), key=lambda n: (used.get(n, 0.0), -rank[n])
        )
        evicted = False
        for name in candidates:
            if total <= self.memory_budget:
                break
            self.planner.entries[name].resident = False
            total -= models[name]["bytes"]
            evicted = True
            log.info("unloading %s to keep within the memory budget (%d bytes)", name, self.memory_budget)
        return evicted

    def usage(self) -> dict[str, float]:
        """When each model was last asked for, anywhere."""
        with self._acks:
            links = list(self.links)
        latest = dict(self._asked)
        for link in links:
            for name, when in link.usage().items():
                latest[name] = max(when, latest.get(name, 0.0))
        return latest

    def ensure(self, name: str) -> None:
        """Load a model the budget unloaded (a request asks for it), unloading others to make room."""
        with self._changes:
            entry = self.planner.entry(name)
            if not entry.enabled:
                raise NotFound(f"model {name!r} is {entry.reason or UNLOADED}")
            if not entry.resident:
                entry.resident = True
                self._asked[name] = time.time()
                self._refresh(keep=name)
            self._wait(self._publish())

    # -- publishing -----------------------------------------------------------------

    def _publish(self) -> int:
        plan = self.planner.plan
        with self._acks:
            links = list(self.links)
        for link in links:
            try:
                link.send(plan)
            except Exception as exc:
                log.error("%s did not take plan %d: %s", link.label, plan["generation"], exc)
                self.leave(link)
        return int(plan["generation"])

    def _change(self, change: Any) -> States:
        """Run ``change`` on the planner, publish the new plan, wait until every follower applied it.

        :returns: every follower's states, by label.
        :raises ApplyTimeout: a follower did not apply it in time (503).
        """
        with self._changes:
            change()
            self._refresh()
            generation = self._publish()
            return self._wait(generation)

    def _wait(self, generation: int) -> dict[str, Any]:
        deadline = time.monotonic() + self.apply_timeout
        with self._acks:
            while True:
                pending = [link for link in self.links if link.generation < generation]
                if not pending:
                    return {link.label: link.states for link in self.links}
                left = deadline - time.monotonic()
                if left <= 0:
                    names = ", ".join(link.label for link in pending)
                    raise ApplyTimeout(f"{names} did not apply the change within {self.apply_timeout:g}s")
                self._acks.wait(left)

    # -- control calls --------------------------------------------------------------

    def call(self, op: str, **kwargs: Any) -> Any:
        """A control call by name (what a worker sends): ``load``, ``unload``, ``replace``,
        ``reload_config``, ``ensure``, ``register_region``, ``unregister_region`` or ``plan``."""
        if op == "plan":
            return self.planner.plan
        if op in ("load", "unload", "replace", "reload_config", "ensure", "register_region", "unregister_region"):
            return getattr(self, op)(**kwargs)
        raise BadRequest(f"unknown control call {op!r}")

    def load(self, name: str, config: str | None = None, files: dict[str, bytes] | None = None) -> None:
        """Triton's load: serve ``name`` (any model folder in the repository), with a config and files.

        :raises BadRequest: "failed to load ..." with what went wrong where.
        """
        with self._changes:
            # a load without a config goes back to the folder's own settings, as Triton's does
            overrides = triton_load_config.settings_for(name, config) if config else {}
            base_path = self.uploads.write(name, files) if files else None
            if base_path is None:
                self._known(name, "load")
            triton_load_config.check(self.planner, name, overrides, base_path)
            states = self._change(lambda: self._enable(name, overrides, base_path))
        failures = load_failures(name, states)
        if failures:
            raise BadRequest(f"failed to load {name!r}: {failures}")

    def _enable(self, name: str, overrides: Any, base_path: Path | None) -> None:
        self.planner.enable(name, overrides, base_path).resident = True
        self._asked[name] = time.time()  # a model loaded on purpose is the most recently used

    def unload(self, name: str, unload_dependents: bool = False) -> None:
        """Triton's unload: no worker serves ``name`` when this returns (nothing depends on a model here)."""
        with self._changes:
            self._known(name, "unload")
            self._change(lambda: self.planner.disable(name))

    def replace(self, models: dict[str, tuple[str, dict[str, Any]]]) -> None:
        """Serve exactly ``models`` (a TF Serving model config): added ones load, missing ones unload."""
        wanted = {name: (model_folder(path), overrides) for name, (path, overrides) in models.items()}
        states = self._change(lambda: self.planner.replace(wanted))
        failures = "; ".join(f for name in sorted(models) if (f := load_failures(name, states)))
        if failures:
            raise BadRequest(f"the new model config did not load: {failures}")

    def reload_config(self, models: list[dict[str, Any]]) -> None:
        """TF Serving's config reload: ``models`` as :func:`servekit.folders.tf_serving_config.served_model` gives them."""
        self.replace(self.config_folders(models))

    # -- Triton's system shared memory ------------------------------------------------

    def register_region(self, name: str, key: Any, offset: Any, byte_size: Any) -> None:
        """Register a shared-memory region for every worker; answers when all of them have it."""
        with self._changes:
            if name in self.planner.shared_memory:
                raise BadRequest(f"shared memory region '{name}' already in manager")
            entry = shared_memory.check_registration(name, key, offset, byte_size)
            self._change(lambda: self.planner.shared_memory.__setitem__(name, entry))

    def unregister_region(self, name: str = "") -> None:
        """Unregister one region, or every one (no name); an unknown name is no error, as in Triton."""
        with self._changes:
            if name and name not in self.planner.shared_memory:
                return
            self._change(lambda: self.planner.shared_memory.pop(name) if name else self.planner.shared_memory.clear())

    def _known(self, name: str, what: str) -> None:
        try:
            self.planner.entry(name)
        except UnknownModel:
            known = ", ".join(sorted(self.planner.entries)) or "none"
            raise NotFound(
                f"failed to {what} {name!r}: no model folder of that name in the model repository (models: {known})"
            ) from None


def model_folder(path: str | Path) -> Path:
    """A model's folder: an ``s3://``, ``gs://`` or ``https://`` base path mirrored into the cache now.

    :raises BadRequest: the URI cannot be read (no such bucket, no credentials, ...), named.
    """
    if not storage.is_uri(path):
        return Path(path)
    try:
        return storage.prepare(str(path))
    except storage.StorageError as exc:
        raise BadRequest(f"the new model config did not load: {exc}") from None


class ApplyTimeout(NotReady):
    """A follower did not apply a change in time (503: the change holds once it does)."""


def load_failures(name: str, states: dict[str, Any]) -> str:
    """Why a model is not AVAILABLE everywhere after a load ("" when it is)."""
    problems = []
    for label, by_model in sorted(states.items()):
        versions = by_model.get(name, {})
        if any(state == "AVAILABLE" for state, _ in versions.values()):
            continue
        errors = [f"version {v}: {error}" for v, (_, error) in sorted(versions.items()) if error]
        problems.append(f"{'; '.join(errors) or 'no version folder found'} ({label})")
    return "; ".join(dict.fromkeys(problems))
