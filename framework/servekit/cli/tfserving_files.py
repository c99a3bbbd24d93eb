"""TF Serving's config files, read for :mod:`servekit.cli.tfserving`.

``--model_config_file`` (text-format ``ModelServerConfig``, parsed with
protobuf's ``text_format`` against servekit's copy of the proto),
``--batching_parameters_file`` and ``--monitoring_config_file``; and the
:class:`ConfigFileFolders` that serves a model config file: a generated folder per model
linking to every entry of its ``base_path``, with the merged ``servekit.yaml``.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from servekit import storage
from servekit.errors import BadRequest
from servekit.folders.tf_serving_config import served_model

log = logging.getLogger("servekit.tfserving")

#: TF Serving's default Prometheus path (also served without a monitoring config).
PROMETHEUS_PATH = "/monitoring/prometheus/metrics"
#: TF Serving's default batching parameters when ``--enable_batching`` has no file.
DEFAULT_MAX_BATCH_SIZE = 1000


class FlagError(ValueError):
    """A flag or a config file servekit cannot honour; the message names it."""


# -- text-format config files ----------------------------------------------------------------


def _parse_text(path: str, message: Any, flag: str) -> Any:
    from google.protobuf import text_format

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise FlagError(f"--{flag}: cannot read {path}: {exc.strerror}") from None
    try:
        return text_format.Parse(text, message)
    except text_format.ParseError as exc:
        # TF Serving's own wording (its testBadModelConfig looks for it on stderr)
        raise FlagError(f"--{flag}: Error parsing text-format {message.DESCRIPTOR.full_name}: {path}: {exc}") from None


@dataclass
class ServedModel:
    """One ``ModelConfig`` entry of a ``--model_config_file``, as servekit will serve it."""

    name: str
    base_path: Path | str  # a str: an s3://, gs:// or https:// URI (servekit.storage)
    version_policy: Any = None  # servekit.yaml's form; None: the folder's own
    labels: dict[str, int] = field(default_factory=dict)


def read_model_config_file(path: str) -> list[ServedModel]:
    from servekit.protocols.grpc.protos.tensorflow_serving.config import model_server_config_pb2 as pb

    config = _parse_text(path, pb.ModelServerConfig(), "model_config_file")
    if config.WhichOneof("config") == "custom_model_config":
        raise FlagError("--model_config_file: custom_model_config is not supported; use model_config_list")
    try:
        models = [_served(served_model(e, "--model_config_file")) for e in config.model_config_list.config]
    except BadRequest as exc:
        raise FlagError(exc.message) from None
    names = [m.name for m in models]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise FlagError(f"--model_config_file: model {repeated[0]!r} is configured twice")
    return models


def _served(doc: dict[str, Any]) -> ServedModel:
    overrides = doc["overrides"]
    base = str(doc["base_path"])
    return ServedModel(
        doc["name"],
        base if storage.is_uri(base) else Path(base),
        overrides.get("version_policy"),
        dict(overrides.get("labels", {})),
    )


def read_batching_file(path: str) -> tuple[int, float]:
    """``(max_batch_size, max_batch_time_ms)`` from a ``--batching_parameters_file``."""
    from servekit.protocols.grpc.protos.tensorflow_serving.config import batching_parameters_pb2 as pb

    params = _parse_text(path, pb.BatchingParameters(), "batching_parameters_file")
    if params.allowed_batch_sizes or params.pad_variable_length_inputs:
        raise FlagError(
            "--batching_parameters_file: allowed_batch_sizes and pad_variable_length_inputs are not "
            "supported; servekit batches requests of equal trailing shape, any batch size"
        )
    for name in (
        "num_batch_threads",
        "max_enqueued_batches",
        "thread_pool_name",
        "max_execution_batch_size",
        "enable_large_batch_splitting",
    ):
        if params.HasField(name):
            # scheduler tuning of TF's batcher: servekit's batcher runs in the request threads
            log.warning("--batching_parameters_file: %s has no servekit counterpart; not applied", name)
    size = params.max_batch_size.value if params.HasField("max_batch_size") else DEFAULT_MAX_BATCH_SIZE
    micros = params.batch_timeout_micros.value if params.HasField("batch_timeout_micros") else 0
    return int(size), micros / 1000.0


def check_monitoring_file(path: str) -> None:
    """Prometheus is always on; a custom path other than TF Serving's or ``/metrics`` is refused."""
    from servekit.protocols.grpc.protos.tensorflow_serving.config import monitoring_config_pb2 as pb

    config = _parse_text(path, pb.MonitoringConfig(), "monitoring_config_file")
    wanted = config.prometheus_config.path
    if wanted and wanted not in (PROMETHEUS_PATH, "/metrics"):
        raise FlagError(
            f"--monitoring_config_file: prometheus_config.path {wanted!r} is not supported; "
            f"servekit serves metrics at {PROMETHEUS_PATH} and /metrics"
        )


# -- serving a model config file ----------------------------------------------------------------

_CONFIG = "servekit.yaml"


class ConfigFileFolders:
    """Generated model folders for a ``--model_config_file``: links to ``base_path`` + servekit.yaml."""

    def __init__(self, config_file: str):
        self.config_file = config_file
        self.root = Path(tempfile.mkdtemp(prefix="servekit-tfserving-"))
        self.models = {m.name: m for m in read_model_config_file(config_file)}
        self._stop = threading.Event()
        self.sync()

    @property
    def paths(self) -> list[str]:
        return [str(self.root / name) for name in sorted(self.models)]

    def sync(self) -> None:
        for model in list(self.models.values()):
            _sync_folder(self.root / model.name, model)
        for folder in self.root.iterdir():
            if folder.name not in self.models:  # dropped by a reload, which has unloaded it by now
                shutil.rmtree(folder, ignore_errors=True)

    def adopt(self, models: list[ServedModel]) -> dict[str, tuple[str, dict[str, Any]]]:
        """Serve ``models`` from now on: their folders, as the control plane's ``replace`` takes them.

        :raises BadRequest: a base path in storage that cannot be read, named.
        """
        fresh = {m.name: m for m in models}
        for model in fresh.values():
            try:
                _sync_folder(self.root / model.name, model)
            except storage.StorageError as exc:
                raise BadRequest(f"model {model.name!r}: {exc}") from None
        self.models = fresh
        return {name: (str(self.root / name), {}) for name in sorted(fresh)}

    def adopt_documents(self, models: list[dict[str, Any]]) -> dict[str, tuple[str, dict[str, Any]]]:
        """:meth:`adopt` for a ``HandleReloadConfigRequest``'s models."""
        return self.adopt([_served(doc) for doc in models])

    def reload(self) -> None:
        """Re-read the config file; when it changed, every worker serves the new model set."""
        try:
            fresh = read_model_config_file(self.config_file)
        except FlagError as exc:
            log.error("%s; keeping the previous configuration", exc)
            return
        if {m.name: m for m in fresh} == self.models:
            return
        from servekit.control import transport

        owner = transport.local_owner()
        try:
            entries = self.adopt(fresh)
        except BadRequest as exc:
            log.error("--model_config_file: %s; keeping the previous configuration", exc.message)
            return
        if owner is None:
            log.error("--model_config_file changed, but no control plane runs here to apply it")
            return
        log.info("--model_config_file changed: serving %s", ", ".join(entries) or "no model")
        try:
            owner.replace(entries)
        except Exception as exc:
            log.error("the new --model_config_file did not apply everywhere: %s", exc)

    def watch(self, poll_seconds: float, reload_seconds: float) -> None:
        """Keep the folders in step in a daemon thread (in gunicorn's master)."""
        interval = min(s for s in (poll_seconds, reload_seconds, 60.0) if s > 0)
        thread = threading.Thread(
            target=self._run, args=(interval, reload_seconds), name="servekit-tfserving-config", daemon=True
        )
        thread.start()

    def _run(self, interval: float, reload_seconds: float) -> None:
        waited = 0.0
        while not self._stop.wait(interval):
            waited += interval
            if reload_seconds > 0 and waited >= reload_seconds:
                waited = 0.0
                self.reload()
            try:
                self.sync()
            except (OSError, storage.StorageError) as exc:  # a base_path may vanish for a while; keep watching
                if not self._stop.is_set():
                    log.warning("cannot mirror a model folder: %s", exc)

    def close(self) -> None:
        self._stop.set()
        shutil.rmtree(self.root, ignore_errors=True)


def _sync_folder(folder: Path, model: ServedModel) -> None:
    folder.mkdir(exist_ok=True)
    base = _base_folder(model)
    # of a storage cache, not its state file and downloads in flight (dot entries): the
    # generated folder must not look like a cache folder itself
    remote = isinstance(model.base_path, str)
    wanted = (
        {e.name: e for e in base.iterdir() if e.name != _CONFIG and not (remote and e.name.startswith("."))}
        if base.is_dir()
        else {}
    )
    for entry in folder.iterdir():
        if entry.name != _CONFIG and entry.name not in wanted:
            entry.unlink()
    for name, target in wanted.items():
        link = folder / name
        if not link.is_symlink():
            link.symlink_to(target, target_is_directory=target.is_dir())
    text = yaml.safe_dump(_merged_config(base, model), sort_keys=True)
    config = folder / _CONFIG
    if not config.is_file() or config.read_text() != text:
        tmp = folder / (_CONFIG + ".tmp")  # written whole, then renamed: a poll never reads half
        tmp.write_text(text)
        tmp.replace(config)


def _base_folder(model: ServedModel) -> Path:
    """The model's ``base_path`` as a local folder: a URI's cache folder, synced now.

    Its versions are downloaded by the config's version policy (else the stored
    folder's own), so the generated folder links to local version folders only.
    """
    if not isinstance(model.base_path, str):
        return model.base_path.resolve()
    if model.version_policy is None:
        return storage.prepare(model.base_path)
    from servekit.folders.servekit_yaml import parse_model_config, read_raw_config, select_versions

    def policy(cached: Path) -> Any:
        raw = {**read_raw_config(cached), "version_policy": model.version_policy}
        chosen = parse_model_config(raw, cached).version_policy
        return lambda versions: select_versions(chosen, versions)

    return storage.prepare(model.base_path, select=policy)


def _merged_config(base: Path, model: ServedModel) -> dict[str, Any]:
    own = base / _CONFIG
    merged = (yaml.safe_load(own.read_text()) or {}) if own.is_file() else {}
    if model.version_policy is not None:
        merged["version_policy"] = model.version_policy
    if model.labels:
        merged["labels"] = dict(model.labels)
    return merged
