"""Datatypes and devices: request arrays into torch tensors on the model's device, and back.

JSON has one number type, so V1 requests arrive as float64 or int64 arrays; V2
requests carry their own datatype.  An array is cast to the dtype the model
declares (in ``servekit.yaml``, in a ``torch.export`` program, or, for floating
arrays, through the dtype of its floating parameters); a model that declares
nothing (no options, no floating parameters: an identity, a pure function) is
fed the client's datatype as is, so servekit never narrows or widens a tensor on
its own.  A cast that would change a value (an integer out of range, a fraction
into an integer input) is refused with a 400.  Rounding a float to a narrower
float is accepted, beyond its range to +/-inf as IEEE rounding has it: that is
what feeding a float32 model means, and what TensorFlow Serving does with JSON
numbers (its json_tensor test "FloatTensorThatExceedsMaxReturnsInf").

bfloat16 has no numpy dtype: it travels as FP32 on the wire both ways.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from servekit.errors import BadRequest, ModelFailure

#: torch dtype name -> (torch dtype, numpy dtype on the wire, V2 datatype on the wire)
DTYPES: dict[str, tuple[torch.dtype, np.dtype, str]] = {
    "bool": (torch.bool, np.dtype(np.bool_), "BOOL"),
    "uint8": (torch.uint8, np.dtype(np.uint8), "UINT8"),
    "int8": (torch.int8, np.dtype(np.int8), "INT8"),
    "int16": (torch.int16, np.dtype(np.int16), "INT16"),
    "int32": (torch.int32, np.dtype(np.int32), "INT32"),
    "int64": (torch.int64, np.dtype(np.int64), "INT64"),
    "float16": (torch.float16, np.dtype(np.float16), "FP16"),
    "bfloat16": (torch.bfloat16, np.dtype(np.float32), "FP32"),
    "float32": (torch.float32, np.dtype(np.float32), "FP32"),
    "float64": (torch.float64, np.dtype(np.float64), "FP64"),
}

#: names accepted in ``options.inputs`` (V2 names, Triton's BF16, torch names)
ALIASES = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "BF16": "bfloat16",
    "FP32": "float32",
    "FP64": "float64",
    "half": "float16",
    "float": "float32",
    "double": "float64",
    "long": "int64",
    "int": "int32",
}

_NAME_OF = {torch_dtype: name for name, (torch_dtype, _, _) in DTYPES.items()}


def dtype_name(value: Any) -> str:
    """Normalise a datatype from ``servekit.yaml`` or a torch dtype to a torch dtype name."""
    if isinstance(value, torch.dtype):
        if value not in _NAME_OF:
            raise ValueError(f"torch dtype {value} has no wire datatype servekit can serve")
        return _NAME_OF[value]
    text = str(value)
    name = ALIASES.get(text, ALIASES.get(text.upper(), text.removeprefix("torch.")))
    if name not in DTYPES:
        raise ValueError(
            f"unknown datatype {value!r}; expected a V2 name (BOOL, UINT8, INT8..INT64, FP16, "
            f"BF16, FP32, FP64) or a torch dtype name ({', '.join(DTYPES)})"
        )
    return name


def wire_datatype(name: str) -> str:
    """The V2 datatype clients send and receive for a torch dtype name."""
    return DTYPES[name][2]


def is_floating(name: str) -> bool:
    return DTYPES[name][0].is_floating_point


# ---------------------------------------------------------------------------
# Devices
# ---------------------------------------------------------------------------


def resolve_device(requested: str) -> torch.device:
    """``auto`` is CUDA when torch sees a GPU, else CPU; ``cuda``/``cuda:N`` must exist.

    Asking for a GPU that is not there fails the load with a message saying why,
    rather than quietly serving on the CPU at a fraction of the expected speed.
    """
    requested = (requested or "auto").strip()
    if requested == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    if requested == "cpu":
        return torch.device("cpu")
    if requested == "cuda" or requested.startswith("cuda:"):
        if not torch.cuda.is_available():
            reason = (
                "this torch build has no CUDA support"
                if torch.version.cuda is None
                else "torch.cuda.is_available() is False (no GPU visible)"
            )
            raise ValueError(f"device {requested!r} was requested but {reason}; use device: auto or cpu")
        index_text = requested.partition(":")[2]
        if index_text and not index_text.isdigit():
            raise ValueError(f"device {requested!r}: expected cuda:N with N a GPU index")
        index = int(index_text) if index_text else torch.cuda.current_device()
        count = torch.cuda.device_count()
        if index >= count:
            raise ValueError(f"device {requested!r} was requested but only {count} GPU(s) are visible")
        return torch.device("cuda", index)
    raise ValueError(f"unknown device {requested!r}; expected auto, cpu, cuda or cuda:N")


# ---------------------------------------------------------------------------
# Request arrays -> tensors
# ---------------------------------------------------------------------------


def default_dtype(array: np.ndarray, float_dtype: str | None) -> str:
    """The dtype an input with no declared type is fed.

    Floats take the model's float dtype when it has one, else keep the client's.
    """
    kind = array.dtype.kind
    if kind == "f":
        return float_dtype or array.dtype.name
    if kind == "u" and array.dtype.itemsize > 1:
        return "int64"  # torch has only partial uint16/32/64 support; the range is checked
    if kind in "biu":
        return array.dtype.name  # bool, uint8, int8..int64: torch has each of them
    raise BadRequest(f"unsupported tensor dtype {array.dtype}")


def to_tensor(array: Any, name: str, target: str, device: torch.device) -> torch.Tensor:
    """One request array as a tensor of dtype ``target`` on ``device``, refusing lossy casts."""
    array = np.asarray(array)
    if array.dtype.kind not in "biuf":
        found = "BYTES" if array.dtype.kind in "OSU" else str(array.dtype)
        raise BadRequest(f"input {name!r}: torch models take numeric or boolean tensors, found {found}")
    torch_dtype, wire_np, wire_v2 = DTYPES[target]
    converted = _cast(array, wire_np, name, wire_v2)
    if not converted.flags.writeable or not converted.flags.c_contiguous:
        converted = np.ascontiguousarray(converted).copy()  # torch wants memory it may write
    tensor = torch.from_numpy(converted)
    if torch_dtype is torch.bfloat16 and array.dtype.kind != "f":
        # integers beyond 256 lose digits in bfloat16: check the round trip
        narrowed = tensor.to(torch.bfloat16)
        if not torch.equal(narrowed.to(tensor.dtype), tensor):
            raise BadRequest(f"input {name!r}: values cannot be represented exactly as bfloat16")
    return tensor.to(device=device, dtype=torch_dtype)


def _cast(array: np.ndarray, target: np.dtype, name: str, datatype: str) -> np.ndarray:
    if array.dtype == target:
        return array
    with np.errstate(all="ignore"):
        converted = array.astype(target)
    if array.dtype.kind == "f" and target.kind == "f":
        return converted  # narrowing rounds, past the range to +/-inf, as TF Serving does
    if array.dtype.kind in "iu" and target.kind in "iu" and array.size:
        # same-width signed/unsigned casts wrap around and back again: compare ranges
        info = np.iinfo(target)
        low, high = array.min(), array.max()
        if low < info.min or high > info.max:
            bad = low if low < info.min else high
            raise BadRequest(f"input {name!r}: value {bad.item()!r} is out of the range of {datatype}")
    with np.errstate(all="ignore"):
        back = converted.astype(array.dtype)
    same = back == array
    if not np.all(same):
        bad = array[~same].reshape(-1)[0] if np.ndim(array) else array.item()
        raise BadRequest(
            f"input {name!r}: expected {datatype}, found {array.dtype} value {bad!r} that would change when converted"
        )
    return converted


# ---------------------------------------------------------------------------
# Tensors -> response arrays
# ---------------------------------------------------------------------------


def to_numpy(value: Any, name: str, widen_half: bool = False) -> np.ndarray:
    """An output tensor (or Python number) as a CPU numpy array in a wire dtype.

    :param widen_half: the model runs in half precision only because the server
        was asked to; its float16 outputs are returned as FP32 like the original's.
    """
    if not isinstance(value, torch.Tensor):
        if isinstance(value, (bool, int, float)):
            return np.asarray(value)
        raise ModelFailure(
            f"output {name!r} is a {type(value).__name__}; a torch model must return tensors, "
            "a tuple of tensors or a dict of tensors"
        )
    tensor = value.detach()
    if tensor.dtype is torch.bfloat16 or (widen_half and tensor.dtype is torch.float16):
        tensor = tensor.float()
    if tensor.dtype not in _NAME_OF and tensor.dtype not in (torch.uint16, torch.uint32, torch.uint64):
        raise ModelFailure(f"output {name!r} has dtype {tensor.dtype}, which no wire datatype carries")
    if tensor.is_sparse or tensor.layout is not torch.strided:
        tensor = tensor.to_dense()
    return tensor.cpu().resolve_conj().resolve_neg().numpy()
