"""{{ cookiecutter.project_name }}: a PyTorch classifier served by servekit.

servekit calls these hooks (see servekit's docs/hooks.md); each names only the
arguments it needs:

- ``load``      once per version folder (``1/``, ``2/``...): the module with its weights, on its device
- ``metadata``  the inputs and outputs shown by ``/v1/models/NAME/metadata`` and V2 metadata
- ``predict``   where V1 ``:predict``, ``/predict``, V2 ``infer`` and gRPC all end

``train.py`` saves a state dict (``1/model.pth``); the network is the class below.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import servekit
from servekit import BadRequest, ModelMetadata, Signature, TensorSpec

N_FEATURES = 4
N_CLASSES = 3


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(N_FEATURES, 16), nn.ReLU(), nn.Linear(16, N_CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def pick_device(requested: str) -> torch.device:
    """``device`` from servekit.yaml: auto takes the GPU when there is one."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


@servekit.hookimpl
def load(path: Path, config: servekit.ModelConfig) -> Classifier:
    device = pick_device(config.device)
    model = Classifier()
    model.load_state_dict(torch.load(path / "model.pth", map_location=device, weights_only=True))
    return model.to(device).eval()


@servekit.hookimpl
def metadata() -> ModelMetadata:
    # servekit refuses NaN, infinity, strings and booleans here before predict runs (a 400);
    # TensorSpec(..., allow_nan=True, allow_infinity=True) lets them through to the network.
    signature = Signature(
        inputs=[TensorSpec("input", "FP32", [-1, N_FEATURES])],
        outputs=[TensorSpec("class", "INT64", [-1]), TensorSpec("probabilities", "FP32", [-1, N_CLASSES])],
    )
    return ModelMetadata(signatures={"serving_default": signature}, platform="pytorch")


def features(inputs: Any) -> np.ndarray:
    if isinstance(inputs, dict):
        if "input" not in inputs:
            raise BadRequest(f"expected an input named 'input', found {sorted(inputs)}")
        inputs = inputs["input"]
    try:
        x = np.asarray(inputs, dtype=np.float32)
    except (TypeError, ValueError):
        raise BadRequest(f"expected rows of {N_FEATURES} numbers") from None
    if x.ndim != 2 or x.shape[1] != N_FEATURES:
        raise BadRequest(f"expected rows of {N_FEATURES} numbers, found shape {list(x.shape)}")
    return x


@servekit.hookimpl
def predict(inputs: Any, model: Classifier) -> dict[str, np.ndarray]:
    device = next(model.parameters()).device
    with torch.inference_mode():
        logits = model(torch.from_numpy(features(inputs)).to(device))
        probabilities = torch.softmax(logits, dim=1).cpu().numpy()
    return {"class": probabilities.argmax(axis=1).astype(np.int64), "probabilities": probabilities}
