"""One model of TF Serving's ``ModelServerConfig``, as the control plane serves it.

Read from a ``--model_config_file`` (:mod:`servekit.cli.tfserving_files`) and from a
``HandleReloadConfigRequest`` (:mod:`servekit.protocols.grpc.tf_serving`): a
``ModelConfig`` entry becomes ``{"name", "base_path", "overrides"}``, its
``model_version_policy`` and ``version_labels`` the ``servekit.yaml`` settings
laid over the folder's own.
"""

from __future__ import annotations

from typing import Any

from servekit.errors import BadRequest


def served_model(entry: Any, where: str = "the model config") -> dict[str, Any]:
    """One ``ModelConfig`` message as ``{"name", "base_path", "overrides"}``.

    :raises BadRequest: a setting servekit cannot honour, named.
    """
    what = f"{where}: model {entry.name!r}"
    if not entry.name or not entry.base_path:
        raise BadRequest(f"{what}: every config needs a name and a base_path")
    if entry.model_platform not in ("", "tensorflow"):
        raise BadRequest(
            f"{what}: model_platform {entry.model_platform!r} is not supported; servekit picks "
            "the plugin from the model folder ('tensorflow' or leave it out)"
        )
    if entry.HasField("logging_config"):
        raise BadRequest(f"{what}: logging_config is not supported; use servekit's --request-log-url")
    overrides: dict[str, Any] = {}
    if entry.HasField("model_version_policy"):
        overrides["version_policy"] = version_policy(entry.model_version_policy, what)
    if entry.version_labels:
        overrides["labels"] = dict(entry.version_labels)
    return {"name": entry.name, "base_path": entry.base_path, "overrides": overrides}


def version_policy(policy: Any, what: str) -> Any:
    """A ``FileSystemStoragePathSourceConfig.ServableVersionPolicy`` in servekit.yaml's form."""
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return "all"
    if choice == "specific":
        if not policy.specific.versions:
            raise BadRequest(f"{what}: a specific version policy needs versions")
        return {"specific": list(policy.specific.versions)}
    n = policy.latest.num_versions if choice == "latest" else 1
    return {"latest": max(1, n)}
