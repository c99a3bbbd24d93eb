"""The model set a server serves: what the control plane decides and every worker applies.

A *plan* is plain data, numbered by a generation: for every model its folder,
its settings (``servekit.yaml`` with what an operator set over it through the
API), whether it is to be served, and the version folders its policy wants,
each with a fingerprint; and the shared-memory regions clients registered
(:mod:`servekit.codecs.shared_memory`), so every worker reads the same ones.  One
:class:`Planner` per server reads the disk and keeps the operator's changes
(load, unload, a config override, a new model config file); the repositories
of every worker and model host apply its plans
(:meth:`servekit.dataplane.repository.ModelRepository.apply`) without reading the
folders' policies themselves, so they all serve the same thing.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servekit import storage
from servekit.errors import UnknownModel
from servekit.folders.layout import (
    fingerprint,
    folder_bytes,
    is_versioned,
    model_folders_in,
    valid_name,
    versions_on_disk,
)
from servekit.folders.servekit_yaml import ConfigError, parse_model_config, read_raw_config, select_versions
from servekit.types import BatchingConfig

log = logging.getLogger("servekit.control")
#: Settings that change what a load makes; a change of one reloads the versions (labels and
#: the version policy apply without a reload).
RELOAD_KEYS_EXCLUDED = ("labels", "version_policy")

UNLOADED = "unloaded"
EVICTED = "not resident: unloaded to keep within --model-memory-budget; it loads again on its next request"
NOT_LOADED = "not loaded (explicit model control: load it through the repository API)"


@dataclass
class Entry:
    """The operator's intent for one model."""

    name: str
    base_path: Path
    versioned: bool
    origin: Path | None = None  # its folder in the repository (base_path differs for files sent in a load)
    enabled: bool = True
    resident: bool = True  # False: served, but unloaded to keep within the memory budget
    reason: str = ""  # why a disabled model is not served
    overrides: dict[str, Any] = field(default_factory=dict)  # settings over its servekit.yaml


def config_key(raw: dict[str, Any]) -> str:
    """What of a model's settings a loaded version depends on, as one comparable string."""
    kept = {k: v for k, v in raw.items() if k not in RELOAD_KEYS_EXCLUDED}
    return json.dumps(kept, sort_keys=True, default=str)


def model_plan(entry: Entry, defaults: BatchingConfig) -> dict[str, Any]:
    """One model's part of a plan, read from its folder now (a stored model's synced first)."""
    doc: dict[str, Any] = {
        "base_path": str(entry.base_path),
        "versioned": entry.versioned,
        "enabled": entry.enabled,
        "resident": entry.resident,
        "reason": entry.reason if not entry.enabled else ("" if entry.resident else EVICTED),
        "pinned": False,
        "bytes": 0,
        "raw": dict(entry.overrides),
        "config_error": "",
        "versions": {},
        "on_disk": [],
    }
    stored = _sync_storage(entry, defaults) if entry.enabled and entry.resident else None
    config = None
    try:
        doc["raw"] = {**read_raw_config(entry.base_path), **entry.overrides}
        config = parse_model_config(doc["raw"], entry.base_path, defaults)
        doc["pinned"] = config.pin
    except ConfigError as exc:
        doc["config_error"] = str(exc)
    if not entry.enabled:
        return doc
    on_disk = versions_on_disk(entry.base_path, entry.versioned)
    if stored is not None and stored.versions:
        on_disk = dict(stored.versions)  # the store's versions; the cache holds the wanted ones
    wanted = sorted(on_disk)[-1:] if config is None else select_versions(config.version_policy, list(on_disk))
    doc["on_disk"] = sorted(on_disk)
    doc["bytes"] = sum(folder_bytes(on_disk[v]) for v in wanted if on_disk[v].exists())
    if entry.resident:
        doc["versions"] = {v: {"path": str(on_disk[v]), "fingerprint": fingerprint(on_disk[v])} for v in wanted}
        for version, error in (stored.errors if stored is not None else {}).items():
            if version in doc["versions"]:  # its download failed: the version is END with why
                doc["versions"][version] = {"path": str(on_disk[version]), "fingerprint": 0.0, "error": error}
    return doc


_storage_errors: dict[str, str] = {}  # the last listing error of each stored model, logged once


def _sync_storage(entry: Entry, defaults: BatchingConfig) -> storage.Synced | None:
    """Bring a model folder mirrored from a store (``s3://``, ...) in step with it; ``None`` when local.

    The model's version policy picks what is downloaded; a listing that fails leaves the
    cache as it was, so the versions it holds keep serving.
    """

    def select(versions: list[int]) -> list[int]:
        try:
            raw = {**read_raw_config(entry.base_path), **entry.overrides}
            return select_versions(parse_model_config(raw, entry.base_path, defaults).version_policy, versions)
        except ConfigError:
            return sorted(versions)[-1:]

    stored = storage.sync(entry.base_path, select)
    if stored is None:
        return None
    key = str(entry.base_path)
    if stored.error and _storage_errors.get(key) != stored.error:
        log.error("model %s: %s; serving what the cache holds", entry.name, stored.error)
    elif not stored.error and key in _storage_errors:
        log.info("model %s: its store answers again", entry.name)
    if stored.error:
        _storage_errors[key] = stored.error
    else:
        _storage_errors.pop(key, None)
    return stored


class Planner:
    """The desired model set of one server and its generations.

    :param folders: the models found at start (name -> folder).
    :param roots: repository folders, where a model folder added later is found by name.
    :param explicit: Triton's explicit model control: a model found later is listed,
        not loaded, until a load names it.
    """

    def __init__(
        self,
        folders: dict[str, Path],
        *,
        roots: list[Path] | None = None,
        batching: BatchingConfig | None = None,
        explicit: bool = False,
    ):
        self.entries = {name: Entry(name, Path(p), is_versioned(Path(p)), Path(p)) for name, p in folders.items()}
        self.roots = [Path(r) for r in roots or []]
        self.batching = batching or BatchingConfig()
        self.explicit = explicit
        self.generation = 0
        #: Triton's registered system shared-memory regions, by name (servekit.codecs.shared_memory)
        self.shared_memory: dict[str, dict[str, Any]] = {}
        self.plan: dict[str, Any] = {"generation": 0, "models": {}, "shared_memory": {}}

    def refresh(self) -> bool:
        """Read the folders again; ``True`` when the plan changed (it then has a new generation)."""
        if self.explicit:
            self._find_new_models()
        models = {name: model_plan(entry, self.batching) for name, entry in sorted(self.entries.items())}
        regions = {name: dict(entry) for name, entry in sorted(self.shared_memory.items())}
        if models == self.plan["models"] and regions == self.plan.get("shared_memory") and self.generation:
            return False
        self.generation += 1
        self.plan = {"generation": self.generation, "models": models, "shared_memory": regions}
        return True

    def _find_new_models(self, wanted: str | None = None) -> None:
        """Model folders that appeared in a repository folder: listed, not served until loaded."""
        for root in self.roots:
            storage.sync_new_models(root)  # a repository in a bucket: its new model folders mirrored first
            if not root.is_dir():
                continue
            for folder in model_folders_in(root):
                name = folder.name
                if name in self.entries or not valid_name(name) or (wanted and name != wanted):
                    continue
                self.entries[name] = Entry(name, folder, is_versioned(folder), folder, enabled=False, reason=NOT_LOADED)

    # -- the operator's changes ------------------------------------------------------------

    def entry(self, name: str) -> Entry:
        found = self.entries.get(name)
        if found is None and self.roots:
            self._find_new_models(name)
            found = self.entries.get(name)
        if found is None:
            raise UnknownModel(name, sorted(self.entries))
        return found

    def enable(self, name: str, overrides: dict[str, Any] | None = None, base_path: Path | None = None) -> Entry:
        """Serve ``name`` (a load); ``overrides`` replace earlier ones; ``base_path``: files sent
        with the load, else the model's own folder."""
        entry = self.entry(name) if base_path is None else self.entries.get(name)
        if entry is None:
            entry = self.entries[name] = Entry(name, Path(str(base_path)), True)
        folder = Path(base_path) if base_path is not None else (entry.origin or entry.base_path)
        if folder != entry.base_path:
            entry.base_path, entry.versioned = folder, is_versioned(folder)
        entry.enabled, entry.reason = True, ""
        if overrides is not None:
            entry.overrides = dict(overrides)
        return entry

    def disable(self, name: str) -> Entry:
        entry = self.entry(name)
        entry.enabled, entry.reason = False, UNLOADED
        return entry

    def replace(self, models: dict[str, tuple[Path, dict[str, Any]]]) -> None:
        """Serve exactly ``models`` (name -> folder and overrides): a new TF Serving model config.

        The config names the whole model set: folders in the repository that it leaves
        out are not listed again.
        """
        self.roots = []
        for name in list(self.entries):
            if name not in models:
                del self.entries[name]
        for name, (base_path, overrides) in models.items():
            entry = self.entries.get(name)
            if entry is None or entry.base_path != Path(base_path):
                entry = self.entries[name] = Entry(
                    name, Path(base_path), is_versioned(Path(base_path)), Path(base_path)
                )
            entry.overrides = dict(overrides)
