"""``options.model_uri``: a model from an MLflow tracking server or registry, downloaded at load.

``models:/churn/3``, ``models:/churn@champion`` or ``runs:/RUN_ID/model`` are
resolved by mlflow itself (``mlflow.artifacts.download_artifacts``) against
``options.tracking_uri`` (else ``MLFLOW_TRACKING_URI``) and
``options.registry_uri`` (else the tracking server), into a temporary
folder of this server's own, never into the model folder (which may be read
only); the folder is removed when the version unloads.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .mlmodel import MLMODEL

_uri_lock = threading.Lock()


def download(uri: str, options: dict[str, Any]) -> tuple[Path, Path]:
    """The MLflow model folder ``uri`` names, on local disk, and the temporary folder holding it
    (removed at unload); a ValueError saying why when it cannot be had."""
    try:
        import mlflow.artifacts
        from mlflow.exceptions import MlflowException
    except ImportError:
        raise ValueError(f"options.model_uri {uri!r} needs mlflow (pip install servekit[mlflow])") from None
    target = Path(tempfile.mkdtemp(prefix="servekit-mlflow-"))
    tracking = options.get("tracking_uri")
    # the registry is the tracking server unless said otherwise, as for mlflow's own clients
    registry = options.get("registry_uri") or tracking
    try:
        with _tracking(tracking, registry):
            local = Path(
                mlflow.artifacts.download_artifacts(
                    artifact_uri=uri, dst_path=str(target), tracking_uri=tracking, registry_uri=registry
                )
            )
    except (MlflowException, OSError) as exc:
        shutil.rmtree(target, ignore_errors=True)
        message = getattr(exc, "message", None) or str(exc)
        raise ValueError(
            f"options.model_uri {uri!r}: mlflow could not download it ({message.splitlines()[0]})"
        ) from exc
    if not (local / MLMODEL).is_file():
        shutil.rmtree(target, ignore_errors=True)
        raise ValueError(f"options.model_uri {uri!r} holds no {MLMODEL} file: not an MLflow model")
    return local, target


@contextmanager
def _tracking(tracking: str | None, registry: str | None) -> Iterator[None]:
    """mlflow's process-wide tracking and registry URIs set to these, for one download.

    ``download_artifacts`` takes both URIs, but for ``models:/`` mlflow (3.x) resolves the
    version with a client built on the process-wide tracking URI, not the one passed; so
    they are set around the call, one download at a time, and put back after.
    """
    if not tracking and not registry:
        yield
        return
    import mlflow

    with _uri_lock:
        before = (mlflow.get_tracking_uri(), mlflow.get_registry_uri())
        if tracking:
            mlflow.set_tracking_uri(tracking)
        if registry:
            mlflow.set_registry_uri(registry)
        try:
            yield
        finally:
            mlflow.set_tracking_uri(before[0])
            mlflow.set_registry_uri(before[1])
