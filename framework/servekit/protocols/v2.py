"""The V2 / Open Inference Protocol over HTTP (KServe, Triton, MLServer clients).

- ``GET /v2``: server metadata.  (``/v2/health/live|ready`` live in :mod:`.health`.)
- ``GET /v2/models/NAME[/versions/V]``: model metadata; ``.../ready``: readiness.
- ``POST /v2/models/NAME[/versions/V]/infer`` and ``.../explain``, with Triton's
  binary tensor data extension both ways (``Inference-Header-Content-Length``).
- The model repository extension: ``POST /v2/repository/index``,
  ``POST /v2/repository/models/NAME/load`` and ``.../unload``.

Every model answers here without code of its own: the request is decoded to
numpy (:mod:`servekit.codecs.v2`), run through the data plane, and the outputs
it returns are named and encoded back.  The request's ``parameters`` reach the
hooks unchanged; a ``signature_name`` parameter picks a signature other than
the default (sklearn's ``predict_proba``, a TF model's second signature).
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
from flask import Blueprint, Response, current_app, request

from .. import __version__
from ..codecs import json as jsonc
from ..codecs import v2 as codec
from ..dataplane import DataPlane, filter_outputs, join_stream, named_outputs
from ..errors import BadRequest, NotReady
from ..model_control import require_model_control
from ..repository import Model, ModelVersion, State
from .http import Answer, dataplane, json_response

bp = Blueprint("v2", __name__)

#: What ``GET /v2`` reports under ``extensions`` (Triton's names).
EXTENSIONS = ["binary_tensor_data", "model_repository", "parameters", "statistics", "model_configuration"]
#: The output name of an ``explain`` result that is not a named tensor.
EXPLANATION = "explanation"


# -- metadata and readiness ----------------------------------------------------------


@bp.get("/v2")
@bp.get("/v2/")
def server_metadata():
    return json_response({"name": "servekit", "version": __version__, "extensions": EXTENSIONS})


@bp.get("/v2/models/<name>")
@bp.get("/v2/models/<name>/versions/<version>")
def model_metadata(name: str, version: str | None = None):
    dp = dataplane()
    mv = dp.resolve(name, version)
    meta = dp.metadata(mv)
    signature = meta.signature()
    available = dp.repository.get_model(name).available()
    return json_response({
        "name": name,
        "versions": [str(v.version) for v in available],
        "platform": meta.platform,
        "inputs": [_tensor_metadata(t) for t in (signature.inputs if signature else [])],
        "outputs": [_tensor_metadata(t) for t in (signature.outputs if signature else [])],
    })


def _tensor_metadata(spec) -> dict[str, Any]:
    # V2 has no "unknown rank"; a single -1 is the closest it can say.
    return {"name": spec.name, "datatype": spec.datatype, "shape": spec.shape if spec.shape is not None else [-1]}


@bp.get("/v2/models/<name>/ready")
@bp.get("/v2/models/<name>/versions/<version>/ready")
def model_ready(name: str, version: str | None = None):
    try:
        # the repository, not the data plane: a probe must not wait for a load to finish
        dataplane().repository.resolve(name, version)
    except NotReady as exc:
        return json_response({"name": name, "ready": False, "error": exc.message}, 503)
    return json_response({"name": name, "ready": True})


# -- inference -----------------------------------------------------------------------


@bp.post("/v2/models/<name>/infer")
@bp.post("/v2/models/<name>/versions/<version>/infer")
def infer(name: str, version: str | None = None):
    return _run(name, version, explain=False)


@bp.post("/v2/models/<name>/explain")
@bp.post("/v2/models/<name>/versions/<version>/explain")
def explain(name: str, version: str | None = None):
    return _run(name, version, explain=True)


def _run(name: str, version: str | None, *, explain: bool) -> Response:
    body = _request_body()
    return infer_answer(dataplane(), name, version, body, request.headers.get(codec.HEADER_LENGTH),
                        explain=explain).response()


def infer_answer(
    dp: DataPlane, name: str, version: str | None, body: bytes, header_length: str | None, *, explain: bool
) -> Answer:
    """``.../infer`` or ``.../explain``: the raw body in, the encoded answer out (Flask and the fast lane)."""
    mv = dp.resolve(name, version)
    req = codec.decode_infer_request(body, header_length)
    signature = _signature_name(req.parameters)
    check_inputs(mv, req.inputs, signature)
    if explain:
        result = dp.explain(mv, req.inputs, parameters=req.parameters, signature_name=signature)
        outputs = _explanation_tensors(result)
    else:
        result = dp.predict(
            mv, req.inputs, parameters=req.parameters, signature_name=signature, output_names=req.output_names
        )
        if inspect.isgenerator(result):
            # V2 over HTTP does not stream: one answer joining every item
            outputs = join_stream(named_outputs(mv, item, signature) for item in result)
        else:
            outputs = named_outputs(mv, result, signature)
    outputs = filter_outputs(outputs, req.output_names)
    arrays = {n: codec.as_v2_array(v, n) for n, v in outputs.items()}
    requested = {o.name: o.binary for o in req.outputs or []}
    binary = {n: b if (b := requested.get(n)) is not None else req.binary_output for n in arrays}
    encoded, binary_length = codec.encode_infer_response(
        arrays, model_name=name, model_version=str(mv.version), request_id=req.id, binary=binary
    )
    if binary_length is None:
        return Answer(encoded)
    return Answer(encoded, content_type="application/octet-stream",
                  headers={codec.HEADER_LENGTH: str(binary_length)})


def _signature_name(parameters: dict[str, Any]) -> str | None:
    name = parameters.get("signature_name")
    if name is not None and not isinstance(name, str):
        raise BadRequest(f"parameter 'signature_name' must be a string, found {name!r}")
    return name or None


def check_inputs(mv: ModelVersion, inputs: dict[str, np.ndarray], signature_name: str | None) -> None:
    """Refuse an input whose shape contradicts the model's metadata (``-1``: any size).

    Only inputs the signature names, with a known shape, are checked; datatypes
    are left to the model, which converts what it can.  A declared shape of
    ``[]`` is not checked either: older SavedModels write an empty shape where
    they mean "unknown" (TF Serving's own half_plus_three does), and TF Serving
    does not hold requests to it.
    """
    signature = mv.metadata.signature(signature_name)
    if signature is None:
        return
    for spec in signature.inputs:
        arr = inputs.get(spec.name)
        if arr is None or not spec.shape:
            continue
        if len(spec.shape) != arr.ndim or any(d >= 0 and d != a for d, a in zip(spec.shape, arr.shape)):
            raise BadRequest(
                f"input {spec.name!r}: shape {list(arr.shape)} does not match the model's shape "
                f"{spec.shape} (-1 means any size)"
            )


def _explanation_tensors(result: Any) -> dict[str, Any]:
    """An explanation as named tensors; free-form JSON travels as one ``BYTES`` element.

    The JSON form is marked with ``content_type`` so a client knows to parse it.
    """
    if isinstance(result, dict) and all(isinstance(v, np.ndarray) for v in result.values()):
        return result
    if isinstance(result, np.ndarray):
        return {EXPLANATION: result}
    try:
        arr = np.asarray(result)
    except ValueError:
        arr = None
    if arr is not None and arr.dtype.kind in "biufSU":
        return {EXPLANATION: arr}
    text = np.empty(1, dtype=object)
    text[0] = jsonc.dumps(result)
    return {EXPLANATION: text}


def _request_body() -> bytes:
    """The raw body.  A gzip body (tritonclient's ``request_compression_algorithm``)
    arrives here already inflated, and size-capped, by :mod:`servekit.limits`."""
    return request.get_data(cache=False)


# -- model repository extension ----------------------------------------------------------

#: TF Serving's version states as the repository extension names them.
_INDEX_STATE = {
    State.AVAILABLE: "READY",
    State.START: "LOADING",
    State.LOADING: "LOADING",
    State.UNLOADING: "UNLOADING",
    State.END: "UNAVAILABLE",
    State.UNKNOWN: "UNAVAILABLE",
}


@bp.post("/v2/repository/index")
def repository_index():
    body = _optional_json()
    ready_only = body.get("ready", False)
    if not isinstance(ready_only, bool):
        raise BadRequest(f"'ready' must be true or false, found {ready_only!r}")
    repository = dataplane().repository
    entries = []
    for name in sorted(repository.models):
        entries += _index_entries(repository.models[name])
    if ready_only:
        entries = [e for e in entries if e["state"] == "READY"]
    return json_response(entries)


def _index_entries(model: Model) -> list[dict[str, Any]]:
    if not model.versions:
        if model.unloaded:
            reason = "unloaded"
        elif model.config_error:
            reason = model.config_error
        else:
            reason = "not loaded yet"
        return [{"name": model.name, "state": "UNAVAILABLE", "reason": reason}]
    return [
        {"name": model.name, "version": str(mv.version), "state": _INDEX_STATE[mv.state], "reason": mv.error}
        for mv in sorted(model.versions.values(), key=lambda v: v.version)
    ]


@bp.post("/v2/repository/models/<name>/load")
def repository_load(name: str):
    _require_model_control()
    overrides = sorted(k for k in _parameters(_optional_json()) if k == "config" or k.startswith("file:"))
    if overrides:
        raise BadRequest(
            f"load parameters {', '.join(overrides)} are not supported: servekit loads a model "
            "from its folder (edit servekit.yaml there instead)"
        )
    model = dataplane().repository.load_model(name)
    if not model.available():
        errors = [f"version {mv.version}: {mv.error}" for mv in model.versions.values() if mv.error]
        detail = "; ".join(errors) or model.config_error or "no version folder found"
        raise BadRequest(f"failed to load model {name!r}: {detail}")
    return json_response({"name": name, "load": True})


@bp.post("/v2/repository/models/<name>/unload")
def repository_unload(name: str):
    _require_model_control()
    _parameters(_optional_json())  # checked for shape only; unload_dependents has nothing to act on
    dataplane().repository.unload_model(name)
    return json_response({"name": name, "unload": True})


def _require_model_control() -> None:
    """Load and unload only with ``--model-control-mode explicit`` (Triton's rule, checked first)."""
    settings = current_app.extensions.get("servekit.settings")
    require_model_control(settings.model_control_mode if settings else None)


def _optional_json() -> dict[str, Any]:
    """A repository request's body: empty (tritonclient sends none for the index) or an object."""
    body = request.get_data(cache=False)
    if not body.strip():
        return {}
    doc = jsonc.loads(body)
    if not isinstance(doc, dict):
        raise BadRequest("request body must be a JSON object")
    return doc


def _parameters(body: dict[str, Any]) -> dict[str, Any]:
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise BadRequest("'parameters' must be an object")
    return parameters
