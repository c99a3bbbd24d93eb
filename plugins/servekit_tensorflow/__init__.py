"""TensorFlow SavedModel plugin: a drop-in for TensorFlow Serving.

Serves ``saved_model.pb`` (or ``.pbtxt``) + ``variables/`` folders, TF1 graphs
and TF2 exports alike, exactly as ``tensorflow_model_server`` does: every
SignatureDef by name (``serving_default`` when none is given), graph tensor
names in the metadata, ``:classify``/``:regress`` through serialized
``tf.Example`` protos.  ``model.tflite`` folders are served through
``tf.lite.Interpreter`` (:mod:`.tflite`).  See ``docs/tensorflow.md``.

TensorFlow is imported only when a SavedModel is loaded, so a server with no
SavedModel never pays for it.  Only ``load`` looks at a folder and returns
``None`` when it holds no SavedModel; the other hooks are called with the
models this plugin loaded, and no others.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import servekit
from servekit.errors import BadRequest, NotImplementedByModel

from . import examples as _examples
from . import tflite
from .inputs import feeds_for
from .metadata import describe
from .savedmodel import TFModel, is_saved_model
from .savedmodel import load as _load
from .tflite import TFLiteModel

#: The library this plugin needs; without it `servekit serve` lists the plugin as not installed.
SERVEKIT_REQUIRES = ("tensorflow",)

PLUGIN_NAME = "tensorflow"


@servekit.hookimpl
def load(path: Path, config: servekit.ModelConfig) -> TFModel | TFLiteModel | None:
    """A SavedModel, or ``model.tflite``; a folder with both serves the SavedModel unless
    ``--prefer_tflite_model`` (``options.prefer_tflite``) says otherwise, as TF Serving does."""
    if config.plugin not in (None, PLUGIN_NAME):
        return None
    saved = is_saved_model(path, explicit=config.plugin == PLUGIN_NAME)
    if tflite.has_tflite(path) and (not saved or tflite.prefer_tflite(config.options or {})):
        return tflite.load(path, config)
    if not saved:
        return None
    return _load(path, config)


@servekit.hookimpl
def unload(model: TFModel | TFLiteModel) -> bool:
    model.close()
    return True


@servekit.hookimpl
def metadata(model: TFModel | TFLiteModel) -> servekit.ModelMetadata:
    return describe(model.signature_defs)


@servekit.hookimpl
def predict(
    inputs: Any, model: TFModel | TFLiteModel, signature_name: str | None, output_names: list[str] | None
) -> dict[str, Any]:
    """Named outputs of one signature; the V1 codec drops the name of a single output."""
    sig_name, sig_def = model.signature_def(signature_name)
    outputs = dict(sig_def.outputs)
    keys = list(output_names) if output_names else sorted(outputs)
    unknown = [k for k in keys if k not in outputs]
    if unknown:
        raise BadRequest(
            f"signature {sig_name!r} has no output(s) {', '.join(unknown)}; "
            f"its outputs are {', '.join(sorted(outputs))}"
        )
    sparse = [k for k in keys if outputs[k].WhichOneof("encoding") != "name"]
    if sparse:
        raise BadRequest(f"output(s) {', '.join(sparse)} are sparse or composite tensors; ask for others")
    feeds = feeds_for(sig_name, sig_def, inputs)
    values = model.run(feeds, [outputs[k].name for k in keys], sig_name)
    return dict(zip(keys, values))


@servekit.hookimpl
def classify(examples: list[dict[str, list[Any]]], model: TFModel | TFLiteModel, signature_name: str | None) -> Any:
    return _examples.classify(_graph(model, "classify"), examples, signature_name)


@servekit.hookimpl
def regress(examples: list[dict[str, list[Any]]], model: TFModel | TFLiteModel, signature_name: str | None) -> Any:
    return _examples.regress(_graph(model, "regress"), examples, signature_name)


def _graph(model: TFModel | TFLiteModel, verb: str) -> TFModel:
    if isinstance(model, TFLiteModel):
        raise NotImplementedByModel(
            f"a TF Lite model answers predict only: {verb} parses tf.Example protos, which TF Lite has no ops for"
        )
    return model
