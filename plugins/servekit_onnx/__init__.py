"""ONNX plugin: ``model.onnx`` run by ONNX Runtime.

The graph's own inputs and outputs are the model's metadata: names, datatypes
and shapes, with dynamic dimensions (``batch``, ``N``, unnamed) as ``-1``; a
Triton model repository (``NAME/VERSION/model.onnx``) serves unchanged (the
core reads its ``config.pbtxt``: the V2 configuration document, ``dynamic_batching``,
label files; the graph still gives the tensors).  ``servekit.yaml``'s ``device`` picks the execution
provider: ``cuda``/``cuda:N`` needs ONNX Runtime's CUDA provider (the
``onnxruntime-gpu`` package) and a GPU, ``auto`` takes CUDA when both are
there, CPU otherwise.  Each session's intra-op threads are the worker's share
of the CPUs, so several workers do not oversubscribe the cores
(``options.intra_op_threads`` overrides).  See ``docs/frameworks.md``.

onnxruntime is imported only when a folder holds ``model.onnx``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import servekit
from servekit import find_artifact

from .session import OnnxModel

#: The library this plugin needs; without it `servekit serve` lists the plugin as not installed.
SERVEKIT_REQUIRES = ("onnxruntime",)

log = logging.getLogger("servekit.onnx")

NAMES = ("model.onnx",)
IMPLEMENTATIONS = ("mlserver_onnx.OnnxModel",)


def is_onnx_file(file: Path) -> bool:
    # a protobuf has no magic number: the suffix is what marks it (ONNX Runtime checks the rest)
    return file.suffix == ".onnx"


@servekit.hookimpl
def load(path: Path, config: servekit.ModelConfig) -> OnnxModel | None:
    file = find_artifact(path, config.options, NAMES, is_onnx_file, IMPLEMENTATIONS)
    if file is None:
        return None
    from .session import load_session

    model = load_session(file, config)
    log.info("loaded %s on %s (%d intra-op threads)", file.name, ", ".join(model.providers), model.threads)
    return model


@servekit.hookimpl
def metadata(model: OnnxModel) -> servekit.ModelMetadata:
    return model.describe()


@servekit.hookimpl
def predict(inputs: Any, model: OnnxModel, output_names: list[str] | None) -> Any:
    return model.run(inputs, output_names)
