"""Running a loaded torch model on request tensors.

Inputs are matched to ``forward()``'s arguments by name; one unnamed tensor
goes to a model with one required argument; Triton's ``NAME__N`` convention
(``INPUT__0``, ``INPUT__1``...) passes tensors by position.  Tensors move to the
model's device, the call runs under ``torch.inference_mode()``, and outputs come
back to the CPU as numpy arrays named as the metadata says.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import torch
from servekit.errors import BadRequest, ModelFailure, ServekitError

from .served import InputSpec, OutputSpec, TorchModel
from .tensors import DTYPES, default_dtype, is_floating, to_numpy, to_tensor, wire_datatype

_POSITIONAL_NAME = re.compile(r"^.*__(\d+)$")
#: torch's messages for tensors of the wrong shape or dtype: the request's fault
_INPUT_ERRORS = re.compile(
    r"shapes cannot be multiplied|must match the size|size mismatch|Expected .*dim|"
    r"expected scalar type|must have the same dtype|found dtype|Expected .*shape|"
    r"Guard failed|to be equal to|expected input|not implemented for '|index out of range",
    re.IGNORECASE,
)


def predict(model: TorchModel, inputs: Any) -> dict[str, np.ndarray]:
    """Run ``forward`` and return its outputs as named numpy arrays."""
    matched = match_inputs(model, inputs)
    args, kwargs, fed = to_call_arguments(model, matched)
    with torch.inference_mode():
        try:
            result = model.module(*args, **kwargs)
        except ServekitError:
            raise
        except Exception as exc:
            raise call_error(exc, fed) from exc
    return named_outputs(model, result)


# ---------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------


def match_inputs(model: TorchModel, inputs: Any) -> list[tuple[InputSpec, np.ndarray]]:
    """Pair request tensors with ``forward``'s arguments, in the arguments' order."""
    specs = model.inputs
    if not isinstance(inputs, dict):
        required = [s for s in specs if s.required]
        if len(required) > 1:
            raise BadRequest(
                f"this model takes {len(required)} inputs ({', '.join(s.name for s in required)}); "
                'send them named, e.g. {"inputs": {"' + required[0].name + '": ...}}'
            )
        spec = required[0] if required else (specs[0] if specs else InputSpec("input"))
        return [(spec, _check_shape(spec, np.asarray(inputs)))]
    names = list(inputs)
    by_name = {s.name: s for s in specs}
    if specs and set(names) <= set(by_name):
        chosen = [(by_name[n], inputs[n]) for n in by_name if n in inputs]
    elif all(_POSITIONAL_NAME.match(n) for n in names):
        chosen = _by_position(model, inputs)
    elif not specs and len(names) == 1:  # forward(*args) without declared names
        chosen = [(InputSpec(names[0]), inputs[names[0]])]
    else:
        unknown = [n for n in names if n not in by_name]
        raise BadRequest(
            f"unknown input(s) {', '.join(unknown)}; this model takes "
            f"{', '.join(by_name) or 'positional tensors'} (or NAME__0, NAME__1... by position)"
        )
    given = {spec.name for spec, _ in chosen}
    missing = [s.name for s in specs if s.required and s.name not in given]
    if missing:
        raise BadRequest(f"missing input(s) {', '.join(missing)}; this model takes {', '.join(by_name)}")
    return [(spec, _check_shape(spec, np.asarray(value))) for spec, value in chosen]


def _by_position(model: TorchModel, inputs: dict[str, Any]) -> list[tuple[InputSpec, Any]]:
    positions = {int(_POSITIONAL_NAME.match(n).group(1)): n for n in inputs}  # type: ignore[union-attr]
    if sorted(positions) != list(range(len(positions))):
        raise BadRequest(f"positional inputs must be numbered __0 to __{len(positions) - 1}, found {', '.join(inputs)}")
    specs = model.inputs
    if specs and len(positions) > len(specs):
        raise BadRequest(f"{len(positions)} positional inputs sent; this model takes at most {len(specs)}")
    return [(specs[i] if specs else InputSpec(positions[i]), inputs[positions[i]]) for i in range(len(positions))]


def _check_shape(spec: InputSpec, array: np.ndarray) -> np.ndarray:
    expected = spec.shape
    if expected is None:
        return array
    if len(expected) != array.ndim or any(e not in (-1, a) for e, a in zip(expected, array.shape)):
        shown = [None if e == -1 else e for e in expected]
        raise BadRequest(f"input {spec.name!r}: expected shape {shown}, found {list(array.shape)}")
    return array


def fed_dtype(model: TorchModel, spec: InputSpec, array: np.ndarray) -> str:
    """The dtype a tensor is fed: the declared one (float16 under half precision) or the default."""
    if spec.dtype is None:
        return default_dtype(array, model.float_dtype)
    if model.half and is_floating(spec.dtype):
        return "float16"
    return spec.dtype


def to_call_arguments(
    model: TorchModel, matched: list[tuple[InputSpec, np.ndarray]]
) -> tuple[list[Any], dict[str, Any], dict[str, str]]:
    """Positional arguments while the order allows, keywords after a skipped optional one."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    fed: dict[str, str] = {}
    order = {s.name: i for i, s in enumerate(model.inputs)}
    position = 0
    for spec, array in matched:
        dtype = fed_dtype(model, spec, array)
        fed[spec.name] = dtype
        tensor = to_tensor(array, spec.name, dtype, model.device)
        if not model.keywords or order.get(spec.name, position) == position:
            args.append(tensor)
            position += 1
        else:
            kwargs[spec.name] = tensor
    return args, kwargs, fed


def call_error(exc: Exception, fed: dict[str, str]) -> ServekitError:
    """A 400 for torch's complaints about input shapes or dtypes, else a 500; never a traceback.

    TorchScript errors carry the model's source and file paths; only the final
    line, the actual complaint, reaches the client.
    """
    message = torch_message(exc)
    if not _INPUT_ERRORS.search(message):
        return ModelFailure(f"the model failed: {message}")
    hint = ""
    integers = [n for n, d in fed.items() if not is_floating(d) and d != "bool"]
    if integers and re.search(r"dtype|scalar type|not implemented for", message, re.IGNORECASE):
        name = integers[0]
        hint = (
            f"; input {name!r} was fed as {wire_datatype(fed[name])} (JSON integers): send floats, "
            f"or declare it in servekit.yaml, e.g. options: {{inputs: {{{name}: FP32}}}}"
        )
    return BadRequest(f"the model rejected the inputs: {message}{hint}")


def torch_message(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    # TorchScript: "The following operation failed ... Traceback ... RuntimeError: <message>"
    last = lines[-1] if len(lines) > 1 and "Traceback" in str(exc) else lines[0]
    last = re.sub(r"^(RuntimeError|ValueError|TypeError|IndexError|AssertionError):\s*", "", last)
    kind = type(exc).__name__
    return (last if kind in ("RuntimeError", "Error") else f"{kind}: {last}")[:500]


# ---------------------------------------------------------------------------
# Outputs
# ---------------------------------------------------------------------------


def named_outputs(model: TorchModel, result: Any) -> dict[str, np.ndarray]:
    """Name a tensor, tuple or dict result as the metadata does (``output_0``... or the keys)."""
    if isinstance(result, dict):
        return {str(k): to_numpy(v, str(k), model.half) for k, v in result.items()}
    if isinstance(result, (tuple, list)):
        names = getattr(result, "_fields", None) or model.output_names
        if names is None or len(names) != len(result):
            names = [f"output_{i}" for i in range(len(result))]
        return {n: to_numpy(v, n, model.half) for n, v in zip(names, result)}
    names = model.output_names
    name = names[0] if names and len(names) == 1 else "output_0"
    return {name: to_numpy(result, name, model.half)}


def probe_outputs(
    model: TorchModel, warmup: list[dict[str, Any]] | None = None, folder: Any = None
) -> list[OutputSpec] | None:
    """Learn output names, dtypes and shapes from one call at load; ``None`` when nothing tells what to feed.

    The call is fed zeros when ``options.inputs`` gives each required input a
    datatype and a shape (a dimension of any size, -1, is probed with size 1 and
    reported as -1); else the tensors of the first warm-up request in
    ``servekit.yaml`` (``warmup``: a V2 or V1 body, inline or in a ``file`` of the
    version ``folder``), whose output dimensions are all reported as -1.
    """
    required = [s for s in model.inputs if s.required]
    variable: list[int] | None  # the dimensions reported as -1 (None: all)
    if required and all(s.dtype is not None and s.shape is not None for s in required):
        example = [(s, np.zeros([1 if d == -1 else d for d in s.shape or []], dtype=_probe_dtype(s))) for s in required]
        source = "zeros of the shapes declared in options.inputs"
        variable = [0] if any(s.shape and s.shape[0] == -1 for s in required) else []
    else:
        found = warmup_example(model, warmup or [], folder)
        if found is None:
            return None
        example, source, variable = found[0], found[1], None
    args, kwargs, _ = to_call_arguments(model, example)
    with torch.inference_mode():
        try:
            result = model.module(*args, **kwargs)
        except Exception as exc:  # any failure of the user's forward fails the load
            raise ValueError(f"forward() failed on {source}: {type(exc).__name__}: {exc}") from None
    specs = []
    for name, array in named_outputs(model, result).items():
        shape = [-1 if variable is None or i in variable else n for i, n in enumerate(array.shape)]
        dtype = "float32" if model.half and array.dtype == np.float32 else array.dtype.name
        specs.append(OutputSpec(name, dtype if dtype in _WIRE_NAMES else None, shape))
    return specs


def warmup_example(
    model: TorchModel, warmup: list[dict[str, Any]], folder: Any
) -> tuple[list[tuple[InputSpec, np.ndarray]], str] | None:
    """The named tensors of the first warm-up request that feeds every required input, and where they come from.

    Only what the request states is taken: a V2 tensor's datatype and shape, a V1
    body's named columns (``inputs``) or rows (``instances``); a request this
    reading cannot place is left to the warm-up itself, which reports it.
    """
    import json
    from pathlib import Path

    specs = {s.name: s for s in model.inputs}
    for i, item in enumerate(warmup):
        kind, body = item.get("kind"), item.get("body")
        if kind == "file" and folder is not None:
            try:
                body = json.loads((Path(folder) / str(body)).read_text())
            except (OSError, ValueError):
                continue
        tensors = _request_tensors(body, model.input_names())
        if not tensors or not all(s.name in tensors for s in model.inputs if s.required):
            continue
        if any(name not in specs for name in tensors):
            continue
        return [(specs[name], array) for name, array in tensors.items()], f"warm-up request {i + 1} of servekit.yaml"
    return None


def _request_tensors(body: Any, names: list[str]) -> dict[str, np.ndarray] | None:
    """A V2 or V1 request body's inputs as named arrays (``None`` when it is neither)."""
    if not isinstance(body, dict):
        return None
    inputs = body.get("inputs")
    try:
        if isinstance(inputs, list) and all(isinstance(t, dict) and "datatype" in t for t in inputs):  # V2
            return {
                str(t["name"]): np.asarray(t["data"], dtype=DTYPES[_torch_name(t["datatype"])][1]).reshape(t["shape"])
                for t in inputs
            }
        if isinstance(inputs, dict):  # V1 columns
            return {str(k): np.asarray(v) for k, v in inputs.items()}
        if inputs is not None and len(names) == 1:
            return {names[0]: np.asarray(inputs)}
        rows = body.get("instances")
        if isinstance(rows, list) and rows and all(isinstance(r, dict) for r in rows):  # V1 named rows
            return {str(k): np.asarray([r[k] for r in rows]) for k in rows[0]}
        if isinstance(rows, list) and rows and len(names) == 1:
            return {names[0]: np.asarray(rows)}
    except (KeyError, TypeError, ValueError):
        return None
    return None


def _torch_name(datatype: Any) -> str:
    from .tensors import dtype_name

    return dtype_name(str(datatype))


_WIRE_NAMES = {"bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64"}


def _probe_dtype(spec: InputSpec) -> Any:
    return DTYPES[spec.dtype or "float32"][1]
