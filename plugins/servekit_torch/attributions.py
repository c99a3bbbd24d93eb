"""``:explain`` for torch models: Captum's integrated gradients.

Needs the ``captum`` package (``pip install 'servekit[torch-explain]'``); without
it the endpoint answers 501 saying so.  Floating inputs are attributed; integer
and boolean inputs (token ids, masks) are held fixed.  The explained output is
the model's only output, else ``parameters.output`` / ``options.explain_output``,
else the first.  For an output with several values per row (class scores) the
explained value is ``parameters.target`` (an index, or one per row), else each
row's arg-max, returned as ``target``.

Baselines come from ``options.explain_baseline`` (a number, a row of values, or
``{input: value}``), zero by default; ``parameters.n_steps`` or
``options.explain_steps`` (default 50) sets the integration steps.

Returns ``attributions`` (one floating input) or ``attributions_NAME`` (several),
each shaped like its input, plus ``convergence_delta`` per row.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from servekit.errors import BadRequest, ModelFailure, NotImplementedByModel, ServekitError

from .inference import call_error, match_inputs, to_call_arguments
from .served import TorchModel
from .tensors import to_numpy

DEFAULT_STEPS = 50
MAX_STEPS = 2000


def integrated_gradients(model: TorchModel, inputs: Any, parameters: dict[str, Any]) -> dict[str, np.ndarray]:
    try:
        from captum.attr import IntegratedGradients
    except ImportError:
        raise NotImplementedByModel(
            "explaining a torch model needs the captum package: pip install 'servekit[torch-explain]'"
        ) from None
    matched = match_inputs(model, inputs)
    args, kwargs, fed = to_call_arguments(model, matched)
    names = [spec.name for spec, _ in matched]
    values = [*args, *kwargs.values()]
    attributed = [i for i, v in enumerate(values) if v.is_floating_point()]
    fixed = [i for i, v in enumerate(values) if not v.is_floating_point()]
    if not attributed:
        raise BadRequest(
            "integrated gradients attributes floating inputs; this request has none "
            f"({', '.join(f'{n}: {fed[n]}' for n in names)})"
        )
    output = _output_name(model, parameters)
    keyword_names = list(kwargs)

    def forward(*tensors: torch.Tensor) -> torch.Tensor:
        # Captum passes the attributed inputs, then the fixed ones (repeated per step)
        full: list[Any] = [None] * len(values)
        for index, tensor in zip(attributed + fixed, tensors):
            full[index] = tensor
        keywords = dict(zip(keyword_names, full[len(args) :]))
        return _select(model.module(*full[: len(args)], **keywords), output, model)

    floats = tuple(values[i] for i in attributed)
    others = tuple(values[i] for i in fixed)
    with torch.inference_mode(False), torch.enable_grad():
        try:
            with torch.no_grad():
                first = forward(*floats, *others)
            target = _target(first, parameters)
            attributions, delta = IntegratedGradients(forward).attribute(
                floats,
                baselines=_baselines(model, [names[i] for i in attributed], floats),
                target=None if target is None else target.tolist(),
                additional_forward_args=others or None,
                n_steps=_steps(model, parameters),
                internal_batch_size=model.options.get("internal_batch_size"),
                return_convergence_delta=True,
            )
        except ServekitError:
            raise
        except Exception as exc:
            raise call_error(exc, fed) from exc
    result: dict[str, np.ndarray] = {}
    if len(attributed) == 1:
        result["attributions"] = _float_array(attributions[0])
    else:
        for index, tensor in zip(attributed, attributions):
            result[f"attributions_{names[index]}"] = _float_array(tensor)
    result["convergence_delta"] = _float_array(delta)
    if target is not None:
        result["target"] = target.astype(np.int64)
    return result


def _float_array(tensor: torch.Tensor) -> np.ndarray:
    return to_numpy(tensor.detach().float(), "attributions")


def _output_name(model: TorchModel, parameters: dict[str, Any]) -> str | None:
    name = parameters.get("output", model.options.get("explain_output"))
    if name is not None and not isinstance(name, str):
        raise BadRequest(f"parameter 'output' must name one output, found {name!r}")
    return name


def _select(result: Any, name: str | None, model: TorchModel) -> torch.Tensor:
    """The one output tensor to explain."""
    if isinstance(result, torch.Tensor):
        return result
    if isinstance(result, dict):
        keys = [str(k) for k in result]
        key = name if name is not None else keys[0]
        if key not in keys:
            raise BadRequest(f"unknown output {key!r} to explain; the model returns {', '.join(keys)}")
        return result[list(result)[keys.index(key)]]
    if isinstance(result, (tuple, list)):
        names = list(getattr(result, "_fields", None) or model.output_names or [])
        if len(names) != len(result):
            names = [f"output_{i}" for i in range(len(result))]
        key = name if name is not None else names[0]
        if key not in names:
            raise BadRequest(f"unknown output {key!r} to explain; the model returns {', '.join(names)}")
        return result[names.index(key)]
    raise BadRequest(f"the model returns a {type(result).__name__}, which cannot be explained")


def _target(output: torch.Tensor, parameters: dict[str, Any]) -> np.ndarray | None:
    """Which value of each row to explain: none for one value per row, else given or the arg-max."""
    rows = output.shape[0] if output.ndim else 1
    per_row = int(np.prod(output.shape[1:])) if output.ndim > 1 else 1
    raw = parameters.get("target")
    if raw is None:
        if per_row == 1:
            return None
        if output.ndim != 2:
            raise BadRequest(
                f"output has shape {list(output.shape)}; pass parameters.target to pick the value to explain"
            )
        return output.argmax(dim=1).cpu().numpy()
    values = np.asarray(raw)
    if values.dtype.kind not in "iu" or values.ndim > 1:
        raise BadRequest(f"parameter 'target' must be an index or one index per row, found {raw!r}")
    if values.ndim == 1 and len(values) != rows:
        raise BadRequest(f"parameter 'target' has {len(values)} indices for {rows} rows")
    width = output.shape[1] if output.ndim > 1 else 1
    if np.any(values < 0) or np.any(values >= width):
        raise BadRequest(f"parameter 'target' must be between 0 and {width - 1}, found {raw!r}")
    return np.broadcast_to(values, (rows,)).copy()


def _steps(model: TorchModel, parameters: dict[str, Any]) -> int:
    steps = parameters.get("n_steps", model.options.get("explain_steps", DEFAULT_STEPS))
    if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= MAX_STEPS:
        raise BadRequest(f"parameter 'n_steps' must be an integer from 1 to {MAX_STEPS}, found {steps!r}")
    return steps


def _baselines(model: TorchModel, names: list[str], floats: tuple[torch.Tensor, ...]) -> tuple[Any, ...]:
    raw = model.options.get("explain_baseline", 0.0)
    if isinstance(raw, dict):
        unknown = set(raw) - set(names)
        if unknown:
            raise ModelFailure(f"options.explain_baseline names {', '.join(sorted(unknown))}, not floating inputs")
        per_input = [raw.get(name, 0.0) for name in names]
    elif len(floats) > 1 and not isinstance(raw, (int, float)):
        raise ModelFailure("options.explain_baseline must be a number or {input: baseline} for several inputs")
    else:
        per_input = [raw] * len(floats)
    baselines: list[Any] = []  # numbers or tensors, as Captum takes them
    for name, value, tensor in zip(names, per_input, floats):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            baselines.append(float(value))
            continue
        base = torch.as_tensor(np.asarray(value, dtype=np.float64), dtype=tensor.dtype, device=tensor.device)
        try:
            baselines.append(torch.broadcast_to(base, tensor.shape).contiguous())
        except RuntimeError:
            raise ModelFailure(
                f"options.explain_baseline for {name!r} has shape {list(base.shape)}, "
                f"which does not broadcast to the input's {list(tensor.shape)}"
            ) from None
    return tuple(baselines)
