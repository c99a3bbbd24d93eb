"""A model folder's Triton ``config.pbtxt``, as Triton's JSON model configuration.

A Triton model repository entry keeps its model configuration in
``config.pbtxt`` beside the version folders.  servekit reads it for:

- the configuration document (``/v2/models/NAME/config``, gRPC ``ModelConfig``,
  built in :func:`servekit.protocols.v2_documents.model_configuration`): every
  field the file holds, with what servekit knows laid over it;
- the metadata of a model that gives none (a ``model.py`` without a
  ``metadata`` hook): its ``input`` and ``output``, with a leading ``-1`` for the
  batch dimension when ``max_batch_size`` is above 0, as Triton reports them;
- whether the model has a batch dimension (:func:`batch_size`), which Triton's
  classification extension ranks row by row;
- the model's batching when ``servekit.yaml`` has no ``batching:``:
  ``dynamic_batching`` turns servekit's adaptive batching on (:func:`batching`);
- its sequences: ``sequence_batching`` makes it a sequence model, as
  ``sequence:`` in ``servekit.yaml`` does (:func:`sequence`).

The text format is read without the protobuf schema (:mod:`servekit.folders.pbtxt`), so
the HTTP server needs no ``grpc`` extra; what the schema would say is restored
here: a repeated field given once becomes a list (:data:`REPEATED`), and a map
(``parameters``, ``input_map``: entries of ``key`` and ``value``) an object, which
is the shape protobuf's JSON mapping gives them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from servekit.folders import pbtxt
from servekit.types import ModelMetadata, Signature, TensorSpec

log = logging.getLogger("servekit.triton")

CONFIG_FILE = "config.pbtxt"

#: The repeated fields of Triton's ``ModelConfig`` and the messages inside it
#: (``model_config.proto``); no message there has a singular field of these names.
REPEATED = frozenset(
    {
        "agents",
        "batch_input",
        "batch_output",
        "bool_false_true",
        "buckets",
        "control",
        "control_input",
        "cpu_execution_accelerator",
        "dim",
        "dims",
        "fp32_false_true",
        "gpu_execution_accelerator",
        "gpus",
        "graph_spec",
        "initial_state",
        "input",
        "instance_group",
        "int32_false_true",
        "metric_control",
        "model_warmup",
        "op_library_filename",
        "output",
        "preferred_batch_size",
        "profile",
        "resources",
        "secondary_devices",
        "shape",
        "source_input",
        "state",
        "step",
        "target_name",
        "versions",
    }
)


class TritonConfigError(ValueError):
    """``config.pbtxt`` cannot be read; the message says why."""


def read(folder: Path | None) -> dict[str, Any] | None:
    """The folder's ``config.pbtxt`` as a JSON model configuration (``None``: the folder has none)."""
    if folder is None:
        return None
    path = Path(folder) / CONFIG_FILE
    if not path.is_file():
        return None
    try:
        doc = pbtxt.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, pbtxt.ParseError) as exc:
        raise TritonConfigError(f"{CONFIG_FILE}: cannot be read: {exc}") from None
    return _message(doc)


def _message(doc: dict[str, Any]) -> dict[str, Any]:
    return {key: _field(key, value) for key, value in doc.items()}


def _field(key: str, value: Any) -> Any:
    items = value if isinstance(value, list) else [value]
    if items and all(isinstance(i, dict) and "key" in i and set(i) <= {"key", "value"} for i in items):
        return {str(i["key"]): _value(i.get("value", "")) for i in items}  # a map's entries
    if key in REPEATED or isinstance(value, list):
        return [_value(i) for i in items]
    return _value(value)


def _value(value: Any) -> Any:
    return _message(value) if isinstance(value, dict) else value


# -- per served version -------------------------------------------------------------------


def model_folder(mv: Any) -> Path:
    """The model's folder (the one holding ``config.pbtxt`` and the version folders)."""
    return Path(mv.config.base_path) if mv.config.base_path else Path(mv.path).parent


def of_version(mv: Any) -> dict[str, Any] | None:
    """The ``config.pbtxt`` of a served version's folder, read once per version (``None``: none, or unreadable)."""
    cache = mv.__dict__
    if "_triton_config" not in cache:
        try:
            cache["_triton_config"] = read(model_folder(mv))
        except TritonConfigError as exc:
            log.warning("model %s: %s; its configuration is derived from its metadata", mv.name, exc)
            cache["_triton_config"] = None
    return cache["_triton_config"]


def batch_size(mv: Any) -> int:
    """The model's ``max_batch_size``: servekit's batching size when it batches, else ``config.pbtxt``'s (0: none)."""
    batching = max(0, mv.config.batching.max_batch_size)
    if batching:
        return batching
    doc = of_version(mv) or {}
    return max(0, _int(doc.get("max_batch_size", 0)))


def batching(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    """The ``batching:`` of ``servekit.yaml`` a configuration's ``dynamic_batching`` stands for (``None``: none).

    Triton combines requests only with ``dynamic_batching``, up to ``max_batch_size``
    rows, waiting at most ``max_queue_delay_microseconds``; without a batch
    dimension (``max_batch_size`` 0) it has nothing to combine along.
    """
    if not doc or not isinstance(doc.get("dynamic_batching"), dict):
        return None
    size = _int(doc.get("max_batch_size", 0))
    if size <= 0:
        return None
    delay_us = _int(doc["dynamic_batching"].get("max_queue_delay_microseconds", 0))
    return {"max_batch_size": size, "max_batch_time_ms": delay_us / 1000.0}


#: ``dynamic_batching`` fields of priorities and the queue policy (servekit.yaml's ``queue:``)
QUEUE_FIELDS = ("priority_levels", "default_priority_level", "default_queue_policy", "priority_queue_policy")
_ACTIONS = {"REJECT": "reject", "DELAY": "delay"}


def queue(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    """The ``queue:`` of ``servekit.yaml`` a configuration's ``dynamic_batching`` priorities stand for.

    ``priority_levels``, ``default_priority_level``, ``default_queue_policy`` and
    ``priority_queue_policy`` (a map of level to policy), with the policy's
    ``timeout_action`` (``REJECT``/``DELAY``), ``default_timeout_microseconds``,
    ``allow_timeout_override`` and ``max_queue_size``.  ``None``: none of them is set.
    """
    if not doc or not isinstance(doc.get("dynamic_batching"), dict):
        return None
    batching_doc = doc["dynamic_batching"]
    if not any(key in batching_doc for key in QUEUE_FIELDS):
        return None
    out: dict[str, Any] = {}
    for key in ("priority_levels", "default_priority_level"):
        if key in batching_doc:
            out[key] = _whole(batching_doc[key], f"dynamic_batching.{key}")
    if "default_queue_policy" in batching_doc:
        out.update(_queue_policy(batching_doc["default_queue_policy"], "dynamic_batching.default_queue_policy"))
    levels = batching_doc.get("priority_queue_policy") or {}
    if isinstance(levels, list):  # the text format's repeated map entries: {key: N, value: {...}}
        levels = {entry.get("key"): entry.get("value") for entry in levels if isinstance(entry, dict)}
    if not isinstance(levels, dict):
        raise TritonConfigError(f"{CONFIG_FILE}: dynamic_batching.priority_queue_policy must map a level to a policy")
    if levels:
        out["levels"] = {
            _whole(level, "dynamic_batching.priority_queue_policy key"): _queue_policy(
                policy, f"dynamic_batching.priority_queue_policy[{level}]"
            )
            for level, policy in levels.items()
        }
    return out


def _whole(value: Any, where: str) -> int:
    if isinstance(value, bool) or not str(value).isdigit():
        raise TritonConfigError(f"{CONFIG_FILE}: {where} must be a whole number, found {value!r}")
    return int(value)


def _queue_policy(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise TritonConfigError(f"{CONFIG_FILE}: {where} must be a queue policy")
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "timeout_action":
            if str(value).upper() not in _ACTIONS:
                raise TritonConfigError(
                    f"{CONFIG_FILE}: {where}.timeout_action must be REJECT or DELAY, found {value!r}"
                )
            out["timeout_action"] = _ACTIONS[str(value).upper()]
        elif key == "default_timeout_microseconds":
            out["default_timeout_ms"] = _whole(value, f"{where}.{key}") / 1000.0
        elif key == "allow_timeout_override":
            if value not in (True, False, "true", "false"):
                raise TritonConfigError(f"{CONFIG_FILE}: {where}.{key} must be true or false, found {value!r}")
            out[key] = value in (True, "true")
        elif key == "max_queue_size":
            out[key] = _whole(value, f"{where}.{key}")
        else:
            raise TritonConfigError(f"{CONFIG_FILE}: {where}.{key} has no servekit counterpart")
    return out


def response_cache(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    """The ``cache:`` of ``servekit.yaml`` a configuration's ``response_cache { enable: true }`` stands for.

    ``None`` without one or with ``enable: false``; its size is the server's
    (``--response-cache-bytes``, Triton's ``--cache-config local,size=N``).
    """
    if not doc or "response_cache" not in doc:
        return None
    body = doc["response_cache"]
    if not isinstance(body, dict) or set(body) - {"enable"} or body.get("enable") not in (True, False, None):
        raise TritonConfigError(f"{CONFIG_FILE}: response_cache takes one field, enable: true or false")
    return {} if body.get("enable") else None


# -- sequences ----------------------------------------------------------------------------

#: Triton's control kinds and servekit's names for them (``sequence.controls[].kind``).
CONTROL_KINDS = {
    "CONTROL_SEQUENCE_START": "start",
    "CONTROL_SEQUENCE_END": "end",
    "CONTROL_SEQUENCE_READY": "ready",
    "CONTROL_SEQUENCE_CORRID": "corrid",
}
_FALSE_TRUE = {"int32_false_true": "INT32", "fp32_false_true": "FP32", "bool_false_true": "BOOL"}
#: ``sequence_batching`` fields that change only how Triton packs sequences into batches; servekit
#: runs each sequence's requests alone and in order, so the answers are the same without them.
_STRATEGIES = ("direct", "oldest")


def sequence(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    """The ``sequence:`` of ``servekit.yaml`` a configuration's ``sequence_batching`` stands for (``None``: none).

    As Triton's sequence batcher: every request must name its sequence
    (``require_sequence_id``), a sequence idles out after
    ``max_sequence_idle_microseconds`` (1 s by default), and each ``control_input``
    is a tensor fed to the model with every request (:data:`CONTROL_KINDS`), shaped
    ``[1]``, ``[1, 1]`` when the model has a batch dimension.

    :raises TritonConfigError: a field servekit cannot honour (implicit ``state``,
        ``iterative_sequence``), or a control it cannot read, named.
    """
    if not doc or "sequence_batching" not in doc:
        return None
    body = doc["sequence_batching"]
    if not isinstance(body, dict):
        raise TritonConfigError(f"{CONFIG_FILE}: sequence_batching must be a message")
    out: dict[str, Any] = {"require_sequence_id": True}
    shape = [1, 1] if _int(doc.get("max_batch_size", 0)) > 0 else [1]
    for key, value in body.items():
        if key == "max_sequence_idle_microseconds":
            out["max_idle_ms"] = max(1, _int(value)) / 1000.0
        elif key == "control_input":
            out["controls"] = [_control(item, shape) for item in (value if isinstance(value, list) else [value])]
        elif key not in _STRATEGIES:
            raise TritonConfigError(f"{CONFIG_FILE}: sequence_batching.{key} is not supported by servekit")
    return out


def _control(item: Any, shape: list[int]) -> dict[str, Any]:
    name = item.get("name") if isinstance(item, dict) else None
    controls = item.get("control", []) if isinstance(item, dict) else []
    if not isinstance(name, str) or not name or not isinstance(controls, list) or len(controls) != 1:
        raise TritonConfigError(f"{CONFIG_FILE}: sequence_batching.control_input needs a name and one control each")
    control = controls[0] if isinstance(controls[0], dict) else {}
    kind = CONTROL_KINDS.get(str(control.get("kind", "CONTROL_SEQUENCE_START")))
    if kind is None:
        raise TritonConfigError(f"{CONFIG_FILE}: control input {name!r} has an unknown kind {control.get('kind')!r}")
    if kind == "corrid":
        return {"name": name, "kind": kind, "datatype": v2_datatype(control.get("data_type", "")), "shape": shape}
    found = [key for key in _FALSE_TRUE if key in control]
    values = control.get(found[0]) if len(found) == 1 else None
    if not isinstance(values, list) or len(values) != 2:
        raise TritonConfigError(
            f"{CONFIG_FILE}: control input {name!r} needs its false and true values "
            "(one of int32_false_true, fp32_false_true, bool_false_true)"
        )
    return {"name": name, "kind": kind, "datatype": _FALSE_TRUE[found[0]], "shape": shape, "values": values}


# -- metadata -----------------------------------------------------------------------------


def v2_datatype(config_type: Any) -> str:
    """A V2 datatype from Triton's ``TYPE_*`` name (``TYPE_STRING`` is ``BYTES``)."""
    return str(config_type).removeprefix("TYPE_").replace("STRING", "BYTES")


def metadata(doc: dict[str, Any] | None) -> ModelMetadata | None:
    """The metadata a configuration's ``input`` and ``output`` give (``None``: it lists neither)."""
    if not doc or not (doc.get("input") or doc.get("output")):
        return None
    batched = _int(doc.get("max_batch_size", 0)) > 0
    signature = Signature(
        inputs=[_spec(t, batched) for t in doc.get("input", [])],
        outputs=[_spec(t, batched) for t in doc.get("output", [])],
    )
    platform = str(doc.get("platform") or doc.get("backend") or "python")
    return ModelMetadata(signatures={"serving_default": signature}, platform=platform)


def _spec(tensor: dict[str, Any], batched: bool) -> TensorSpec:
    dims = [_int(d) for d in tensor.get("dims", [])]
    datatype = v2_datatype(tensor.get("data_type", "TYPE_INVALID"))
    shape = ([-1] if batched else []) + dims
    # Triton hands NaN and infinity to the model unchecked; a config.pbtxt folder does the same
    return TensorSpec(str(tensor.get("name", "")), datatype, shape, allow_nan=True, allow_infinity=True)


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0
