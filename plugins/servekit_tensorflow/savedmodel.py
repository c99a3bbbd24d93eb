"""Loading a SavedModel into a TensorFlow session and running its signatures.

TensorFlow Serving loads every SavedModel (TF1 graphs and TF2 exports alike)
as a graph in a session and runs a signature by feeding and fetching the graph
tensors its SignatureDef names.  We do the same, so that the tensor names in the
metadata, the feeding of serialized ``tf.Example`` protos to classify/regress
signatures, and the behaviour on old graphs all match the real server.
(``tf.saved_model.load`` cannot even load some of TF Serving's own test models:
it re-traces TF 1.0 graphs and rejects their unknown-rank placeholders.)

TensorFlow is imported here only inside functions, so that installing this
plugin costs nothing to a server that serves no SavedModel.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from servekit.errors import BadRequest, ModelFailure
from servekit.types import ModelConfig

GRAPH_FILES = ("saved_model.pb", "saved_model.pbtxt")
DEFAULT_TAGS = ("serve",)
#: The op-only signature TF2 exports carry; it initialises tables and assets, it is not callable.
INIT_OP_SIGNATURE = "__saved_model_init_op"
_SESSION_OPTIONS = ("intra_op_parallelism_threads", "inter_op_parallelism_threads")


def is_saved_model(path: Path, explicit: bool = False) -> bool:
    """A SavedModel folder: ``saved_model.pb`` (or ``.pbtxt``) beside ``variables/``.

    With ``plugin: tensorflow`` set explicitly, a graph file alone is enough
    (SavedModels without variables exist, e.g. pure preprocessing graphs).
    """
    if not any((path / name).is_file() for name in GRAPH_FILES):
        return False
    return explicit or (path / "variables").is_dir()


@dataclass
class TFModel:
    """One loaded SavedModel version: its session, graph and SignatureDefs."""

    session: Any
    signature_defs: dict[str, Any]
    tags: tuple[str, ...]
    _callables: dict[tuple[str, ...], Any] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def signature_def(self, name: str | None) -> tuple[str, Any]:
        """The SignatureDef a request names (``serving_default`` when it names none)."""
        return lookup_signature(self.signature_defs, name)

    def graph_dtype(self, tensor_name: str) -> int:
        """The dtype enum of a graph tensor; it can differ from what the SignatureDef declares."""
        return self.session.graph.get_tensor_by_name(tensor_name).dtype.as_datatype_enum

    def run(self, feeds: dict[str, np.ndarray], fetches: list[str], signature: str | None = None) -> list[np.ndarray]:
        """Feed graph tensors by name and fetch others, as TF Serving's ``Session::Run`` does.

        ``Session.run`` checks every fed value against the tensor's static shape in
        Python; TF Serving feeds through the C++ API, which does not, and clients
        rely on that (``{"instances": [1.0, 2.0, 5.0]}`` into an ``x`` of shape
        ``[-1, 1]``).  A callable made from ``CallableOptions`` goes through the same
        C++ path, and is cached per feed/fetch set so the graph is pruned only once.
        """
        import tensorflow as tf
        from tensorflow.core.protobuf import config_pb2

        feed_names = tuple(feeds)
        key = (*feed_names, "->", *fetches)
        with self._lock:
            run = self._callables.get(key)
            if run is None:
                options = config_pb2.CallableOptions(feed=list(feed_names), fetch=list(fetches))
                run = self.session._make_callable_from_options(options)
                self._callables[key] = run
        try:
            return list(run(*(feeds[n] for n in feed_names)))
        except tf.errors.InvalidArgumentError as exc:
            raise BadRequest(_first_line(exc.message)) from None
        except tf.errors.OpError as exc:
            raise ModelFailure(f"TensorFlow failed: {_first_line(exc.message)}") from None

    def close(self) -> None:
        with self._lock:
            self._callables.clear()
        self.session.close()


def lookup_signature(signature_defs: dict[str, Any], name: str | None) -> tuple[str, Any]:
    """The SignatureDef a request names (``serving_default`` when it names none), as TF Serving says it."""
    key = name or "serving_default"
    sig = signature_defs.get(key)
    if sig is None or key == INIT_OP_SIGNATURE:
        known = sorted(n for n in signature_defs if n != INIT_OP_SIGNATURE)
        callable_names = ", ".join(known)
        raise BadRequest(
            f"Serving signature name: {key!r} not found in signature def; this model has {callable_names or 'none'}"
        )
    return key, sig


def _first_line(message: str) -> str:
    """TensorFlow's message without the graph node dump that follows it."""
    return message.strip().split("\n", 1)[0][:1000]


def load(path: Path, config: ModelConfig) -> TFModel:
    """Load the MetaGraph tagged ``options.tags`` (default ``serve``) into a new session."""
    # Keep TensorFlow's C++ INFO and per-request WARNING lines (a client's bad
    # input is answered with a 400, not logged); errors still show.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    options = config.options or {}
    tags = _tags(options.get("tags", DEFAULT_TAGS))
    session_config, device = _session_config(tf, config.device, options)
    graph = tf.Graph()
    session = tf.compat.v1.Session(graph=graph, config=session_config)
    try:
        with graph.as_default():
            if device is None:
                meta_graph = tf.compat.v1.saved_model.loader.load(session, list(tags), str(path))
            else:
                with graph.device(device):
                    meta_graph = tf.compat.v1.saved_model.loader.load(
                        session, list(tags), str(path), clear_devices=True
                    )
    except RuntimeError as exc:  # no MetaGraph with these tags
        session.close()
        raise RuntimeError(f"{_first_line(str(exc))} (set options.tags in servekit.yaml)") from None
    except Exception:
        session.close()
        raise
    return TFModel(session=session, signature_defs=dict(meta_graph.signature_def), tags=tags)


def _tags(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [t.strip() for t in value.split(",")]
    if not isinstance(value, (list, tuple)) or not all(isinstance(t, str) and t for t in value):
        raise ValueError(f"options.tags must be a list of MetaGraph tags, found {value!r}")
    return tuple(value)


def _session_config(tf: Any, device: str, options: dict[str, Any]) -> tuple[Any, str | None]:
    """A ``ConfigProto`` for the requested device, and a device to pin the graph to (``cuda:N``).

    ``cpu`` hides every GPU from the session; ``auto`` lets TensorFlow place ops
    (GPU when it sees one); ``cuda`` and ``cuda:N`` fail the load when that GPU is absent.
    """
    kwargs: dict[str, Any] = {"allow_soft_placement": True}
    for name in _SESSION_OPTIONS:
        if name in options:
            value = options[name]
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"options.{name} must be a non-negative integer, found {value!r}")
            kwargs[name] = value
    pin: str | None = None
    if device == "cpu":
        kwargs["device_count"] = {"GPU": 0}
    elif device.startswith("cuda"):
        gpus = tf.config.list_physical_devices("GPU")
        index = int(device.split(":", 1)[1]) if ":" in device else 0
        if index >= len(gpus):
            raise RuntimeError(f"device {device!r} requested, but TensorFlow sees {len(gpus)} GPU(s)")
        if ":" in device:
            pin = f"/device:GPU:{index}"
    return tf.compat.v1.ConfigProto(**kwargs), pin
