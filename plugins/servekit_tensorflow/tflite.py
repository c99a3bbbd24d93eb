"""TF Lite models (``model.tflite``) through ``tf.lite.Interpreter``, as TF Serving's TfLiteSession serves them.

Signatures come, as TF Serving reads them, from the ``signature_defs_metadata``
buffer in the flatbuffer's metadata (TF Lite's ``signature_def_util`` writes
SignatureDef protos there; TF Serving's own test models carry one), their
tensor names matched to the interpreter's (``:0`` dropped where the
interpreter has no such name).  A model without that buffer serves the
SignatureDefs the TF Lite converter writes (from a SavedModel or concrete
functions), keyed as the converter keyed them, each run through its signature
runner; a model with neither is served as one ``serving_default`` signature
over the interpreter's input and output tensors, keyed by tensor name (``:0``
dropped), as TF Serving does.  Metadata comes from the interpreter's tensor
details: dtypes, and the shape signature with ``-1`` for a dimension the model
leaves open.

As TF Serving does, an input is resized to the shape sent, fixed dimensions
included (TF Serving's own ``[1, 1]`` model answers ``x`` of shape ``[1]``); a
shape the model's ops cannot take answers 400 naming the input.

An interpreter runs one request at a time; each loaded version keeps a small
pool of them (``options.interpreters``, default 1, TF Serving's
``num_tflite_interpreters``), so concurrent requests wait for a free one
instead of racing.  predict only: ``classify``/``regress`` need
``tf.Example`` parsing ops, which TF Lite lacks (501).
"""

from __future__ import annotations

import os
import queue
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from servekit.errors import BadRequest, ModelFailure
from servekit.types import ModelConfig

TFLITE_FILE = "model.tflite"
DEFAULT_SIGNATURE = "serving_default"
PREDICT_METHOD = "tensorflow/serving/predict"
#: the flatbuffer metadata entry where TF Lite's signature_def_util (and TF Serving) keep SignatureDefs
SIGNATURE_DEFS_METADATA = b"signature_defs_metadata"
#: ``servekit tfserving --prefer_tflite_model`` sets it for every model; ``options.prefer_tflite`` per model
PREFER_ENV = "SERVEKIT_TENSORFLOW_PREFER_TFLITE"


def has_tflite(path: Path) -> bool:
    return (path / TFLITE_FILE).is_file()


def prefer_tflite(options: dict[str, Any]) -> bool:
    """Whether a folder holding both a SavedModel and ``model.tflite`` serves the TF Lite model."""
    if "prefer_tflite" in options:
        return bool(options["prefer_tflite"])
    return os.environ.get(PREFER_ENV, "").lower() in ("1", "true", "yes")


@dataclass
class TFLiteModel:
    """One loaded ``model.tflite``: its SignatureDefs and a pool of interpreters."""

    signature_defs: dict[str, Any]
    #: per signature: its runner's name (``None``: the interpreter's tensors) and tensor name -> key
    keys: dict[str, tuple[str | None, dict[str, str]]]
    interpreters: queue.Queue = field(repr=False)
    #: builds a fresh interpreter, to replace one a failed resize may have left unusable
    new_interpreter: Callable[[], Any] = field(repr=False, default=lambda: None)
    tags: tuple[str, ...] = ()

    def signature_def(self, name: str | None) -> tuple[str, Any]:
        from .savedmodel import lookup_signature

        return lookup_signature(self.signature_defs, name)

    def graph_dtype(self, tensor_name: str) -> int:
        for sig in self.signature_defs.values():
            for info in (*sig.inputs.values(), *sig.outputs.values()):
                if info.name == tensor_name:
                    return int(info.dtype)
        raise KeyError(tensor_name)

    def run(self, feeds: dict[str, np.ndarray], fetches: list[str], signature: str | None = None) -> list[np.ndarray]:
        """Feed tensors by name (each resized to the shape sent) and fetch others."""
        sig_name, sig_def = self.signature_def(signature)
        runner_name, keys = self.keys[sig_name]
        interpreter = self.interpreters.get()
        try:
            if runner_name is not None:
                runner = interpreter.get_signature_runner(runner_name)
                outputs = runner(**{keys[t]: value for t, value in feeds.items()})
                return [np.asarray(outputs[keys[t]]) for t in fetches]
            return _run_tensors(interpreter, feeds, fetches)
        except (ValueError, RuntimeError) as exc:
            interpreter = self.new_interpreter() or interpreter
            misfits = _misfits(sig_def, feeds)
            if misfits or isinstance(exc, ValueError):  # a shape or dtype the model cannot take
                raise BadRequest(f"TF Lite refused the input{misfits}: {_first_line(exc)}") from None
            raise ModelFailure(f"TF Lite failed: {_first_line(exc)}") from None
        finally:
            self.interpreters.put(interpreter)

    def close(self) -> None:
        while not self.interpreters.empty():
            self.interpreters.get_nowait()


def _misfits(sig_def: Any, feeds: dict[str, np.ndarray]) -> str:
    """Inputs sent in a shape other than the model's shape signature (only ``-1`` may vary), for an error."""
    said = []
    for key, info in sorted(sig_def.inputs.items()):
        value = feeds.get(info.name)
        shape = [int(d.size) for d in info.tensor_shape.dim]
        if value is None:
            continue
        fits = value.ndim == len(shape) and all(s in (-1, n) for s, n in zip(shape, value.shape, strict=True))
        if not fits:
            said.append(f"{key!r} of shape {list(value.shape)} (the model declares {shape}, -1: any size)")
    return f" {', '.join(said)}" if said else ""


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().split("\n", 1)[0][:1000]


def _run_tensors(interpreter: Any, feeds: dict[str, np.ndarray], fetches: list[str]) -> list[np.ndarray]:
    """A signature without a runner: resize, set, invoke and read the interpreter's tensors by name."""
    by_name = {d["name"]: d for d in (*interpreter.get_input_details(), *interpreter.get_output_details())}
    resized = False
    for name, value in feeds.items():
        detail = by_name[name]
        if list(detail["shape"]) != list(value.shape):
            interpreter.resize_tensor_input(detail["index"], list(value.shape))  # TF Serving: any shape
            resized = True
    if resized:
        interpreter.allocate_tensors()
    for name, value in feeds.items():
        interpreter.set_tensor(by_name[name]["index"], value)
    interpreter.invoke()
    return [np.array(interpreter.get_tensor(by_name[name]["index"])) for name in fetches]


def load(path: Path, config: ModelConfig) -> TFLiteModel:
    """``model.tflite`` in ``path`` with ``options.interpreters`` interpreters (``options.num_threads`` each)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import warnings

    import tensorflow as tf

    options = config.options or {}
    count = _positive(options.get("interpreters", 1), "interpreters")
    threads = options.get("num_threads")
    if threads is not None:
        threads = _positive(threads, "num_threads")
    pool: queue.Queue = queue.Queue()
    file = path / TFLITE_FILE

    def new_interpreter() -> Any:
        with warnings.catch_warnings():  # tf.lite.Interpreter's notice about LiteRT
            warnings.simplefilter("ignore")
            interpreter = tf.lite.Interpreter(model_path=str(file), num_threads=threads)
        interpreter.allocate_tensors()
        return interpreter

    for _ in range(count):
        pool.put(new_interpreter())
    first = pool.get()
    try:
        signature_defs, keys = signatures(tf, first, metadata_signature_defs(file.read_bytes()))
    finally:
        pool.put(first)
    return TFLiteModel(signature_defs=signature_defs, keys=keys, interpreters=pool, new_interpreter=new_interpreter)


def metadata_signature_defs(model: bytes) -> dict[str, Any]:
    """The SignatureDef protos in the flatbuffer's ``signature_defs_metadata`` buffer (none: ``{}``).

    TF Lite's ``signature_def_util`` writes them as a FlexBuffer map from
    signature key to a serialized ``SignatureDef``; TF Serving serves those.
    """
    from flatbuffers import flexbuffers
    from tensorflow.core.protobuf import meta_graph_pb2
    from tensorflow.lite.python import schema_py_generated as schema

    root = schema.Model.GetRootAs(model, 0)
    for i in range(root.MetadataLength()):
        entry = root.Metadata(i)
        if entry.Name() != SIGNATURE_DEFS_METADATA:
            continue
        data = root.Buffers(entry.Buffer()).DataAsNumpy()
        if isinstance(data, int):  # an empty buffer
            return {}
        table = flexbuffers.GetRoot(data.tobytes()).AsMap
        defs = {}
        for key, value in zip(table.Keys, table.Values, strict=True):
            try:
                defs[key.AsKey] = meta_graph_pb2.SignatureDef.FromString(value.AsStringBytes)
            except Exception as exc:  # a malformed buffer: the model is broken, as TF Serving says
                raise ValueError(f"invalid SignatureDef {key.AsKey!r} in the TF Lite model's metadata: {exc}") from None
        return defs
    return {}


def _positive(value: Any, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"options.{name} must be a positive integer, found {value!r}")
    return value


def signatures(
    tf: Any, interpreter: Any, declared: dict[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, tuple[str | None, dict[str, str]]]]:
    """The model's signatures as SignatureDef protos, and how to run each.

    ``declared``: the SignatureDefs of the model's ``signature_defs_metadata``, which win.
    """
    from tensorflow.core.protobuf import meta_graph_pb2

    defs: dict[str, Any] = {}
    keys: dict[str, tuple[str | None, dict[str, str]]] = {}
    if declared:
        inputs = {d["name"] for d in interpreter.get_input_details()}
        outputs = {d["name"] for d in interpreter.get_output_details()}
        for name in sorted(declared):
            sig = meta_graph_pb2.SignatureDef()
            sig.CopyFrom(declared[name])
            for side, known in (("input", inputs), ("output", outputs)):
                for key, info in getattr(sig, f"{side}s").items():
                    info.name = _interpreter_name(known, info.name, f"signature {name!r} {side} {key!r}")
            defs[name], keys[name] = sig, (None, {})
        return defs, keys
    listed = interpreter.get_signature_list()
    if listed:
        for name in sorted(listed):
            runner = interpreter.get_signature_runner(name)
            sig = meta_graph_pb2.SignatureDef(method_name=PREDICT_METHOD)
            names: dict[str, str] = {}
            for key, detail in sorted(runner.get_input_details().items()):
                _fill(tf, sig.inputs[key], detail)
                names[detail["name"]] = key
            for key, detail in sorted(runner.get_output_details().items()):
                _fill(tf, sig.outputs[key], detail)
                names[detail["name"]] = key
            defs[name], keys[name] = sig, (name, names)
        return defs, keys
    sig = meta_graph_pb2.SignatureDef(method_name=PREDICT_METHOD)
    for detail in interpreter.get_input_details():
        _fill(tf, sig.inputs[_key(detail["name"])], detail)
    for detail in interpreter.get_output_details():
        _fill(tf, sig.outputs[_key(detail["name"])], detail)
    return {DEFAULT_SIGNATURE: sig}, {DEFAULT_SIGNATURE: (None, {})}


def _interpreter_name(known: set[str], tensor_name: str, what: str) -> str:
    """A SignatureDef's tensor name as the interpreter has it: as written, else without ``:0`` (TF Serving)."""
    if tensor_name in known:
        return tensor_name
    legacy = tensor_name.split(":", 1)[0]
    if legacy in known:
        return legacy
    raise ValueError(f"{what} references an unknown tensor {tensor_name!r}; the model has {', '.join(sorted(known))}")


def _key(tensor_name: str) -> str:
    return tensor_name[:-2] if tensor_name.endswith(":0") else tensor_name


def _fill(tf: Any, info: Any, detail: dict[str, Any]) -> None:
    """A TensorInfo from an interpreter's tensor detail: name, dtype, shape (-1 where open)."""
    info.name = detail["name"]
    info.dtype = tf.as_dtype(detail["dtype"]).as_datatype_enum
    shape = detail.get("shape_signature")
    if shape is None or len(shape) == 0 and len(detail["shape"]):
        shape = detail["shape"]
    for size in shape:
        info.tensor_shape.dim.add().size = int(size)
