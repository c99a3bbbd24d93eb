"""SignatureDef protos as servekit's :class:`ModelMetadata`.

The core renders this back into TF Serving's ``GetModelMetadataResponse`` JSON,
so everything TF Serving shows is kept: every signature (the TF2 init-op one
included), the graph tensor names, ``-1`` for unknown dimensions, unknown rank,
and the method names.
"""

from __future__ import annotations

from typing import Any

from servekit import TF_TO_V2
from servekit.types import ModelMetadata, Signature, TensorSpec

#: TensorFlow dtypes beyond the core's table, by their V2 names where V2 has one.
_EXTRA_V2 = {"DT_BFLOAT16": "BF16"}


def tf_dtype_name(dtype: int) -> str:
    """``DT_FLOAT`` for the enum value 1, and so on."""
    from tensorflow.core.framework import types_pb2

    try:
        return types_pb2.DataType.Name(dtype)
    except ValueError:
        return "DT_INVALID"


def v2_datatype(dtype: int) -> str:
    name = tf_dtype_name(dtype)
    return TF_TO_V2.get(name) or _EXTRA_V2.get(name) or name.removeprefix("DT_")


def tensor_spec(key: str, info: Any) -> TensorSpec:
    """One TensorInfo.  Graphs from TF 1.0 record no shape at all; that is unknown, not scalar."""
    shape_proto = info.tensor_shape
    if not info.HasField("tensor_shape") or shape_proto.unknown_rank:
        shape = None
    else:
        shape = [int(d.size) for d in shape_proto.dim]
    encoding = info.WhichOneof("encoding")
    if encoding == "coo_sparse":
        tensor_name = info.coo_sparse.values_tensor_name
    else:
        tensor_name = info.name
    # NaN and infinity reach the graph, as TF Serving passes them (a float that overflows float32 is one)
    return TensorSpec(
        name=key,
        datatype=v2_datatype(info.dtype),
        shape=shape,
        tensor_name=tensor_name,
        allow_nan=True,
        allow_infinity=True,
    )


def signature(sig_def: Any) -> Signature:
    """One SignatureDef.

    ``defaults`` is ``{}`` for a signature with a method and ``None`` for the
    method-less init-op signature, as TF Serving's recorded metadata shows them;
    default values themselves are not described.
    """
    return Signature(
        inputs=[tensor_spec(k, v) for k, v in sorted(sig_def.inputs.items())],
        outputs=[tensor_spec(k, v) for k, v in sorted(sig_def.outputs.items())],
        method_name=sig_def.method_name,
        defaults={} if sig_def.method_name else None,
    )


def describe(signature_defs: dict[str, Any]) -> ModelMetadata:
    return ModelMetadata(
        signatures={name: signature(sig) for name, sig in signature_defs.items()},
        platform="tensorflow",
    )
