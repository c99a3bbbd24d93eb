"""Triton's model configuration in a load request (``parameters.config``), as servekit settings.

Triton's ``load`` may carry a JSON ``ModelConfig`` that replaces the model's
``config.pbtxt``.  servekit maps what has a meaning here onto the keys of
``servekit.yaml``:

| Triton | servekit.yaml |
|---|---|
| ``max_batch_size`` | ``batching.max_batch_size`` |
| ``dynamic_batching.max_queue_delay_microseconds`` | ``batching.max_batch_time_ms`` |
| ``version_policy`` (latest / all / specific) | ``version_policy`` |
| ``instance_group[0].count`` > 1 | ``placement: process``, ``replicas`` |
| ``instance_group[0].kind`` (``KIND_CPU`` / ``KIND_GPU``, ``gpus``) | ``device`` |
| ``backend`` / ``platform`` | ``plugin`` |
| ``parameters`` (``string_value``) | ``options`` |
| ``model_warmup`` (``zero_data`` / ``random_data`` inputs) | ``warmup`` (V2 requests) |
| ``sequence_batching`` (idle time, ``control_input``) | ``sequence`` (``max_idle_ms``, ``controls``) |
| ``dynamic_batching`` priorities and queue policy | ``queue`` (``priority_levels``, ``levels``, ...) |

A field with no servekit meaning is refused (400) by name: nothing a client
sent is dropped silently.  ``name`` must be the model's; ``input`` and
``output`` are read from the model itself and are refused as overrides.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from servekit.errors import BadRequest
from servekit.folders import triton_config as triton_model_config
from servekit.folders.servekit_yaml import ConfigError, parse_model_config, read_raw_config

#: Triton backends and platforms, and the servekit plugin that serves their artifacts.
BACKENDS: dict[str, str | None] = {
    "onnxruntime": "onnx",
    "onnxruntime_onnx": "onnx",
    "pytorch": "torch",
    "pytorch_libtorch": "torch",
    "libtorch": "torch",
    "tensorflow": "tensorflow",
    "tensorflow_savedmodel": "tensorflow",
    "tensorflow_graphdef": "tensorflow",
    "python": None,  # a model.py: the plugin is chosen from the folder
    "sklearn": "sklearn",
    "huggingface": "huggingface",
}
_IGNORED = {"name"}


def settings_for(name: str, config: Any) -> dict[str, Any]:
    """The ``servekit.yaml`` settings a Triton JSON model configuration stands for."""
    doc = _parse(name, config)
    fail = _failer(name)
    if doc.get("name", name) != name:
        fail(f"config name {doc['name']!r} is not the model's name")
    settings: dict[str, Any] = {}
    batching: dict[str, Any] = {}
    for key, value in doc.items():
        if key in _IGNORED:
            continue
        if key == "max_batch_size":
            batching["max_batch_size"] = _integer(fail, key, value)
        elif key == "dynamic_batching":
            batching.update(_dynamic_batching(fail, value))
            try:
                queue = triton_model_config.queue({"dynamic_batching": value})
            except triton_model_config.TritonConfigError as exc:
                fail(str(exc).replace(f"{triton_model_config.CONFIG_FILE}: ", "config field "))
            if queue is not None:
                settings["queue"] = queue
        else:
            settings.update(_setting(fail, key, value, doc))
    if batching:
        settings["batching"] = batching
    return settings


def _setting(fail: Any, key: str, value: Any, doc: dict[str, Any]) -> dict[str, Any]:
    """The servekit.yaml settings one top-level field stands for."""
    if key == "version_policy":
        return {"version_policy": _version_policy(fail, value)}
    if key == "instance_group":
        return _instance_group(fail, value)
    if key in ("backend", "platform"):
        plugin = _plugin(fail, key, value)
        return {"plugin": plugin} if plugin else {}
    if key == "parameters":
        return {"options": _parameters(fail, value)}
    if key == "model_warmup":
        return {"warmup": _warmup(fail, value, doc.get("max_batch_size"))}
    if key == "sequence_batching":
        return {"sequence": _sequence_batching(fail, value, doc.get("max_batch_size"))}
    fail(f"config field {key!r} has no servekit counterpart{_why(key)}")
    return {}


def check(planner: Any, name: str, overrides: dict[str, Any], base_path: Path | None) -> None:
    """Refuse overrides that make the model's settings invalid, before anything changes."""
    folder = base_path or planner.entry(name).origin or planner.entry(name).base_path
    try:
        parse_model_config({**read_raw_config(folder), **overrides}, folder, planner.batching)
    except ConfigError as exc:
        raise BadRequest(f"failed to load {name!r}: {exc}") from None


def _parse(name: str, config: Any) -> dict[str, Any]:
    if isinstance(config, bytes):
        config = config.decode("utf-8", "replace")
    if isinstance(config, dict):
        return config
    try:
        doc = json.loads(config)
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"failed to load {name!r}: the config parameter is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadRequest(f"failed to load {name!r}: the config parameter must be a JSON object (a Triton ModelConfig)")
    return doc


def _failer(name: str) -> Any:
    def fail(message: str) -> None:
        raise BadRequest(f"failed to load {name!r}: {message}")

    return fail


def _why(key: str) -> str:
    if key in ("input", "output"):
        return " (servekit reads a model's inputs and outputs from the model itself; leave it out)"
    return ""


def _integer(fail: Any, key: str, value: Any, minimum: int = 0) -> int:
    """An integer as protobuf's JSON writes one: a number or a string of digits."""
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).lstrip("-").isdigit():
        fail(f"config field {key!r} must be an integer, found {value!r}")
    number = int(value)
    if number < minimum:
        fail(f"config field {key!r} must be at least {minimum}, found {number}")
    return number


def _dynamic_batching(fail: Any, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        fail("config field 'dynamic_batching' must be an object")
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key == "max_queue_delay_microseconds":
            out["max_batch_time_ms"] = _integer(fail, f"dynamic_batching.{key}", item) / 1000.0
        elif key == "preserve_ordering":
            continue  # servekit answers every request of a batch in its own order
        elif key in triton_model_config.QUEUE_FIELDS:
            continue  # the queue: settings_for
        else:
            fail(f"config field 'dynamic_batching.{key}' has no servekit counterpart")
    return out


def _sequence_batching(fail: Any, value: Any, max_batch_size: Any) -> dict[str, Any]:
    """As a ``config.pbtxt``'s: :func:`servekit.folders.triton_config.sequence`."""
    if not isinstance(value, dict):
        fail("config field 'sequence_batching' must be an object")
    try:
        found = triton_model_config.sequence({"sequence_batching": value, "max_batch_size": max_batch_size or 0})
    except triton_model_config.TritonConfigError as exc:
        fail(str(exc).replace(f"{triton_model_config.CONFIG_FILE}: ", "config field "))
        return {}
    return found or {}


def _version_policy(fail: Any, value: Any) -> Any:
    if not isinstance(value, dict) or len(value) != 1:
        fail("config field 'version_policy' must hold one of latest, all, specific")
    ((kind, body),) = value.items()
    body = body or {}
    if kind == "all":
        return "all"
    if kind == "latest":
        return {"latest": _integer(fail, "version_policy.latest.num_versions", body.get("num_versions", 1), 1)}
    if kind == "specific":
        versions = body.get("versions")
        if not isinstance(versions, list) or not versions:
            fail("config field 'version_policy.specific.versions' must list versions")
            return None
        return {"specific": [_integer(fail, "version_policy.specific.versions", v, 1) for v in versions]}
    fail(f"config field 'version_policy.{kind}' is not a version policy (latest, all, specific)")
    return None


def _instance_group(fail: Any, value: Any) -> dict[str, Any]:
    if not isinstance(value, list) or len(value) > 1:
        fail("config field 'instance_group' takes one group here (every worker serves the model)")
    group = value[0] if value else {}
    if not isinstance(group, dict):
        fail("config field 'instance_group' must list objects")
    out: dict[str, Any] = {}
    for key, item in group.items():
        if key == "count":
            count = _integer(fail, "instance_group.count", item, 1)
            if count > 1:
                out.update(placement="process", replicas=count)
        elif key == "kind":
            out.update(_kind(fail, item, group.get("gpus")))
        elif key not in ("gpus", "name"):
            fail(f"config field 'instance_group.{key}' has no servekit counterpart")
    return out


def _kind(fail: Any, kind: Any, gpus: Any) -> dict[str, Any]:
    if kind == "KIND_CPU":
        return {"device": "cpu"}
    if kind == "KIND_GPU":
        if gpus is None or gpus == []:
            return {"device": "cuda"}
        if not isinstance(gpus, list) or len(gpus) != 1:
            fail("config field 'instance_group.gpus' takes one device here (one model host per device)")
        return {"device": f"cuda:{_integer(fail, 'instance_group.gpus', gpus[0])}"}
    if kind == "KIND_AUTO":
        return {}
    fail(f"config field 'instance_group.kind' {kind!r} is not supported (KIND_AUTO, KIND_CPU, KIND_GPU)")
    return {}


def _plugin(fail: Any, key: str, value: Any) -> str | None:
    if value in ("", None):
        return None
    if not isinstance(value, str) or value not in BACKENDS:
        fail(f"config field {key!r}: {value!r} is not served here (known: {', '.join(sorted(BACKENDS))})")
    return BACKENDS[value]


def _parameters(fail: Any, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        fail("config field 'parameters' must be an object")
    options = {}
    for key, item in value.items():
        if not isinstance(item, dict) or set(item) - {"string_value"}:
            fail(f"config field 'parameters.{key}' must be {{\"string_value\": ...}}")
        options[key] = item.get("string_value", "")
    return options


def _warmup(fail: Any, value: Any, max_batch_size: Any) -> list[dict[str, Any]]:
    """Triton's ``model_warmup`` samples as V2 warm-up requests."""
    if not isinstance(value, list):
        fail("config field 'model_warmup' must list warm-up samples")
    items = []
    for sample in value:
        if not isinstance(sample, dict) or set(sample) - {"name", "batch_size", "inputs", "count"}:
            fail("config field 'model_warmup' samples take name, batch_size, inputs and count")
        batch = _integer(fail, "model_warmup.batch_size", sample.get("batch_size", 1), 1)
        inputs = sample.get("inputs") or {}
        if not isinstance(inputs, dict) or not inputs:
            fail("config field 'model_warmup.inputs' must map input names to their data")
        batched = max_batch_size not in (None, 0, "0")
        tensors = [_warmup_input(fail, name, spec, batch if batched else 0) for name, spec in inputs.items()]
        count = _integer(fail, "model_warmup.count", sample.get("count", 1), 1)
        items.append({"v2": {"inputs": tensors}, "count": count})
    return items


def _warmup_input(fail: Any, name: str, spec: Any, batch: int) -> dict[str, Any]:
    if not isinstance(spec, dict) or not str(spec.get("data_type", "")).startswith("TYPE_"):
        fail(f"config field 'model_warmup.inputs.{name}' needs a data_type (TYPE_FP32, ...)")
    datatype = spec["data_type"][len("TYPE_") :].replace("STRING", "BYTES")
    dims = [_integer(fail, f"model_warmup.inputs.{name}.dims", d, 1) for d in spec.get("dims", [])]
    shape = ([batch] if batch else []) + dims
    if not (spec.get("zero_data") or spec.get("random_data")):
        fail(f"config field 'model_warmup.inputs.{name}': only zero_data and random_data are supported")
    count = 1
    for d in shape:
        count *= d
    zero: Any = "" if datatype == "BYTES" else (False if datatype == "BOOL" else 0)
    return {"name": name, "datatype": datatype, "shape": shape, "data": [zero] * count}
