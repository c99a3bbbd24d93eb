"""What TF Serving says about a model, built once for its REST API and its gRPC API.

TF Serving's REST answers are the protobuf JSON mapping of its gRPC messages,
so each document is built here once as JSON: :mod:`.v1` sends it as is, and
:mod:`.grpc.tf_serving` fills its message from the same dict
(``json_format.ParseDict``).  The one difference is a signature's default
values: JSON writes them as plain values, gRPC as ``TensorProto`` (added by the
gRPC side, which owns that encoding).

The status document is also what KServe V1 and OpenAI clients read at
``/v1/models/NAME`` (:mod:`.openai` answers it under its other prefixes).
"""

from __future__ import annotations

from typing import Any

from servekit.codecs.dtypes import V2_TO_TF
from servekit.dataplane.data_plane import DataPlane
from servekit.dataplane.repository import ModelVersion
from servekit.types import ModelMetadata, Signature, TensorSpec

# -- status ---------------------------------------------------------------------------------


def version_status(mv: ModelVersion) -> dict[str, Any]:
    """One ``ModelVersionStatus``."""
    return {
        "version": str(mv.version),
        "state": mv.state.value,
        "status": {"error_code": "UNKNOWN" if mv.error else "OK", "error_message": mv.error},
    }


def model_status(dp: DataPlane, name: str, version: Any = None, label: str | None = None) -> dict[str, Any]:
    """One document every client of the path reads: TF Serving, KServe V1 and OpenAI."""
    statuses = dp.statuses(name, version, label)
    return {
        # KServe V1's model readiness ({"name", "ready"}), as its InferenceRESTClient reads it
        "name": name,
        "ready": any(mv.ready for mv in statuses),
        # OpenAI's model object, so OpenAI clients read the same route
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": "servekit",
        "model_version_status": [version_status(mv) for mv in statuses],
    }


# -- metadata -------------------------------------------------------------------------------


def tensor_info(spec: TensorSpec) -> dict[str, Any]:
    if spec.shape is None:
        shape: dict[str, Any] = {"dim": [], "unknown_rank": True}
    else:
        shape = {"dim": [{"size": str(d), "name": ""} for d in spec.shape], "unknown_rank": False}
    return {
        "dtype": V2_TO_TF.get(spec.datatype, "DT_INVALID"),
        "tensor_shape": shape,
        "name": spec.tensor_name if spec.tensor_name is not None else spec.name,
    }


def signature_def(signature: Signature) -> dict[str, Any]:
    """A ``SignatureDef`` without its defaults (each wire writes those its own way)."""
    return {
        "inputs": {t.name: tensor_info(t) for t in signature.inputs},
        "outputs": {t.name: tensor_info(t) for t in signature.outputs},
        "method_name": signature.method_name,
    }


def metadata_json(mv: ModelVersion, meta: ModelMetadata) -> dict[str, Any]:
    """TF Serving's ``GetModelMetadataResponse`` as its REST API writes it."""
    signatures = {}
    for name, sig in meta.signatures.items():
        signatures[name] = signature_def(sig)
        if sig.defaults is not None:
            signatures[name]["defaults"] = sig.defaults
    return {
        "model_spec": {"name": mv.name, "signature_name": "", "version": str(mv.version)},
        "metadata": {"signature_def": {"signature_def": signatures}},
    }
