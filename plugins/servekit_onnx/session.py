"""An ONNX Runtime session: its tensors read once at load, request arrays checked and cast to them.

ONNX Runtime refuses a float64 array for a float32 input, and a JSON client
cannot say float32; so each input is cast to the graph's type when that loses
nothing a client meant (numbers to floats, integral numbers to integers), and
refused with a 400 naming the input otherwise.  Shapes are checked against the
graph's static dimensions before the call, so a wrong width is the client's
400, not ONNX Runtime's failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from servekit import cpus_per_worker
from servekit.errors import BadRequest
from servekit.types import ModelConfig, ModelMetadata, Signature, TensorSpec

#: ONNX Runtime's type names -> (V2 datatype, numpy dtype)
TYPES: dict[str, tuple[str, Any]] = {
    "tensor(float)": ("FP32", np.float32),
    "tensor(double)": ("FP64", np.float64),
    "tensor(float16)": ("FP16", np.float16),
    "tensor(int64)": ("INT64", np.int64),
    "tensor(int32)": ("INT32", np.int32),
    "tensor(int16)": ("INT16", np.int16),
    "tensor(int8)": ("INT8", np.int8),
    "tensor(uint64)": ("UINT64", np.uint64),
    "tensor(uint32)": ("UINT32", np.uint32),
    "tensor(uint16)": ("UINT16", np.uint16),
    "tensor(uint8)": ("UINT8", np.uint8),
    "tensor(bool)": ("BOOL", np.bool_),
    "tensor(string)": ("BYTES", np.object_),
}


@dataclass(frozen=True)
class Port:
    """One graph input or output: name, ONNX type, shape (``None`` for a dynamic dimension)."""

    name: str
    type: str
    shape: tuple[int | None, ...] | None

    @classmethod
    def of(cls, arg: Any) -> Port:
        shape = None if arg.shape is None else tuple(d if isinstance(d, int) and d >= 0 else None for d in arg.shape)
        return cls(arg.name, arg.type, shape)

    def spec(self, allow_nan: bool = False) -> TensorSpec:
        datatype = TYPES.get(self.type, ("BYTES", None))[0]
        shape = None if self.shape is None else [-1 if d is None else d for d in self.shape]
        if self.type.startswith("seq(map"):  # skl2onnx's ZipMap: answered as rows of scores
            datatype, shape = "FP32", [-1, -1]
        return TensorSpec(self.name, datatype, shape, allow_nan=allow_nan)

    @property
    def is_column(self) -> bool:
        """One value per row: shape ``[-1]`` or ``[-1, 1]`` (a per-feature input, as skl2onnx makes them)."""
        return self.shape is not None and len(self.shape) in (1, 2) and self.shape[1:] in ((), (1,))


@dataclass
class OnnxModel:
    session: Any
    file_name: str
    inputs: list[Port]
    outputs: list[Port]
    providers: list[str]
    threads: int
    #: ``options.allow_nan``: the graph reads NaN as a missing value (a converted tree ensemble does)
    allow_nan: bool = False

    def describe(self) -> ModelMetadata:
        signature = Signature(
            inputs=[p.spec(self.allow_nan) for p in self.inputs], outputs=[p.spec() for p in self.outputs]
        )
        return ModelMetadata(signatures={"serving_default": signature}, platform="onnxruntime_onnx")

    def run(self, inputs: Any, output_names: list[str] | None = None) -> dict[str, Any]:
        feeds = {port.name: _cast(port, value) for port, value in self._match(inputs)}
        known = [p.name for p in self.outputs]
        wanted = [n for n in output_names if n in known] if output_names else known
        from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

        try:
            results = self.session.run(wanted or known, feeds)
        except InvalidArgument as exc:  # what ONNX Runtime finds wrong with the request's tensors
            raise BadRequest(f"the model refuses the input: {exc}") from None
        return {name: _tensor(value) for name, value in zip(wanted or known, results)}

    def _match(self, inputs: Any) -> list[tuple[Port, Any]]:
        names = [p.name for p in self.inputs]
        if not isinstance(inputs, dict):
            if len(self.inputs) != 1:
                raise BadRequest(f"this model takes inputs {names}; send them by name")
            return [(self.inputs[0], inputs)]
        if len(inputs) == 1 and len(self.inputs) == 1 and names[0] not in inputs:
            raise BadRequest(f"this model's input is {names[0]!r}; found {sorted(inputs)}")
        if len(inputs) == 1 and len(self.inputs) > 1 and set(inputs) != set(names):
            return self._columns_of(*inputs.items())
        if set(inputs) != set(names):
            raise BadRequest(f"expected inputs {names}, found {sorted(inputs)}")
        return [(port, inputs[port.name]) for port in self.inputs]

    def _columns_of(self, item: tuple[str, Any]) -> list[tuple[Port, Any]]:
        """One tensor of rows for a graph of one input per feature: its columns, in the graph's order."""
        name, value = item
        names = [p.name for p in self.inputs]
        rows = np.asarray(value)
        if not all(p.is_column for p in self.inputs):
            raise BadRequest(f"expected inputs {names}, found {[name]}")
        if rows.ndim != 2 or rows.shape[1] != len(self.inputs):
            raise BadRequest(
                f"input {name!r}: expected one input per feature {names}, or rows of {len(names)} features; "
                f"found shape {list(rows.shape)}"
            )
        return [
            (port, rows[:, [i]] if len(port.shape or ()) == 2 else rows[:, i]) for i, port in enumerate(self.inputs)
        ]


def _cast(port: Port, value: Any) -> np.ndarray:
    """``value`` as the array ``port`` takes, or a 400 saying why it cannot be."""
    array = np.asarray(value)
    if port.shape is not None:
        _check_shape(port, array.shape)
    datatype, dtype = TYPES.get(port.type, (None, None))
    if dtype is None:
        raise BadRequest(f"input {port.name!r} is of type {port.type}, which servekit cannot feed")
    if dtype is np.object_:
        if array.dtype.kind not in "OSU":
            raise BadRequest(f"input {port.name!r} takes strings (BYTES), found {array.dtype}")
        return np.vectorize(_text, otypes=[object])(array) if array.size else array.astype(object)
    if array.dtype.kind not in "biuf":
        raise BadRequest(f"input {port.name!r} takes {datatype} numbers, found {array.dtype}")
    target = np.dtype(dtype)
    if target.kind in "iu" and array.dtype.kind == "f" and not np.array_equal(array, np.trunc(array)):
        raise BadRequest(f"input {port.name!r} takes {datatype} integers, found fractions")
    return np.ascontiguousarray(array, dtype=target)


def _check_shape(port: Port, shape: tuple[int, ...]) -> None:
    assert port.shape is not None
    expected = [-1 if d is None else d for d in port.shape]
    if len(shape) != len(expected) or any(e not in (-1, s) for e, s in zip(expected, shape)):
        raise BadRequest(f"input {port.name!r}: expected shape {expected}, found {list(shape)}")


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _tensor(value: Any) -> Any:
    """A session's answer for the client: arrays as they are, ZipMap's list of dicts as rows of scores."""
    if isinstance(value, list) and value and isinstance(value[0], dict):
        keys = sorted(value[0])
        return np.asarray([[row[k] for k in keys] for row in value], dtype=np.float32)
    return value


def load_session(file: Path, config: ModelConfig) -> OnnxModel:
    """An ``InferenceSession`` over ``file`` on the providers ``config.device`` asks for."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    threads = int(config.options.get("intra_op_threads") or cpus_per_worker())
    options.intra_op_num_threads = threads
    # the request threads already run calls side by side; one graph's branches run in turn
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    providers = providers_for(config.device, ort.get_available_providers())
    try:
        session = ort.InferenceSession(str(file), sess_options=options, providers=providers)
    except Exception as exc:  # ONNX Runtime's own error types (Fail, InvalidGraph, ...) share no base but this
        raise ValueError(f"{file.name}: not a model ONNX Runtime can load ({str(exc).strip()[:500]})") from exc
    used = session.get_providers()
    if config.device.startswith("cuda") and "CUDAExecutionProvider" not in used:
        raise ValueError(f"device {config.device!r} was requested but ONNX Runtime could not start CUDA here")
    inputs = [Port.of(a) for a in session.get_inputs()]
    outputs = [Port.of(a) for a in session.get_outputs()]
    allow_nan = config.options.get("allow_nan", False)
    if not isinstance(allow_nan, bool):
        raise ValueError(f"options.allow_nan must be true or false, found {allow_nan!r}")
    return OnnxModel(session, file.name, inputs, outputs, used, threads, allow_nan=allow_nan)


def providers_for(device: str, available: list[str]) -> list[Any]:
    """The execution providers for ``device``: CUDA first when asked for (or ``auto`` and present), then CPU."""
    device = (device or "auto").strip()
    cuda = "CUDAExecutionProvider" in available
    if device == "cpu" or (device == "auto" and not cuda):
        return ["CPUExecutionProvider"]
    if device.startswith("cuda") and not cuda:
        raise ValueError(
            f"device {device!r} was requested but this ONNX Runtime has no CUDA provider "
            f"(it has {', '.join(available)}); install onnxruntime-gpu, or use device: auto or cpu"
        )
    if device not in ("auto", "cuda") and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise ValueError(f"device {device!r}: expected auto, cpu, cuda or cuda:N")
    index = int(device[5:]) if device.startswith("cuda:") else 0
    return [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]
