"""The plugin manager: entry points, ``--plugin`` files, and a model folder's ``model.py``.

Built-in plugins (sklearn, torch, ...) are found through the ``servekit``
entry-point group exactly like third-party ones.  A plugin that fails to import
is warned about and skipped; two plugins registered under one name is an error
that names both.  ``SERVEKIT_LOAD_PLUGINS`` (comma-separated entry-point names)
limits which installed plugins load; an empty value loads none.

Work goes to the plugin that owns it: the repository calls ``load`` through
:func:`call_load`, which says which plugin answered, and the loaded model's
other hooks go through :func:`model_hooks`, a relay of just that plugin, the
folder's ``model.py`` and every wrapper.  So a framework plugin never sees
another plugin's model and needs no "is this mine?" guard (as llm hands back
model objects and MLServer calls ``model.predict``).
``SERVEKIT_TRACE_PLUGINS=1`` logs every hook call with its arguments and
result (pluggy's tracer), to see which plugin answered and with what.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import logging
import os
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pluggy

from servekit.hooks import sibling_imports
from servekit.hooks import specs as hookspecs

log = logging.getLogger("servekit.plugins")

ENTRY_POINT_GROUP = "servekit"
TRACE_ENV = "SERVEKIT_TRACE_PLUGINS"
MODEL_PY_PREFIX = "model.py:"
_load_lock = threading.Lock()


class PluginError(RuntimeError):
    """A plugin could not be registered (name clash, unreadable file)."""


#: The extra that installs a framework library, by its top-level module.
EXTRAS = {
    "joblib": "sklearn",
    "sklearn": "sklearn",
    "skops": "sklearn",
    "pandas": "sklearn",
    "torch": "torch",
    "tensorflow": "tensorflow",
    "transformers": "huggingface",
    "safetensors": "huggingface",
    "tokenizers": "huggingface",
    "xgboost": "xgboost",
    "lightgbm": "lightgbm",
    "onnxruntime": "onnx",
    "mlflow": "mlflow",
    "shap": "explain",
    "captum": "torch-explain",
}


@dataclass
class PluginInfo:
    name: str
    hooks: list[str]
    source: str  # distribution name, file path or module name
    #: the libraries the plugin declares (``SERVEKIT_REQUIRES``) that are not installed: it loads nothing
    missing: list[str] = field(default_factory=list)


def missing_libraries(plugin: object) -> list[str]:
    """The modules of a plugin's ``SERVEKIT_REQUIRES`` that are not installed."""
    return not_found(getattr(plugin, "SERVEKIT_REQUIRES", ()))


def not_found(modules: Iterable[str]) -> list[str]:
    """The modules that are not installed, found out without importing them."""
    missing = []
    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(module)
    return missing


def usable(infos: Iterable[PluginInfo]) -> tuple[list[str], dict[str, str]]:
    """The plugins that can load models, and the others with what installs each (the start-up line)."""
    ready, missing = [], {}
    for info in infos:
        if not info.missing:
            ready.append(info.name)
            continue
        extras = sorted({EXTRAS[m] for m in info.missing if m in EXTRAS})
        missing[info.name] = (
            f"pip install 'servekit[{','.join(extras)}]'" if extras else "needs " + ", ".join(info.missing)
        )
    return ready, missing


def new_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager("servekit")
    pm.add_hookspecs(hookspecs)
    if os.environ.get(TRACE_ENV, "").strip().lower() not in ("", "0", "false", "no", "off"):
        _trace(pm)
    return pm


def _trace(pm: pluggy.PluginManager) -> None:
    """Log each hook call, its arguments and its result, as Datasette's DATASETTE_TRACE_PLUGINS does.

    Through logging rather than stderr, so the lines carry the request id and
    follow ``--log-format json``.
    """
    trace_log = logging.getLogger("servekit.plugins.trace")
    pm.trace.root.setwriter(lambda text: trace_log.info("%s", text.rstrip("\n")))
    pm.enable_tracing()


def _register(pm: pluggy.PluginManager, plugin: Any, name: str, source: str) -> None:
    existing = pm.get_plugin(name)
    if existing is not None:
        raise PluginError(f"plugin name {name!r} is registered twice: by {_source_of(pm, name)} and by {source}")
    pm.register(plugin, name=name)
    pm._servekit_sources = getattr(pm, "_servekit_sources", {})  # type: ignore[attr-defined]
    pm._servekit_sources[name] = source  # type: ignore[attr-defined]
    for cls_name, instance in _class_plugins(plugin):
        pm.register(instance, name=f"{name}.{cls_name}")
        pm._servekit_sources[f"{name}.{cls_name}"] = source  # type: ignore[attr-defined]


def _source_of(pm: pluggy.PluginManager, name: str) -> str:
    return getattr(pm, "_servekit_sources", {}).get(name, "?")


def _class_plugins(module: Any) -> list[tuple[str, Any]]:
    """Instances of classes defined in ``module`` whose methods carry ``@hookimpl``.

    This lets a ``model.py`` keep its hooks as methods of a class (sharing state
    through ``self``); the class is instantiated without arguments.
    """
    if not isinstance(module, ModuleType):
        return []
    found = []
    for cls_name, cls in vars(module).items():
        if not inspect.isclass(cls) or cls.__module__ != module.__name__:
            continue
        if any(hasattr(getattr(cls, attr, None), "servekit_impl") for attr in dir(cls) if not attr.startswith("__")):
            found.append((cls_name, cls()))
    return found


@functools.cache
def installed_entry_points(path: tuple[str, ...]) -> tuple[tuple[importlib.metadata.EntryPoint, str], ...]:
    """The ``servekit`` entry points of the distributions on ``path`` (``sys.path``), each with its
    distribution's name, read once per process and path: reading them parses every installed
    distribution's metadata, tens of milliseconds, and a worker builds its plugin manager after
    its server process built one to describe the plugins."""
    found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    return tuple((ep, ep.dist.name if ep.dist else "?") for ep in found)


def load_entry_points(pm: pluggy.PluginManager) -> None:
    """Register every installed plugin of the ``servekit`` group (or the allow-listed ones)."""
    allow = os.environ.get("SERVEKIT_LOAD_PLUGINS")
    allowed = None if allow is None else {n.strip() for n in allow.split(",") if n.strip()}
    seen: dict[str, str] = {}
    for ep, dist in installed_entry_points(tuple(sys.path)):
        if allowed is not None and ep.name not in allowed:
            continue
        if ep.name in seen:
            if seen[ep.name] == f"{dist} ({ep.value})":
                continue  # the same distribution seen twice on sys.path
            raise PluginError(
                f"plugin name {ep.name!r} is registered twice: by {seen[ep.name]} and by {dist} ({ep.value})"
            )
        seen[ep.name] = f"{dist} ({ep.value})"
        try:
            plugin = ep.load()
        except Exception as exc:  # a broken third-party plugin must not take the server down
            log.warning("skipping plugin %r from %s: %s: %s", ep.name, dist, type(exc).__name__, exc)
            continue
        _register(pm, plugin, ep.name, f"{dist} ({ep.value})")


def import_plugin(spec: str) -> ModuleType:
    """Import ``spec``: a path to a ``.py`` file or a dotted module name."""
    path = Path(spec)
    if spec.endswith(".py") or path.is_file():
        if not path.is_file():
            raise PluginError(f"plugin file not found: {spec}")
        return import_file(path)
    try:
        return importlib.import_module(spec)
    except ImportError as exc:
        raise PluginError(f"cannot import plugin module {spec!r}: {exc}") from exc


def import_file(path: Path, module_name: str | None = None, *, fresh: bool = False) -> ModuleType:
    """Import a Python file as a module of its own (a model's ``model.py``, a ``--plugin`` file).

    Imported once per file, unless ``fresh``: then the file and the modules it
    imported from its folder run again (a model version loading anew), and the
    new module replaces the old one under the file's module name.
    """
    path = path.resolve()
    module_name = module_name or f"servekit_user_{abs(hash(str(path))):x}_{path.stem}"
    with _load_lock:
        if module_name in sys.modules and not fresh:
            return sys.modules[module_name]
        spec = sibling_imports.fresh_spec(importlib.util.spec_from_file_location(module_name, path))
        if spec is None or spec.loader is None:
            raise PluginError(f"cannot import {path.name}")
        module = importlib.util.module_from_spec(spec)
        if fresh:
            sibling_imports.forget(path.parent)
        previous = sys.modules.get(module_name)
        try:
            sys.modules[module_name] = module  # dataclasses look their module up while it runs
            with sibling_imports.beside(path.parent):  # a model.py imports its sibling modules
                spec.loader.exec_module(module)
        except BaseException:
            if previous is None:
                sys.modules.pop(module_name, None)
            else:
                sys.modules[module_name] = previous
            raise
    return module


def build_manager(plugin_specs: list[str] | tuple[str, ...] = ()) -> pluggy.PluginManager:
    """The global plugin manager: installed plugins, then each ``--plugin``."""
    pm = new_manager()
    load_entry_points(pm)
    for spec in plugin_specs:
        module = import_plugin(spec)
        _register(pm, module, Path(spec).stem if spec.endswith(".py") else spec, spec)
    return pm


def model_manager(base: pluggy.PluginManager, model_py: Path | None) -> pluggy.PluginManager:
    """A per-model manager: the global plugins, then the model's own ``model.py`` on top.

    Registered last, ``model.py`` is called first, so it overrides the framework
    plugin for this model only.
    """
    if model_py is None:
        return base
    pm = new_manager()
    pm._servekit_sources = dict(getattr(base, "_servekit_sources", {}))  # type: ignore[attr-defined]
    for name, plugin in base.list_name_plugin():
        if plugin is not None:
            pm.register(plugin, name=name)
    try:
        module = import_file(model_py, fresh=True)
    except Exception as exc:  # the user's code: any error, reported naming the file
        raise PluginError(f"{model_py.name} could not be imported: {type(exc).__name__}: {exc}") from exc
    name = f"{MODEL_PY_PREFIX}{model_py.parent.name}"
    _register(pm, module, name, str(model_py))
    try:
        check_hook_names(pm, name, model_py.name)
    except PluginError:
        sys.modules.pop(module.__name__, None)  # a corrected file is imported afresh next time
        raise
    return pm


def check_hook_names(pm: pluggy.PluginManager, name: str, where: str) -> None:
    """Refuse ``@hookimpl`` functions whose name is no hook spec (a typo such as ``predcit``).

    pluggy keeps such an implementation pending, in case a later plugin adds the
    spec; a ``model.py`` gets no later specs, so the hook would silently never
    run and its endpoint would answer 501.  Checked for the model's own plugins
    only: a third-party plugin may carry optional hooks for other hosts.
    """
    unknown = sorted(
        {
            caller.name
            for plugin_name, plugin in pm.list_name_plugin()
            if plugin_name == name or plugin_name.startswith(name + ".")
            for caller in pm.get_hookcallers(plugin) or []
            if caller.spec is None
            for impl in caller.get_hookimpls()
            if impl.plugin is plugin and not impl.optionalhook
        }
    )
    if unknown:
        specs = sorted(n for n in vars(pm.hook) if getattr(pm.hook, n).spec is not None)
        hints = [
            f"{n!r} (did you mean {close[0]!r}?)" if (close := difflib.get_close_matches(n, specs, 1)) else repr(n)
            for n in unknown
        ]
        raise PluginError(
            f"{where}: {', '.join(hints)} {'is' if len(hints) == 1 else 'are'} marked @servekit.hookimpl "
            f"but no servekit hook has that name; the hooks are {', '.join(specs)}"
        )


def load_caller(pm: pluggy.PluginManager, plugin: str | None) -> Any:
    """The ``load`` hook, limited to one plugin when ``servekit.yaml`` names it.

    ``plugin: tensorflow`` keeps other plugins' ``load`` out of the way; the
    model's own ``model.py`` and wrappers (metrics, logs) still take part.
    """
    if not plugin:
        return pm.hook.load
    impls = pm.hook.load.get_hookimpls()
    if not any(i.plugin_name == plugin for i in impls):
        known = sorted({i.plugin_name for i in impls if not i.plugin_name.startswith(MODEL_PY_PREFIX)})
        raise PluginError(
            f"servekit.yaml names plugin {plugin!r}, which is not installed; installed: {', '.join(known)}"
        )
    others = [
        i.plugin
        for i in impls
        if i.plugin_name != plugin
        and not i.plugin_name.startswith(MODEL_PY_PREFIX)
        and not (i.wrapper or i.hookwrapper)
    ]
    return pm.subset_hook_caller("load", remove_plugins=others)


def call_load(pm: pluggy.PluginManager, caller: Any, **kwargs: Any) -> tuple[Any, str | None]:
    """Call ``load`` (``caller`` from :func:`load_caller`) and say who answered: ``(model, plugin name)``.

    pluggy returns the first result but not whose it was, so the plain
    implementations are asked here, in pluggy's order (the last registered and
    ``tryfirst`` first), as one temporary implementation (``call_extra``) that
    notes the answering plugin; wrappers around ``load`` still run once,
    around the whole call.
    """
    plain = [i for i in caller.get_hookimpls() if not (i.wrapper or i.hookwrapper)]
    every_plain = [i.plugin for i in pm.hook.load.get_hookimpls() if not (i.wrapper or i.hookwrapper)]
    answered: list[str] = []

    def load(path: Path, config: Any, name: str, version: int) -> Any:
        args = {"path": path, "config": config, "name": name, "version": version}
        for impl in reversed(plain):
            model = impl.function(*(args[arg] for arg in impl.argnames))
            if model is not None:
                answered.append(impl.plugin_name)
                return model
        return None

    model = pm.subset_hook_caller("load", remove_plugins=every_plain).call_extra([load], kwargs)
    return model, (answered[0] if answered else None)


def model_hooks(pm: pluggy.PluginManager, loaded_by: str | None, plugin: str | None = None) -> pluggy.HookRelay:
    """The hook relay of one loaded model: the plugin that loaded it, its ``model.py``, every wrapper.

    Each hook that receives ``model`` is a :meth:`~pluggy.PluginManager.subset_hook_caller`
    without the plain implementations of other plugins, so a framework plugin is
    called only with models its own ``load`` returned.  When the folder's
    ``model.py`` loaded the model, the plugin ``servekit.yaml`` names (``plugin:``)
    joins too: a ``model.py`` that only changes how a scikit-learn model is read
    keeps the sklearn plugin's ``predict``, as a subclass of MLServer's
    ``SKLearnModel`` that overrides ``load`` does.  Hooks without ``model``
    (``register_routes``, ``log_request``, ...) are the manager's own.
    """
    owners = [loaded_by] if loaded_by else []
    if plugin and (not loaded_by or loaded_by.startswith(MODEL_PY_PREFIX)):
        owners.append(plugin)
    roots = {_root(pm, name) for name in owners}
    relay = pluggy.HookRelay()
    for name, caller in vars(pm.hook).items():
        if caller.spec is not None and "model" in caller.spec.argnames:
            others = [
                impl.plugin
                for impl in caller.get_hookimpls()
                if not (impl.wrapper or impl.hookwrapper) and not _owned(impl.plugin_name, roots)
            ]
            caller = pm.subset_hook_caller(name, remove_plugins=others)
        setattr(relay, name, caller)
    return relay


def _root(pm: pluggy.PluginManager, name: str) -> str:
    """The name a plugin was registered under: ``model.py:iris`` for its class ``model.py:iris.Model``."""
    parent = name.rsplit(".", 1)[0]
    return parent if "." in name and pm.has_plugin(parent) else name


def _owned(name: str, roots: Iterable[str]) -> bool:
    if name.startswith(MODEL_PY_PREFIX):  # a per-model manager holds only this model's model.py
        return True
    return any(name == root or name.startswith(root + ".") for root in roots)


def describe(pm: pluggy.PluginManager) -> list[PluginInfo]:
    """Installed plugins and the hooks each implements (``servekit plugins``)."""
    infos: dict[str, PluginInfo] = {}
    for name, plugin in pm.list_name_plugin():
        if plugin is None:
            continue
        top = name.split(".", 1)[0]
        hooks = sorted(h.name for h in pm.get_hookcallers(plugin) or [])
        info = infos.setdefault(top, PluginInfo(top, [], _source_of(pm, name)))
        info.hooks = sorted(set(info.hooks) | set(hooks))
        info.missing = sorted(set(info.missing) | set(missing_libraries(plugin)))
    return sorted(infos.values(), key=lambda i: i.name)
