"""What the plugin keeps about a loaded torch model: the callable, its device, its tensors.

This module imports no torch, so the plugin's hooks can ask "is this one of
mine?" for every model (an sklearn one included) without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class InputSpec:
    """One argument of ``forward()``.

    ``dtype`` is the torch dtype name the model is fed (``None``: floats take the
    model's float dtype, integers and booleans keep theirs); ``shape`` uses -1
    for a dimension of any size and ``None`` for unknown.
    """

    name: str
    required: bool = True
    dtype: str | None = None
    shape: list[int] | None = None


@dataclass
class OutputSpec:
    name: str
    dtype: str | None = None
    shape: list[int] | None = None


@dataclass
class TorchModel:
    """A loaded model version, as the ``load`` hook returns it."""

    module: Any  # torch.nn.Module, torch.jit.ScriptModule or an exported program's module
    form: str  # torchscript (model.pt), export (model.pt2) or state_dict (model.pth + model.py)
    device: Any  # torch.device
    inputs: list[InputSpec]
    #: ``tensor``, ``tuple``, ``dict`` or ``unknown`` (learned from the first call)
    output_kind: str
    outputs: list[OutputSpec]
    #: the dtype undeclared floating inputs are fed (the parameters' dtype); ``None``
    #: when the module has no floating parameters: inputs keep the client's datatype
    float_dtype: str | None = "float32"
    #: the server converted the model to float16 (``options.half`` on a GPU)
    half: bool = False
    #: ``forward`` takes keyword arguments (an exported program takes positions only)
    keywords: bool = True
    #: names given to tuple outputs by ``options.outputs``
    output_names: list[str] | None = None
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def platform(self) -> str:
        return {"torchscript": "pytorch_libtorch", "export": "pytorch_export"}.get(self.form, "pytorch")

    def input_names(self) -> list[str]:
        return [spec.name for spec in self.inputs]
