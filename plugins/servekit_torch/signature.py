"""Input and output specs of a torch model, and the metadata the servers report.

Inputs are named by ``forward()``'s arguments: from the Python signature of an
``nn.Module``, the schema of a TorchScript module, or the argument names an
exported program recorded.  Outputs are a tensor (``output_0``), a tuple
(``output_0``, ``output_1``... or ``options.outputs``) or a dict (its keys).
``servekit.yaml`` may declare what the code cannot tell::

    options:
      inputs: {x: {datatype: FP32, shape: [-1, 4]}, lengths: INT64}
      outputs: [logits, probabilities]
"""

from __future__ import annotations

import inspect
import typing
from typing import Any

import torch
from servekit.types import DEFAULT_SIGNATURE, ModelMetadata, Signature, TensorSpec

from .served import InputSpec, OutputSpec, TorchModel
from .tensors import dtype_name, wire_datatype

# ---------------------------------------------------------------------------
# Reading specs from the three forms
# ---------------------------------------------------------------------------


def module_inputs(module: torch.nn.Module) -> list[InputSpec]:
    """``forward``'s arguments of a Python ``nn.Module``; ``*args``/``**kwargs`` are not named inputs."""
    params = inspect.signature(module.forward).parameters.values()
    return [
        InputSpec(p.name, required=p.default is inspect.Parameter.empty)
        for p in params
        if p.kind
        in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]


def module_outputs(module: torch.nn.Module) -> tuple[str, int]:
    """The output kind from ``forward``'s return annotation, with the tuple length (0 if unknown)."""
    try:
        annotation = typing.get_type_hints(module.forward).get("return")
    except Exception:  # annotations naming things the module cannot resolve: not an error
        return "unknown", 0
    return _kind_of_annotation(annotation)


def _kind_of_annotation(annotation: Any) -> tuple[str, int]:
    if annotation is torch.Tensor:
        return "tensor", 1
    fields = getattr(annotation, "_fields", None)
    if isinstance(annotation, type) and issubclass(annotation, tuple) and fields is not None:
        return "tuple", len(fields)  # a NamedTuple
    origin = typing.get_origin(annotation)
    if origin is tuple:
        args = typing.get_args(annotation)
        if args and args[-1] is not Ellipsis:
            return "tuple", len(args)
        return "tuple", 0
    if origin is dict:
        return "dict", 0
    return "unknown", 0


def script_inputs(module: Any) -> list[InputSpec]:
    schema = module.forward.schema
    return [
        InputSpec(arg.name, required=not arg.has_default_value())
        for arg in schema.arguments[1:]  # the first is self
    ]


def module_output_fields(module: torch.nn.Module) -> list[str] | None:
    """The field names of a NamedTuple ``forward`` is annotated to return, as infer names them."""
    try:
        annotation = typing.get_type_hints(module.forward).get("return")
    except Exception:  # unresolvable annotations name nothing
        return None
    fields = getattr(annotation, "_fields", None)
    return list(fields) if isinstance(annotation, type) and fields else None


def script_output_fields(module: Any) -> list[str] | None:
    """The field names of a NamedTuple a TorchScript ``forward`` returns (``None`` otherwise).

    The schema's tuple type prints as ``NamedTuple(a : Tensor, b : Tensor)``;
    the call returns a Python namedtuple whose fields name the outputs, so the
    metadata must name them the same way.
    """
    returns = module.forward.schema.returns
    if len(returns) != 1 or not isinstance(returns[0].type, torch.TupleType):
        return None
    text = returns[0].type.str()  # type: ignore[attr-defined, unused-ignore]  # torch's stubs leave it out (unused without torch)
    if not text.startswith("NamedTuple(") or not text.endswith(")"):
        return None
    names, depth, start = [], 0, len("NamedTuple(")
    for i, char in enumerate(text[start:-1], start):
        depth += char in "([" or -(char in ")]")
        if depth == 0 and char == ",":
            names.append(text[start:i].split(" : ", 1)[0].strip())
            start = i + 1
    names.append(text[start:-1].split(" : ", 1)[0].strip())
    return names if all(n.isidentifier() for n in names) else None


def script_outputs(module: Any) -> tuple[str, int]:
    returns = module.forward.schema.returns
    if len(returns) != 1:
        return "unknown", 0
    kind = returns[0].type
    if isinstance(kind, torch.TensorType):
        return "tensor", 1
    if isinstance(kind, torch.TupleType):
        return "tuple", len(kind.elements())
    if isinstance(kind, torch.DictType):
        return "dict", 0
    return "unknown", 0


def export_inputs(program: Any) -> list[InputSpec]:
    """User inputs of an exported program with the dtypes and shapes it was traced with."""
    user_inputs = list(program.graph_signature.user_inputs)
    names = user_inputs
    call_graph = getattr(program, "module_call_graph", None)
    if call_graph:
        recorded = list(getattr(call_graph[0].signature, "forward_arg_names", None) or [])
        if len(recorded) == len(user_inputs):
            names = recorded
    metas = {node.name: node.meta.get("val") for node in program.graph.nodes if node.op == "placeholder"}
    specs = []
    for name, placeholder in zip(names, user_inputs):
        dtype, shape = _fake_spec(metas.get(placeholder))
        specs.append(InputSpec(name, required=True, dtype=dtype, shape=shape))
    return specs


def export_outputs(program: Any) -> tuple[str, list[OutputSpec]]:
    out_spec = program.call_spec.out_spec
    output_node = next(node for node in program.graph.nodes if node.op == "output")
    metas = [_fake_spec(arg.meta.get("val") if hasattr(arg, "meta") else None) for arg in output_node.args[0]]
    user_count = len(program.graph_signature.user_outputs)
    metas = metas[-user_count:] if user_count else metas  # mutated buffers come first
    if out_spec is None or out_spec.is_leaf():
        return "tensor", [OutputSpec("output_0", *metas[0])] if metas else []
    flat = all(child.is_leaf() for child in _children(out_spec))
    if out_spec.type is dict and flat:
        return "dict", [OutputSpec(str(k), *m) for k, m in zip(out_spec.context, metas)]
    if out_spec.type in (tuple, list) and flat:
        return "tuple", [OutputSpec(f"output_{i}", *m) for i, m in enumerate(metas)]
    return "unknown", []


def _children(spec: Any) -> list[Any]:
    children = getattr(spec, "children", None)  # torch >= 2.10; children_specs before
    return list(children()) if callable(children) else list(spec.children_specs)


def _fake_spec(value: Any) -> tuple[str | None, list[int] | None]:
    if not isinstance(value, torch.Tensor):
        return None, None
    try:
        dtype = dtype_name(value.dtype)
    except ValueError:
        dtype = None
    shape = [int(d) if isinstance(d, int) else -1 for d in value.shape]
    return dtype, shape


# ---------------------------------------------------------------------------
# servekit.yaml options
# ---------------------------------------------------------------------------


def apply_input_options(inputs: list[InputSpec], declared: Any) -> list[InputSpec]:
    """``options.inputs``: datatype and shape per named input (or per argument, if none are known)."""
    if declared is None:
        return inputs
    if not isinstance(declared, dict):
        raise ValueError("options.inputs must map input names to a datatype or {datatype, shape}")
    known = {spec.name: spec for spec in inputs}
    if not known:  # forward(*args): the declaration names the inputs, in order
        inputs = [InputSpec(str(name)) for name in declared]
        known = {spec.name: spec for spec in inputs}
    for name, value in declared.items():
        if name not in known:
            raise ValueError(
                f"options.inputs names {name!r}, but forward() takes {', '.join(known) or 'no named arguments'}"
            )
        spec = known[name]
        if isinstance(value, dict):
            unknown = set(value) - {"datatype", "shape"}
            if unknown:
                raise ValueError(
                    f"options.inputs.{name}: unknown key(s) {', '.join(sorted(unknown))}; expected datatype, shape"
                )
            datatype, shape = value.get("datatype"), value.get("shape")
        else:
            datatype, shape = value, None
        if datatype is not None:
            spec.dtype = dtype_name(datatype)
        if shape is not None:
            if not isinstance(shape, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= -1 for d in shape
            ):
                raise ValueError(f"options.inputs.{name}.shape must be a list of sizes, -1 for any")
            spec.shape = list(shape)
    return inputs


def output_names_option(declared: Any) -> list[str] | None:
    """``options.outputs``: names for a tuple's items (or the one output), in order."""
    if declared is None:
        return None
    if isinstance(declared, str):
        declared = [declared]
    if not isinstance(declared, list) or not all(isinstance(n, str) and n for n in declared):
        raise ValueError("options.outputs must be a list of output names")
    if len(set(declared)) != len(declared):
        raise ValueError("options.outputs names an output twice")
    return list(declared)


def name_outputs(kind: str, count: int, names: list[str] | None) -> list[OutputSpec]:
    """Output specs for a tensor or a tuple of known length; nothing for dicts and unknowns."""
    if names is not None:
        if kind == "tuple" and count and len(names) != count:
            raise ValueError(f"options.outputs has {len(names)} names, but forward() returns {count} tensors")
        if kind == "tensor" and len(names) != 1:
            raise ValueError(f"options.outputs has {len(names)} names, but forward() returns one tensor")
        return [OutputSpec(n) for n in names]
    if kind == "tensor":
        return [OutputSpec("output_0")]
    if kind == "tuple":
        return [OutputSpec(f"output_{i}") for i in range(count)]
    return []


# ---------------------------------------------------------------------------
# Metadata
# ---------------------------------------------------------------------------


def describe(model: TorchModel) -> ModelMetadata:
    """One ``serving_default`` signature; undeclared datatypes read as the model's float type.

    A model without floating parameters takes any float as sent; FP32, what JSON
    clients are fed, stands for it.
    """
    fallback = wire_datatype(model.float_dtype if model.float_dtype and not model.half else "float32")

    def spec(name: str, dtype: str | None, shape: list[int] | None) -> TensorSpec:
        # NaN and infinity reach the module, as Triton's PyTorch backend passes them (-inf masks are common)
        datatype = wire_datatype(dtype) if dtype else fallback
        return TensorSpec(name, datatype, shape, allow_nan=True, allow_infinity=True)

    signature = Signature(
        inputs=[spec(i.name, i.dtype, i.shape) for i in model.inputs],
        outputs=[spec(o.name, o.dtype, o.shape) for o in model.outputs],
    )
    return ModelMetadata(signatures={DEFAULT_SIGNATURE: signature}, platform=model.platform)
