"""Model processes: a model version served by its own host process(es) instead of every HTTP worker.

``placement: process`` in a model's ``servekit.yaml`` (or ``--placement
process`` for every model) loads the version once, in a *model host*, and the
HTTP workers and gRPC servers hand it their requests: the adaptive batcher
then sees the traffic of all workers, and a model whose ``predict`` holds the
GIL no longer starves request parsing.  ``replicas: N`` starts N hosts that
take calls in turn.  A CUDA model (``device: cuda`` or ``cuda:N``) always gets
exactly one host: one CUDA context per device, batching in one place.

Linux only: the hand-off uses Unix sockets and ``/dev/shm``
(:mod:`.channel`); :mod:`.runtime` keeps the server's hosts together and
cleans up after them; :mod:`.host` is the host process; :mod:`.client` the
worker side; :mod:`.calls` names the kinds of message between them.  See
docs/model-processes.md.

The shadow process (:mod:`.shadow`, its worker side :mod:`.shadow_pipe`) loads
versions the same way: it runs a worker's ``shadow:`` copies at idle CPU priority
(docs/traffic-control.md).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pluggy

from servekit.hooks.specs import hookimpl
from servekit.hosts.runtime import cleanup, default_placement, in_host, prepare_server
from servekit.types import BatchingConfig, LoadedVersion, ModelConfig

__all__ = ["attach", "cleanup", "load_spec", "placement_of", "prepare_server"]

log = logging.getLogger("servekit.hosts")


def placement_of(config: ModelConfig) -> tuple[str, int]:
    """Where a version runs and in how many hosts: ``("worker", 1)`` or ``("process", N)``."""
    if in_host():
        return "worker", 1
    device = str(getattr(config, "device", "auto") or "auto")
    replicas = int(getattr(config, "replicas", 1) or 1)
    if device.startswith("cuda"):
        if replicas > 1:
            log.warning(
                "device %s: one model host per device (one CUDA context); replicas: %d ignored", device, replicas
            )
        return "process", 1
    placement = getattr(config, "placement", None)
    if getattr(config, "pipeline", None) is not None:
        return "worker", 1  # its steps run where their own models are placed
    if getattr(config, "sequence", None) is not None and placement != "worker":
        return "process", 1  # one state per sequence, whichever worker a request reaches (servekit.dataplane.sequences)
    placement = placement or default_placement()
    return (placement, replicas) if placement == "process" else ("worker", 1)


def attach(mv: LoadedVersion, pm: pluggy.PluginManager, batching: BatchingConfig, replicas: int) -> None:
    """Serve ``mv`` from host processes: start them if this server has none yet, read the metadata."""
    from servekit.hooks import manager as plugins
    from servekit.hosts import client, runtime

    folder = runtime.ensure()
    from servekit.control.plan import config_key

    # a load with other settings (a config override) gets hosts of its own
    settings = f"{mv.config.device}|{config_key(mv.raw_config)}"
    key = client.host_key(mv.name, mv.version, mv.path, mv.fingerprint, settings)
    spec = {
        **load_spec(mv),
        "plugins": plugin_specs(pm),
        "batching": [batching.max_batch_size, batching.max_batch_time_ms],
        "folder": str(folder),
        "key": key,
        "log_level": logging.getLevelName(logging.getLogger().level),
    }
    host = client.HostClient(spec, replicas)
    host.start()
    client.clients.add(host)
    mv.executor = host  # the data plane hands this version's calls to its hosts
    mv.model = host
    local = plugins.new_manager()  # nothing of the model runs in this process...
    tokenizer = host.tokenizer()
    if tokenizer is not None:  # ...but chat templates and token counts run where the request is parsed
        local.register(_Tokenizer(tokenizer), name="servekit.hosts.tokenizer")
    mv.hooks = local.hook
    mv.metadata = host.metadata


class _Tokenizer:
    """Answers the ``tokenizer`` hook in a worker with a copy of the host's model's tokenizer."""

    def __init__(self, tokenizer: Any):
        self.value = tokenizer

    @hookimpl
    def tokenizer(self) -> Any:
        return self.value


def load_spec(mv: LoadedVersion) -> dict[str, Any]:
    """What another process loads ``mv`` from, as its worker loaded it (a model host, a shadow process)."""
    return {
        "name": mv.name,
        "version": mv.version,
        "path": str(mv.path),
        "base_path": str(mv.config.base_path or mv.path.parent),
        "fingerprint": mv.fingerprint,
        "config": mv.raw_config,  # the settings the control plane decided, not a fresh read of the folder
    }


def plugin_specs(pm: pluggy.PluginManager) -> list[str]:
    """The ``--plugin`` entries a manager was built from; installed plugins load by themselves."""
    sources: dict[str, str] = getattr(pm, "_servekit_sources", {})
    specs = []
    for name, source in sources.items():
        own_name = Path(source).stem if source.endswith(".py") else source
        if name == own_name and source not in specs:
            specs.append(source)
    return specs
