"""{{ cookiecutter.plugin_name }}: {{ cookiecutter.description }}

A *framework* plugin: it teaches servekit a new kind of model file, as servekit's
own sklearn, torch and TensorFlow plugins do.  Ownership is decided once, in
``load``: a version folder holding a file that matches :data:`PATTERN` is this
plugin's, and it returns the loaded model; for any other folder it returns
``None``, so the next plugin (or the folder's ``model.py``) gets its turn.
servekit remembers which plugin loaded each model and sends that model's
other hooks (``metadata``, ``predict``, ...) to that plugin and the folder's
``model.py``, never to another framework plugin.

The worked format is a linear model in a NumPy ``.npz`` file: a weight matrix
``w`` (features x outputs) and a bias ``b``; ``predict`` answers
``inputs @ w + b``.  Put your own format's reader in :class:`LinearModel` and
its inference in :meth:`LinearModel.predict`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import servekit
from servekit.errors import BadRequest

#: The file in a version folder (``BASE/NAME/1/``) that makes the folder this plugin's.
PATTERN = "*.linear.npz"


class LinearModel:
    """What ``load`` returns; servekit hands it back to the other hooks as ``model``."""

    def __init__(self, artifact: Path):
        with np.load(artifact) as data:
            self.w = np.atleast_2d(np.asarray(data["w"], dtype=np.float64))
            self.b = np.asarray(data["b"], dtype=np.float64).reshape(-1)
        self.artifact = artifact

    def metadata(self) -> servekit.ModelMetadata:
        features, outputs = self.w.shape
        signature = servekit.Signature(
            inputs=[servekit.TensorSpec("x", "FP64", [-1, features])],
            outputs=[servekit.TensorSpec("y", "FP64", [-1, outputs])],
        )
        return servekit.ModelMetadata(signatures={"serving_default": signature}, platform="{{ cookiecutter.entry_point }}")

    def predict(self, inputs: Any) -> np.ndarray:
        if isinstance(inputs, dict):  # named inputs (V2, or V1 with names): ours has one, "x"
            inputs = inputs["x"] if "x" in inputs else next(iter(inputs.values()))
        x = np.asarray(inputs, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.w.shape[0]:
            raise BadRequest(f"expected rows of {self.w.shape[0]} numbers, found an input of shape {list(x.shape)}")
        return x @ self.w + self.b


def find_artifact(path: Path) -> Path | None:
    """The one file matching :data:`PATTERN` in a version folder, ``None`` when there is none."""
    found = sorted(path.glob(PATTERN))
    if len(found) > 1:
        raise ValueError(f"one {PATTERN} file expected in {path.name}/, found {', '.join(f.name for f in found)}")
    return found[0] if found else None


@servekit.hookimpl
def load(path: Path) -> LinearModel | None:
    """Load a version folder that holds our artifact; ``None`` leaves any other folder to other plugins."""
    artifact = find_artifact(path)
    if artifact is None:
        return None
    return LinearModel(artifact)


# servekit calls the hooks below only with models this plugin's ``load`` returned
# (a folder's model.py and wrapper plugins may run beside them): no "is this mine?" check.


@servekit.hookimpl
def metadata(model: LinearModel) -> servekit.ModelMetadata:
    return model.metadata()


@servekit.hookimpl
def predict(inputs: Any, model: LinearModel) -> np.ndarray:
    return model.predict(inputs)
