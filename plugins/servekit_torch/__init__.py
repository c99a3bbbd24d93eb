"""PyTorch plugin: TorchScript ``model.pt``, ``torch.export`` ``model.pt2``, or ``model.pth`` + ``model.py``.

Inputs are named by ``forward()``'s arguments and outputs by dict keys or tuple
positions (``output_0``...); ``servekit.yaml``'s ``device`` picks the device
(``auto``: CUDA when torch sees a GPU).  See ``docs/torch.md``.

torch is imported only once a folder holds a torch artifact: importing this
plugin, as every ``servekit`` process does, costs nothing for other models.

No submodule is named after a hook: importing ``servekit_torch.explain`` would
replace this module's ``explain`` function with the submodule, and plugin
managers built afterwards would miss the hook.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import servekit

from .served import TorchModel

#: The library this plugin needs; without it `servekit serve` lists the plugin as not installed.
SERVEKIT_REQUIRES = ("torch",)

log = logging.getLogger("servekit.torch")

_PLUGIN_NAMES = ("torch", "pytorch", "servekit_torch")


@servekit.hookimpl
def load(path: Path, config: servekit.ModelConfig) -> TorchModel | None:
    if config.plugin is not None and config.plugin not in _PLUGIN_NAMES:
        return None
    names = ("model.pt", "model.pt2", "model.pth")
    file = next((path / n for n in names if (path / n).is_file()), None)
    if file is None:
        if config.plugin is not None:
            raise ValueError(f"plugin: {config.plugin}, but the folder holds none of {', '.join(names)}")
        return None
    from .loading import load_model

    model = load_model(file, config)
    log.info("loaded %s (%s) on %s", file.name, model.form, model.device)
    return model


@servekit.hookimpl
def unload(model: TorchModel) -> bool:
    # The module itself is freed once in-flight requests drop it; here only the
    # allocator's cached blocks go back to the GPU for the next version.
    if getattr(model.device, "type", "cpu") == "cuda":
        import torch

        torch.cuda.empty_cache()
    return True


@servekit.hookimpl
def metadata(model: TorchModel) -> servekit.ModelMetadata:
    from .signature import describe

    return describe(model)


@servekit.hookimpl
def predict(inputs: Any, model: TorchModel) -> Any:
    from .inference import predict as run

    return run(model, inputs)


@servekit.hookimpl
def explain(inputs: Any, parameters: dict[str, Any], model: TorchModel) -> Any:
    from .attributions import integrated_gradients

    return integrated_gradients(model, inputs, parameters)
