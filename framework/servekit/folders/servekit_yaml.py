"""Reading a model folder's ``servekit.yaml`` into a :class:`ModelConfig`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from servekit.folders import pipeline
from servekit.folders import triton_config as triton_model_config
from servekit.types import (
    BatchingConfig,
    ModelConfig,
    QueueConfig,
    QueuePolicy,
    SequenceConfig,
    ShadowConfig,
    TrafficConfig,
)

CONFIG_FILE = "servekit.yaml"
_KEYS = {
    "plugin",
    "version_policy",
    "labels",
    "device",
    "batching",
    "options",
    "placement",
    "replicas",
    "concurrency",
    "warmup",
    "pin",
    "sequence",
    "pipeline",
    "queue",
    "traffic",
    "shadow",
    "cache",
    "build",  # read by `servekit build` only (servekit.scaffold.build_settings)
}
#: What one warm-up item may hold: a request body of one protocol, or a file of one.
WARMUP_KINDS = ("v1", "v2", "file")


class ConfigError(ValueError):
    """``servekit.yaml`` is unreadable or holds a wrong value; the message says which."""


def read_model_config(model_dir: Path, defaults: BatchingConfig | None = None) -> ModelConfig:
    return parse_model_config(read_raw_config(model_dir), model_dir, defaults)


def read_raw_config(model_dir: Path) -> dict[str, Any]:
    """The settings ``servekit.yaml`` holds, unchecked (``{}`` without one)."""
    path = model_dir / CONFIG_FILE
    raw: dict[str, Any] = {}
    if path.is_file():
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{CONFIG_FILE}: not valid YAML: {exc}") from None
        except OSError as exc:
            raise ConfigError(f"{CONFIG_FILE}: cannot read it: {exc.strerror}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{CONFIG_FILE}: expected a mapping of settings")
    try:  # a Triton folder: its config.pbtxt's dynamic_batching, sequence_batching, or the pipeline of an ensemble
        triton = triton_model_config.read(model_dir)
        batching = triton_model_config.batching(triton)
        sequence = triton_model_config.sequence(triton)
        cache = triton_model_config.response_cache(triton)
        ensemble = pipeline.from_triton_config(triton)
    except (triton_model_config.TritonConfigError, pipeline.PipelineError) as exc:
        raise ConfigError(str(exc)) from None
    if batching is not None and "batching" not in raw:
        raw = {**raw, "batching": batching}
    queue = triton_model_config.queue(triton)
    if queue is not None and "queue" not in raw:
        raw = {**raw, "queue": queue}
    if sequence is not None and raw.get("sequence", True) is not False:
        own = raw.get("sequence")  # servekit.yaml's keys over config.pbtxt's
        raw = {**raw, "sequence": {**sequence, **own} if isinstance(own, dict) else sequence}
    if cache is not None and "cache" not in raw:
        raw = {**raw, "cache": cache}
    if ensemble is not None and "pipeline" not in raw:
        raw = {**raw, "pipeline": ensemble}
    return raw


def parse_model_config(
    raw: dict[str, Any], model_dir: Path | None = None, defaults: BatchingConfig | None = None
) -> ModelConfig:
    unknown = set(raw) - _KEYS
    if unknown:
        raise ConfigError(
            f"{CONFIG_FILE}: unknown setting(s) {', '.join(sorted(unknown))}; expected {', '.join(sorted(_KEYS))}"
        )
    labels = raw.get("labels")
    labels = {} if labels is None else labels
    if not isinstance(labels, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v > 0 for k, v in labels.items()
    ):
        raise ConfigError(f"{CONFIG_FILE}: 'labels' must map label names to version numbers")
    batching = raw.get("batching")
    batching = {} if batching is None else batching
    if not isinstance(batching, dict) or set(batching) - {"max_batch_size", "max_batch_time_ms"}:
        raise ConfigError(f"{CONFIG_FILE}: 'batching' takes max_batch_size and max_batch_time_ms")
    base = defaults or BatchingConfig()
    options = raw.get("options")
    options = {} if options is None else options
    if not isinstance(options, dict):
        raise ConfigError(f"{CONFIG_FILE}: 'options' must be a mapping")
    device = str(raw.get("device", "auto"))
    if not (device in ("auto", "cpu", "cuda") or device.startswith("cuda:")):
        raise ConfigError(f"{CONFIG_FILE}: 'device' must be auto, cpu, cuda or cuda:N, found {device!r}")
    if not isinstance(raw.get("build") or {}, dict):
        raise ConfigError(f"{CONFIG_FILE}: 'build' must be a mapping (the settings of `servekit build`)")
    policy = raw.get("version_policy", "latest")
    check_version_policy(policy)
    placement, replicas = _placement(raw)
    return ModelConfig(
        plugin=raw.get("plugin"),
        version_policy=policy,
        labels=dict(labels),
        device=device,
        batching=BatchingConfig(
            max_batch_size=int(batching.get("max_batch_size", base.max_batch_size)),
            max_batch_time_ms=float(batching.get("max_batch_time_ms", base.max_batch_time_ms)),
        ),
        options=options,
        placement=placement,
        replicas=replicas,
        concurrency=_concurrency(raw.get("concurrency")),
        warmup=_warmup(raw.get("warmup")),
        pin=_pin(raw.get("pin", False)),
        sequence=_sequence(raw.get("sequence")),
        pipeline=_pipeline(raw.get("pipeline")),
        queue=parse_queue(raw.get("queue")),
        traffic=_traffic(raw.get("traffic")),
        shadow=_shadow(raw.get("shadow")),
        cache=_cache(raw.get("cache")),
        base_path=model_dir,
    )


_POLICY_KEYS = ("timeout_action", "default_timeout_ms", "allow_timeout_override", "max_queue_size")
_QUEUE_KEYS = ("priority_levels", "default_priority_level", *_POLICY_KEYS, "levels")


def _count(raw: Any, key: str, top: int) -> int:
    if not isinstance(raw, int) or isinstance(raw, bool) or not 0 <= raw <= top:
        raise ConfigError(f"{CONFIG_FILE}: {key!r} must be a whole number from 0 to {top}, found {raw!r}")
    return raw


def _policy(raw: dict[str, Any], where: str, base: QueuePolicy) -> QueuePolicy:
    action = raw.get("timeout_action", base.timeout_action)
    if action not in ("reject", "delay"):
        raise ConfigError(f"{CONFIG_FILE}: '{where}timeout_action' must be reject or delay, found {action!r}")
    timeout = raw.get("default_timeout_ms", base.default_timeout_ms)
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not 0 <= timeout < 86_400_000:
        raise ConfigError(
            f"{CONFIG_FILE}: '{where}default_timeout_ms' must be milliseconds (0: none), found {timeout!r}"
        )
    override = raw.get("allow_timeout_override", base.allow_timeout_override)
    if not isinstance(override, bool):
        raise ConfigError(f"{CONFIG_FILE}: '{where}allow_timeout_override' must be true or false, found {override!r}")
    size = _count(raw.get("max_queue_size", base.max_queue_size), f"{where}max_queue_size", 1_000_000)
    return QueuePolicy(action, float(timeout), override, size)


def parse_queue(raw: Any) -> QueueConfig | None:
    """``queue``: priority levels and queue policy (Triton's ``dynamic_batching`` fields of the same names)."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) - set(_QUEUE_KEYS):
        raise ConfigError(f"{CONFIG_FILE}: 'queue' takes {', '.join(_QUEUE_KEYS)}")
    levels = _count(raw.get("priority_levels", 0), "queue.priority_levels", 1_000)
    default_level = _count(raw.get("default_priority_level", 0), "queue.default_priority_level", 1_000)
    if default_level > levels:
        raise ConfigError(
            f"{CONFIG_FILE}: 'queue.default_priority_level' is {default_level}, "
            f"above 'queue.priority_levels' ({levels})"
        )
    default = _policy(raw, "queue.", QueuePolicy())
    per_level = raw.get("levels") or {}
    if not isinstance(per_level, dict):
        raise ConfigError(f"{CONFIG_FILE}: 'queue.levels' must map a priority level to its policy")
    policies = {}
    for level, policy in per_level.items():
        number = int(level) if isinstance(level, (int, str)) and str(level).isdigit() else -1
        if not 1 <= number <= levels:
            raise ConfigError(f"{CONFIG_FILE}: 'queue.levels' names level {level!r}; the levels are 1 to {levels}")
        if not isinstance(policy, dict) or set(policy) - set(_POLICY_KEYS):
            raise ConfigError(f"{CONFIG_FILE}: 'queue.levels.{level}' takes {', '.join(_POLICY_KEYS)}")
        policies[number] = _policy(policy, f"queue.levels.{level}.", default)
    return QueueConfig(levels, default_level, default, policies)


def _target(raw: Any, where: str) -> int | str:
    """A version of this model (a number) or another model (a name)."""
    if isinstance(raw, bool) or not isinstance(raw, (int, str)) or raw in ("", 0):
        raise ConfigError(f"{CONFIG_FILE}: '{where}' must be a version number or a model name, found {raw!r}")
    if isinstance(raw, str) and raw.isdigit():
        return int(raw)
    if isinstance(raw, int) and raw < 1:
        raise ConfigError(f"{CONFIG_FILE}: '{where}' must be a version number or a model name, found {raw!r}")
    return raw


def _traffic(raw: Any) -> TrafficConfig | None:
    """``traffic: {weights: {VERSION_OR_MODEL: WEIGHT, ...}, sticky: HEADER | api_key}``."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) - {"weights", "sticky"} or not isinstance(raw.get("weights"), dict):
        raise ConfigError(f"{CONFIG_FILE}: 'traffic' takes weights (a version or model name: its weight) and sticky")
    weights = []
    for target, weight in raw["weights"].items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 <= weight < float("inf"):
            raise ConfigError(f"{CONFIG_FILE}: 'traffic.weights.{target}' must be a number from 0, found {weight!r}")
        weights.append((_target(target, f"traffic.weights.{target}"), float(weight)))
    if not weights or sum(w for _, w in weights) <= 0:
        raise ConfigError(f"{CONFIG_FILE}: 'traffic.weights' must give some target a weight above 0")
    sticky = raw.get("sticky") or ""
    if not isinstance(sticky, str) or not sticky.replace("-", "").replace("_", "").isalnum() and sticky:
        raise ConfigError(f"{CONFIG_FILE}: 'traffic.sticky' must be a header name or api_key, found {sticky!r}")
    return TrafficConfig(weights, sticky.lower())


def _shadow(raw: Any) -> ShadowConfig | None:
    """``shadow: {target: VERSION_OR_MODEL, fraction: 0..1}``."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) - {"target", "fraction"} or "target" not in raw:
        raise ConfigError(f"{CONFIG_FILE}: 'shadow' takes target (a version or model name) and fraction")
    fraction = raw.get("fraction", 1.0)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
        raise ConfigError(f"{CONFIG_FILE}: 'shadow.fraction' must be a number from 0 to 1, found {fraction!r}")
    return ShadowConfig(_target(raw["target"], "shadow.target"), float(fraction))


def _concurrency(raw: Any) -> int | None:
    """``concurrency``: calls of the model that run at once in one process; ``0``: no bound."""
    if raw is None:
        return None
    if not isinstance(raw, int) or isinstance(raw, bool) or not 0 <= raw <= 1024:
        raise ConfigError(
            f"{CONFIG_FILE}: 'concurrency' must be how many calls run at once in a process, "
            f"from 1 to 1024, or 0 for no bound; found {raw!r}"
        )
    return raw


def _cache(raw: Any) -> dict[str, Any] | None:
    """``cache: true`` or ``cache: {max_bytes: N}`` (servekit.dataplane.response_cache); unset or false: off."""
    if raw is None or raw is False:
        return None
    if raw is True:
        return {}
    if not isinstance(raw, dict) or set(raw) - {"max_bytes"}:
        raise ConfigError(f"{CONFIG_FILE}: 'cache' must be true, false or a mapping with max_bytes; found {raw!r}")
    size = raw.get("max_bytes")
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size <= 0):
        raise ConfigError(f"{CONFIG_FILE}: 'cache.max_bytes' must be a positive number of bytes, found {size!r}")
    return {"max_bytes": size} if size else {}


def _pipeline(raw: Any) -> Any:
    if raw is None:
        return None
    try:
        return pipeline.parse(raw)
    except pipeline.PipelineError as exc:
        raise ConfigError(f"{CONFIG_FILE}: {exc}") from None


_SEQUENCE_KEYS = {"max_idle_ms", "require_sequence_id", "controls"}
#: ``sequence.controls[].kind``: what the tensor says (Triton's CONTROL_SEQUENCE_START, ...)
CONTROL_KINDS = ("start", "end", "ready", "corrid")
_CONTROL_TYPES = {"INT32", "FP32", "BOOL"}
_CORRID_TYPES = {"UINT64", "INT64", "UINT32", "INT32", "BYTES"}


def _sequence(raw: Any) -> SequenceConfig | None:
    """``sequence: true`` or ``sequence: {max_idle_ms, require_sequence_id, controls}``; unset or false: stateless."""
    if raw is None or raw is False:
        return None
    if raw is True:
        return SequenceConfig()
    if not isinstance(raw, dict) or set(raw) - _SEQUENCE_KEYS:
        raise ConfigError(f"{CONFIG_FILE}: 'sequence' must be true or a mapping of {', '.join(sorted(_SEQUENCE_KEYS))}")
    idle = raw.get("max_idle_ms", SequenceConfig.max_idle_ms)
    if isinstance(idle, bool) or not isinstance(idle, (int, float)) or idle <= 0:
        raise ConfigError(f"{CONFIG_FILE}: 'sequence.max_idle_ms' must be a positive number, found {idle!r}")
    required = raw.get("require_sequence_id", False)
    if not isinstance(required, bool):
        raise ConfigError(f"{CONFIG_FILE}: 'sequence.require_sequence_id' must be true or false, found {required!r}")
    controls = raw.get("controls") or []
    if not isinstance(controls, list):
        raise ConfigError(f"{CONFIG_FILE}: 'sequence.controls' must list the control tensors")
    checked = [_control(i, c) for i, c in enumerate(controls)]
    names = [c["name"] for c in checked]
    if len(set(names)) != len(names):
        raise ConfigError(f"{CONFIG_FILE}: 'sequence.controls' names a tensor twice")
    return SequenceConfig(max_idle_ms=float(idle), require_sequence_id=required, controls=checked)


def _control(i: int, raw: Any) -> dict[str, Any]:
    """One control tensor: ``{name, kind, datatype, shape (default [1]), values: [false, true]}``."""
    where = f"{CONFIG_FILE}: 'sequence.controls' item {i}"
    if not isinstance(raw, dict) or set(raw) - {"name", "kind", "datatype", "shape", "values"}:
        raise ConfigError(f"{where} takes name, kind, datatype, shape and values")
    name, kind, datatype = raw.get("name"), raw.get("kind"), raw.get("datatype")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where} needs the tensor's name")
    if kind not in CONTROL_KINDS:
        raise ConfigError(f"{where}: 'kind' must be one of {', '.join(CONTROL_KINDS)}, found {kind!r}")
    shape = raw.get("shape", [1])
    if not isinstance(shape, list) or not shape or not all(type(d) is int and d == 1 for d in shape):
        raise ConfigError(f"{where}: 'shape' must be a list of ones ([1] or [1, 1]), found {shape!r}")
    out: dict[str, Any] = {"name": name, "kind": kind, "datatype": datatype, "shape": shape}
    if kind == "corrid":
        if datatype not in _CORRID_TYPES:
            raise ConfigError(f"{where}: a corrid tensor's datatype is one of {', '.join(sorted(_CORRID_TYPES))}")
        return out
    if datatype not in _CONTROL_TYPES:
        raise ConfigError(f"{where}: 'datatype' must be one of {', '.join(sorted(_CONTROL_TYPES))}, found {datatype!r}")
    values = raw.get("values")
    if not isinstance(values, list) or len(values) != 2 or not all(isinstance(v, (int, float)) for v in values):
        raise ConfigError(f"{where}: 'values' must be the tensor's [false, true] values")
    out["values"] = values
    return out


def _pin(raw: Any) -> bool:
    if not isinstance(raw, bool):
        raise ConfigError(f"{CONFIG_FILE}: 'pin' must be true or false, found {raw!r}")
    return raw


def _warmup(raw: Any) -> list[dict[str, Any]]:
    """``warmup``: a list of sample requests, each ``{v1: body}``, ``{v2: body}`` or ``{file: path}``
    (a JSON request beside the version), with an optional ``count``."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ConfigError(f"{CONFIG_FILE}: 'warmup' must be a list of sample requests")
    items = []
    for i, item in enumerate(raw):
        kinds = [k for k in WARMUP_KINDS if isinstance(item, dict) and k in item]
        if len(kinds) != 1 or set(item) - {kinds[0], "count"}:
            raise ConfigError(
                f"{CONFIG_FILE}: warmup item {i} must hold one of v1 (a TF Serving REST predict body), "
                "v2 (a V2 infer body) or file (a JSON request beside the version), and optionally count"
            )
        count = item.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 1000:
            raise ConfigError(f"{CONFIG_FILE}: warmup item {i}: 'count' must be a number from 1 to 1000")
        body = item[kinds[0]]
        if not isinstance(body, dict if kinds[0] != "file" else str):
            raise ConfigError(
                f"{CONFIG_FILE}: warmup item {i}: {kinds[0]} must be a {'path' if kinds[0] == 'file' else 'request body'}"
            )
        items.append({"kind": kinds[0], "body": body, "count": count})
    return items


def _placement(raw: dict[str, Any]) -> tuple[str | None, int]:
    """``placement`` (worker | process, unset: the server's ``--placement``) and ``replicas``."""
    placement = raw.get("placement")
    if placement is not None and placement not in ("worker", "process"):
        raise ConfigError(f"{CONFIG_FILE}: 'placement' must be worker or process, found {placement!r}")
    replicas = raw.get("replicas", 1)
    if not isinstance(replicas, int) or isinstance(replicas, bool) or not 1 <= replicas <= 64:
        raise ConfigError(
            f"{CONFIG_FILE}: 'replicas' must be a number of host processes from 1 to 64, found {replicas!r}"
        )
    if replicas > 1 and placement == "worker":
        raise ConfigError(f"{CONFIG_FILE}: 'replicas' needs placement: process (each worker has its own copy)")
    return placement, replicas


def check_version_policy(policy: Any) -> None:
    if policy in ("latest", "all"):
        return
    if isinstance(policy, dict) and len(policy) == 1:
        ((kind, value),) = policy.items()
        if kind == "specific":
            versions = value.get("versions") if isinstance(value, dict) else value
            if (
                isinstance(versions, list)
                and versions
                and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in versions)
            ):
                return
        if kind == "latest":
            n = value.get("num_versions") if isinstance(value, dict) else value
            if isinstance(n, int) and not isinstance(n, bool) and n > 0:
                return
    raise ConfigError(
        f"{CONFIG_FILE}: 'version_policy' must be latest, all, {{latest: N}} or "
        f"{{specific: [versions]}}, found {policy!r}"
    )


def select_versions(policy: Any, available: list[int]) -> list[int]:
    """The versions a policy serves out of those on disk (TF Serving's ServableVersionPolicy)."""
    ordered = sorted(available)
    if policy == "all":
        return ordered
    if policy == "latest":
        return ordered[-1:]
    ((kind, value),) = policy.items()
    if kind == "latest":
        n = value["num_versions"] if isinstance(value, dict) else value  # checked by check_version_policy
        return ordered[-n:]
    versions = value["versions"] if isinstance(value, dict) else value
    return [v for v in ordered if v in set(versions)]
