"""TF Lite models (``model.tflite``) through ``tf.lite.Interpreter``, as TF Serving's TfLiteSession serves them.

The model's own SignatureDefs (what the TF Lite converter writes from a
SavedModel or concrete functions) become the signatures, keyed as the
converter keyed them, each run through its signature runner; a model without
any is served as one ``serving_default`` signature over the interpreter's
input and output tensors, keyed by tensor name (``:0`` dropped), as TF Serving
does.  Metadata comes from the interpreter's tensor details: dtypes, and the
shape signature with ``-1`` for a dimension the model leaves open.

An interpreter runs one request at a time; each loaded version keeps a small
pool of them (``options.interpreters``, default 1, TF Serving's
``num_tflite_interpreters``), so concurrent requests wait for a free one
instead of racing.  predict only: ``classify``/``regress`` need
``tf.Example`` parsing ops, which TF Lite lacks (501).
"""

from __future__ import annotations

import os
import queue
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from servekit.errors import BadRequest, ModelFailure
from servekit.types import ModelConfig

TFLITE_FILE = "model.tflite"
DEFAULT_SIGNATURE = "serving_default"
PREDICT_METHOD = "tensorflow/serving/predict"
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
        """Feed tensors by name and fetch others, through the signature's runner."""
        sig_name, sig_def = self.signature_def(signature)
        runner_name, keys = self.keys[sig_name]
        for key, info in sig_def.inputs.items():
            if info.name in feeds:
                _check_shape(key, feeds[info.name], [int(d.size) for d in info.tensor_shape.dim])
        interpreter = self.interpreters.get()
        try:
            if runner_name is not None:
                runner = interpreter.get_signature_runner(runner_name)
                outputs = runner(**{keys[t]: value for t, value in feeds.items()})
                return [np.asarray(outputs[keys[t]]) for t in fetches]
            return _run_tensors(interpreter, feeds, fetches)
        except ValueError as exc:  # a shape or dtype the model cannot take
            raise BadRequest(f"TF Lite refused the input: {_first_line(exc)}") from None
        except RuntimeError as exc:
            raise ModelFailure(f"TF Lite failed: {_first_line(exc)}") from None
        finally:
            self.interpreters.put(interpreter)

    def close(self) -> None:
        while not self.interpreters.empty():
            self.interpreters.get_nowait()


def _check_shape(key: str, value: np.ndarray, shape: list[int]) -> None:
    """The model's shape signature, as the interpreter's strict resize holds it: only ``-1`` may vary.

    The interpreter would otherwise take any shape its ops happen to accept and
    answer in a shape the model does not declare.
    """
    fits = value.ndim == len(shape) and all(s in (-1, n) for s, n in zip(shape, value.shape, strict=True))
    if not fits:
        raise BadRequest(f"input {key!r} has shape {list(value.shape)}, but the model takes {shape} (-1: any size)")


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().split("\n", 1)[0][:1000]


def _run_tensors(interpreter: Any, feeds: dict[str, np.ndarray], fetches: list[str]) -> list[np.ndarray]:
    """A model without SignatureDefs: resize, set, invoke and read its tensors by name."""
    by_name = {d["name"]: d for d in (*interpreter.get_input_details(), *interpreter.get_output_details())}
    resized = False
    for name, value in feeds.items():
        detail = by_name[name]
        if list(detail["shape"]) != list(value.shape):
            interpreter.resize_tensor_input(detail["index"], list(value.shape), strict=True)
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
    file = str(path / TFLITE_FILE)
    with warnings.catch_warnings():  # tf.lite.Interpreter's notice about LiteRT
        warnings.simplefilter("ignore")
        for _ in range(count):
            interpreter = tf.lite.Interpreter(model_path=file, num_threads=threads)
            interpreter.allocate_tensors()
            pool.put(interpreter)
    first = pool.get()
    try:
        signature_defs, keys = signatures(tf, first)
    finally:
        pool.put(first)
    return TFLiteModel(signature_defs=signature_defs, keys=keys, interpreters=pool)


def _positive(value: Any, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"options.{name} must be a positive integer, found {value!r}")
    return value


def signatures(tf: Any, interpreter: Any) -> tuple[dict[str, Any], dict[str, tuple[str | None, dict[str, str]]]]:
    """The interpreter's signatures as SignatureDef protos, and how to run each."""
    from tensorflow.core.protobuf import meta_graph_pb2

    defs: dict[str, Any] = {}
    keys: dict[str, tuple[str | None, dict[str, str]]] = {}
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
