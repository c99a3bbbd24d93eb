"""servekit: plugin-based serving for custom model containers.

This module is the public face, and the plugin API is exactly three modules:

- ``servekit``: :data:`hookimpl`, and the helpers a framework plugin needs (finding
  its artifact, CPUs and devices, tabular rows, V2 datatypes, generation metrics,
  loading a ``model.py`` or another plugin); listed in :data:`PLUGIN_API`;
- :mod:`servekit.errors`: the error tree, each class with its HTTP status;
- :mod:`servekit.types`: metadata, settings and the generation types.

``docs/writing-plugins.md`` lists them.  Nothing inside servekit imports this
module: it sits above every layer.  The helpers are imported on first use, so
``import servekit`` stays light.

Modules moved in 0.2.0 (``servekit.model_files``, ``servekit.plugins``, ...)
still import under their old names for one release, with a
``DeprecationWarning`` naming the new place (:data:`MOVED`).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import TYPE_CHECKING, Any

from servekit.errors import BadRequest, NotFound, ServekitError
from servekit.hooks.specs import hookimpl
from servekit.types import ModelConfig, ModelMetadata, Signature, TensorSpec
from servekit.version import __version__

if TYPE_CHECKING:  # what PLUGIN_API hands out, for type checkers
    from servekit.codecs.dtypes import TF_TO_V2, V2_TO_NUMPY, numpy_to_v2
    from servekit.codecs.tabular import example_rows, feature_rows
    from servekit.folders.artifacts import find_artifact, header, is_lightgbm_text
    from servekit.hooks.manager import ENTRY_POINT_GROUP, import_file, new_manager
    from servekit.hosts.runtime import in_host
    from servekit.observability.generation_metrics import generation_gauges
    from servekit.server.cpus import available_cpus, cpus_per_worker

#: The helpers for plugins, by name → the module that holds them (imported on first use).
PLUGIN_API = {
    # a version folder's artifact, laid out as servekit's peers lay it out (docs/frameworks.md)
    "find_artifact": "servekit.folders.artifacts",
    "header": "servekit.folders.artifacts",
    "is_lightgbm_text": "servekit.folders.artifacts",
    # CPUs this process may use (cgroup quota and affinity), and its share among the workers
    "available_cpus": "servekit.server.cpus",
    "cpus_per_worker": "servekit.server.cpus",
    # whether this process is a model host (placement: process)
    "in_host": "servekit.hosts.runtime",
    # TF Serving's examples / pandas frames as rows of named features
    "example_rows": "servekit.codecs.tabular",
    "feature_rows": "servekit.codecs.tabular",
    # V2 datatype names
    "numpy_to_v2": "servekit.codecs.dtypes",
    "V2_TO_NUMPY": "servekit.codecs.dtypes",
    "TF_TO_V2": "servekit.codecs.dtypes",
    # a generative model's gauges on /metrics (running and waiting sequences, KV cache)
    "generation_gauges": "servekit.observability.generation_metrics",
    # a model folder's model.py, and the plugins installed under servekit's entry-point group
    "import_file": "servekit.hooks.manager",
    "ENTRY_POINT_GROUP": "servekit.hooks.manager",
    "new_manager": "servekit.hooks.manager",
}


def __getattr__(name: str) -> Any:
    module = PLUGIN_API.get(name)
    if module is None:
        raise AttributeError(f"module 'servekit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "BadRequest",
    "ModelConfig",
    "ModelMetadata",
    "NotFound",
    "ServekitError",
    "Signature",
    "TensorSpec",
    "__version__",
    "hookimpl",
    "find_artifact",
    "header",
    "is_lightgbm_text",
    "available_cpus",
    "cpus_per_worker",
    "in_host",
    "example_rows",
    "feature_rows",
    "numpy_to_v2",
    "V2_TO_NUMPY",
    "TF_TO_V2",
    "generation_gauges",
    "import_file",
    "ENTRY_POINT_GROUP",
    "new_manager",
]


# -- the old module paths, for one release -----------------------------------------------------

#: Modules that moved in 0.2.0, old name → new name.  Imported under the old name, each
#: warns once and is the new module itself (one module object, not a copy).
MOVED = {
    "servekit.auth": "servekit.server.auth",
    "servekit.batching": "servekit.dataplane.batching",
    "servekit.call_gate": "servekit.dataplane.call_gate",
    "servekit.classification": "servekit.dataplane.classification",
    "servekit.config": "servekit.folders.servekit_yaml",
    "servekit.cpus": "servekit.server.cpus",
    "servekit.generation": "servekit.dataplane.generation",
    "servekit.hookspecs": "servekit.hooks.specs",
    "servekit.inference": "servekit.codecs.infer_request",
    "servekit.limits": "servekit.server.limits",
    "servekit.log_commands": "servekit.cli.logs",
    "servekit.long_lived": "servekit.control.long_lived",
    "servekit.model_control": "servekit.protocols.model_control",
    "servekit.model_files": "servekit.folders.artifacts",
    "servekit.model_folders": "servekit.folders.layout",
    "servekit.pbtxt": "servekit.folders.pbtxt",
    "servekit.pipeline": "servekit.folders.pipeline",
    "servekit.plugins": "servekit.hooks.manager",
    "servekit.protocols.grpc.server": "servekit.server.grpc_server",
    "servekit.repository": "servekit.dataplane.repository",
    "servekit.scaffold_cli": "servekit.cli.scaffold",
    "servekit.scaffold_render": "servekit.scaffold.render",
    "servekit.scaffold_settings": "servekit.scaffold.build_settings",
    "servekit.sequences": "servekit.dataplane.sequences",
    "servekit.settings": "servekit.server.settings",
    "servekit.shared_memory": "servekit.codecs.shared_memory",
    "servekit.sibling_imports": "servekit.hooks.sibling_imports",
    "servekit.startup_time": "servekit.scaffold.startup_time",
    "servekit.statistics": "servekit.observability.statistics",
    "servekit.tabular": "servekit.codecs.tabular",
    "servekit.tally": "servekit.observability.tally",
    "servekit.tf_model_config": "servekit.folders.tf_serving_config",
    "servekit.tfserving_cli": "servekit.cli.tfserving",
    "servekit.tfserving_config": "servekit.cli.tfserving_files",
    "servekit.tls": "servekit.server.tls",
    "servekit.triton_model_config": "servekit.folders.triton_config",
    "servekit.warmup": "servekit.protocols.warmup",
    "servekit.watchdog": "servekit.server.watchdog",
    "servekit.wsgi_body": "servekit.observability.wsgi_body",
}


def moved_warning(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new} in servekit 0.2.0; the old name goes in 0.3.0", DeprecationWarning, 3)


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old module name and hands back the module under its new name."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None  # a placeholder; exec_module puts the real module in its place

    def exec_module(self, module: ModuleType) -> None:
        new = MOVED[module.__name__]
        moved_warning(module.__name__, new)
        # the import system returns what sys.modules holds once this returns
        sys.modules[module.__name__] = importlib.import_module(new)

    def get_code(self, fullname: str) -> Any:
        """The new module's code, for ``python -m OLD_NAME`` (runpy asks the loader for it)."""
        new = MOVED[fullname]
        moved_warning(fullname, new)
        parent = importlib.import_module(new.rpartition(".")[0])
        spec = importlib.machinery.PathFinder.find_spec(new, parent.__path__)  # the source file's own loader
        assert spec is not None and spec.loader is not None
        return spec.loader.get_code(new)  # type: ignore[attr-defined]

    def is_package(self, fullname: str) -> bool:
        return False


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())
