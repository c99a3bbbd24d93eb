"""Loading the three artifact forms without unpickling arbitrary objects.

- ``model.pt``: TorchScript (``torch.jit.save``), loaded with ``torch.jit.load``;
  its archive holds TorchScript code and tensors, not Python pickles.
- ``model.pt2``: a ``torch.export`` program (``torch.export.save``).  The archive
  is checked first: ``torch.export.load`` falls back to full unpickling for
  tensor subclasses, opaque constants, legacy weight files and sample inputs
  that are not plain tensors, and an archive needing any of that is refused.
- ``model.pth``: a state dict (``torch.save(model.state_dict())``) read with
  ``torch.load(weights_only=True)``, plus ``model.py`` defining the ``nn.Module``
  class: ``options.class`` names it (``options.init`` holds its keyword
  arguments), else the one ``nn.Module`` subclass the file defines.
"""

from __future__ import annotations

import io
import json
import logging
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch
from servekit import import_file
from servekit.types import ModelConfig

from . import signature
from .inference import probe_outputs
from .served import OutputSpec, TorchModel
from .tensors import dtype_name, resolve_device

log = logging.getLogger("servekit.torch")

ARTIFACTS = {"model.pt": "torchscript", "model.pt2": "export", "model.pth": "state_dict"}
OPTIONS = {
    "class",
    "init",
    "half",
    "inputs",
    "outputs",
    "explain_baseline",
    "explain_steps",
    "explain_output",
    "internal_batch_size",
}


def load_model(file: Path, config: ModelConfig) -> TorchModel:
    """Load ``file`` on the configured device and work out its inputs and outputs."""
    options = dict(config.options or {})
    unknown = set(options) - OPTIONS
    if unknown:  # options are shared with a model.py's own hooks, so only warn
        log.warning("options not used by the torch plugin: %s", ", ".join(sorted(unknown)))
    device = resolve_device(config.device)
    form = ARTIFACTS[file.name]
    fields: list[str] | None = None  # a NamedTuple's field names name its outputs
    if form == "torchscript":
        module = _load_torchscript(file, device)
        inputs = signature.script_inputs(module)
        kind, count = signature.script_outputs(module)
        fields = signature.script_output_fields(module)
        outputs: list[OutputSpec] | None = None
    elif form == "export":
        module, inputs, kind, outputs = _load_export(file, device)
        count = len(outputs)
    else:
        module = _load_state_dict_module(file, config, options, device)
        inputs = signature.module_inputs(module)
        kind, count = signature.module_outputs(module)
        fields = signature.module_output_fields(module)
        outputs = None

    half = _half(options, device, form)
    if half:
        module = module.half()
    model = TorchModel(
        module=module,
        form=form,
        device=device,
        inputs=signature.apply_input_options(inputs, options.get("inputs")),
        output_kind=kind,
        outputs=[],
        float_dtype="float16" if half else _float_dtype(module),
        half=half,
        keywords=form != "export",
        output_names=signature.output_names_option(options.get("outputs")) or fields,
        options=options,
    )
    model.outputs = _output_specs(model, kind, count, outputs)
    if model.output_kind in ("dict", "unknown") or any(o.dtype is None for o in model.outputs):
        probed = probe_outputs(model, config.warmup, file.parent)
        if probed is not None:
            _check_declared_names(model, probed)
            model.outputs = probed
    if model.output_kind in ("dict", "unknown") and not model.outputs:
        log.warning(
            "%s: forward() returns a %s, so the metadata lists no outputs (requests answer them all); name them in "
            "servekit.yaml with options.outputs, or let the plugin learn them at load from options.inputs "
            "(a datatype and shape for each input) or a warm-up request (docs/torch.md)",
            file,
            "dict" if model.output_kind == "dict" else "value of an unknown structure",
        )
    return model


def _check_declared_names(model: TorchModel, probed: list[OutputSpec]) -> None:
    """``options.outputs`` for a dict must be its keys: a name the call did not return would never answer."""
    declared = signature.output_names_option(model.options.get("outputs"))
    if model.output_kind != "dict" or declared is None:
        return
    returned = [o.name for o in probed]
    if sorted(declared) != sorted(returned):
        raise ValueError(
            f"options.outputs names {', '.join(declared)}, but forward() returns the keys {', '.join(returned)}"
        )


def _output_specs(model: TorchModel, kind: str, count: int, exported: list[OutputSpec] | None) -> list[OutputSpec]:
    names = model.output_names
    if exported is None:
        return signature.name_outputs(kind, count, names)
    if names is not None and kind in ("tensor", "tuple"):
        if len(names) != len(exported):
            raise ValueError(f"options.outputs has {len(names)} names, but the program returns {len(exported)} outputs")
        return [OutputSpec(n, o.dtype, o.shape) for n, o in zip(names, exported)]
    return exported


def _half(options: dict[str, Any], device: torch.device, form: str) -> bool:
    half = options.get("half", False)
    if not isinstance(half, bool):
        raise ValueError(f"options.half must be true or false, found {half!r}")  # a servekit.yaml value
    if not half:
        return False
    if device.type != "cuda":
        log.warning("options.half applies on a GPU only; serving in full precision on %s", device)
        return False
    if form == "export":
        raise ValueError("options.half works for model.pt and model.pth; export the program in float16 instead")
    return True


def _float_dtype(module: Any) -> str | None:
    """The dtype of the module's floating parameters and buffers; ``None`` when it has none."""
    tensors = module.state_dict().values()
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
            try:
                return dtype_name(tensor.dtype)
            except ValueError:
                break
    return None


# ---------------------------------------------------------------------------
# TorchScript
# ---------------------------------------------------------------------------


def _load_torchscript(file: Path, device: torch.device) -> Any:
    try:
        module = torch.jit.load(str(file), map_location=device)
    except RuntimeError as exc:
        raise ValueError(
            f"model.pt is not a TorchScript archive saved with torch.jit.save ({_first_line(exc)}); "
            "a state dict belongs in model.pth beside a model.py, an exported program in model.pt2"
        ) from None
    return module.eval()


# ---------------------------------------------------------------------------
# torch.export
# ---------------------------------------------------------------------------


def _load_export(file: Path, device: torch.device) -> tuple[Any, list, str, list[OutputSpec]]:
    check_export_archive(file)
    try:
        program = torch.export.load(str(file))
    except Exception as exc:  # torch raises many kinds for a bad archive
        raise ValueError(f"model.pt2 is not a program saved with torch.export.save ({_first_line(exc)})") from None
    weights = [t for t in program.state_dict.values() if isinstance(t, torch.Tensor)]
    if any(t.device != device for t in weights):
        from torch.export.passes import move_to_device_pass

        program = move_to_device_pass(program, device)
    inputs = signature.export_inputs(program)
    kind, outputs = signature.export_outputs(program)
    module = program.module()
    try:
        module.eval()
    except (NotImplementedError, RuntimeError):  # some versions refuse train/eval switches
        pass
    return module, inputs, kind, outputs


def check_export_archive(file: Path) -> None:
    """Refuse a ``.pt2`` archive that ``torch.export.load`` would unpickle beyond plain tensors."""
    try:
        archive = zipfile.ZipFile(file)
    except zipfile.BadZipFile:
        raise ValueError("model.pt2 is not a torch.export archive (not a zip file)") from None
    with archive:
        names = {_inside(n): n for n in archive.namelist()}
        for name, full in names.items():
            if name.startswith(("data/weights/", "data/constants/")) and name.endswith(".pt"):
                raise ValueError(
                    f"model.pt2 uses the legacy pickled format ({name}); re-save it with torch.export.save"
                )
            if name.startswith(("data/weights/", "data/constants/")) and name.endswith("config.json"):
                for entry, meta in json.loads(archive.read(full)).get("config", {}).items():
                    path_name = str(meta.get("path_name", ""))
                    if meta.get("use_pickle") or path_name.startswith(("custom_obj_", "opaque_obj_")):
                        raise ValueError(
                            f"model.pt2 stores {entry!r} as a pickled Python object; only plain tensors "
                            "are loaded (weights_only)"
                        )
            if name.startswith("data/sample_inputs/") and name.endswith(".pt"):
                try:
                    torch.load(io.BytesIO(archive.read(full)), weights_only=True)
                except (pickle.UnpicklingError, RuntimeError, EOFError) as exc:
                    raise ValueError(
                        f"model.pt2 holds sample inputs that are not plain tensors ({_first_line(exc)})"
                    ) from None


def _inside(name: str) -> str:
    """An archive member's path below the archive's root folder."""
    return name.split("/", 1)[1] if "/" in name else name


# ---------------------------------------------------------------------------
# state dict + model.py
# ---------------------------------------------------------------------------


def _load_state_dict_module(file: Path, config: ModelConfig, options: dict[str, Any], device: torch.device) -> Any:
    model_py = file.parent / "model.py"
    if not model_py.is_file() and config.base_path is not None:
        model_py = config.base_path / "model.py"
    if not model_py.is_file():
        raise ValueError("model.pth is a state dict, so the model folder needs a model.py defining the nn.Module class")
    cls = _module_class(import_file(model_py), options.get("class"))
    init = options.get("init") or {}
    if not isinstance(init, dict):
        raise ValueError("options.init must map the class's keyword arguments to values")
    state = _read_state_dict(file)
    try:
        module = cls(**init)
    except Exception as exc:  # the user's constructor may raise anything
        raise ValueError(f"model.py: {cls.__name__}(**options.init) failed: {type(exc).__name__}: {exc}") from None
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ValueError(f"model.pth does not fit {cls.__name__}: {exc}") from None
    return module.to(device).eval()


def _read_state_dict(file: Path) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise ValueError(
            "model.pth holds Python objects, not only tensors; save the weights with "
            "torch.save(model.state_dict(), 'model.pth') (objects are never unpickled)"
        ) from None
    except (RuntimeError, EOFError) as exc:
        raise ValueError(f"model.pth is not a file torch.save wrote ({_first_line(exc)})") from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]  # checkpoints that wrap the state dict (e.g. Lightning's)
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise ValueError(f"model.pth must hold a state dict (names -> tensors), found {type(state).__name__}")
    return state


def _module_class(module: Any, name: Any) -> type:
    if name is not None:
        cls = getattr(module, str(name), None)
        if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
            raise ValueError(f"options.class is {name!r}, but model.py defines no nn.Module class of that name")
        return cls
    found = [
        value
        for value in vars(module).values()
        if isinstance(value, type) and issubclass(value, torch.nn.Module) and value.__module__ == module.__name__
    ]
    if len(found) != 1:
        defined = ", ".join(c.__name__ for c in found) or "none"
        raise ValueError(
            f"model.py defines {len(found)} nn.Module classes ({defined}); name the model's class "
            "in servekit.yaml, e.g. options: {class: Net}"
        )
    return found[0]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__
