"""The V2 / Open Inference Protocol over HTTP (KServe, Triton, MLServer clients).

- ``GET /v2``: server metadata.  (``/v2/health/live|ready`` live in :mod:`.health`.)
- ``GET /v2/models/NAME[/versions/V]``: model metadata; ``.../ready``: readiness.
- ``POST /v2/models/NAME[/versions/V]/infer`` and ``.../explain``, with Triton's
  binary tensor data extension both ways (``Inference-Header-Content-Length``).
- The model repository extension: ``POST /v2/repository/index``,
  ``POST /v2/repository/models/NAME/load`` and ``.../unload``.
- Triton's statistics (``GET /v2/models[/NAME[/versions/V]]/stats``) and model
  configuration (``GET /v2/models/NAME[/versions/V]/config``) extensions.
- Triton's system shared-memory extension (``/v2/systemsharedmemory/...``:
  register, unregister, status; :mod:`servekit.codecs.shared_memory`) and the CUDA one's
  answers on a server without CUDA (``/v2/cudasharedmemory/...``).

The request decodes into the :class:`~servekit.codecs.infer_request.InferRequest` gRPC's
``ModelInfer`` decodes into too, and :meth:`DataPlane.infer` checks and runs it;
every document about the server and its models comes from :mod:`.v2_documents`,
which gRPC answers from as well.

Every model answers here without code of its own: the request is decoded to
numpy (:mod:`servekit.codecs.v2`), run through the data plane, and the outputs
it returns are named and encoded back.  The request's ``parameters`` reach the
hooks unchanged; a ``signature_name`` parameter picks a signature other than
the default (sklearn's ``predict_proba``, a TF model's second signature).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flask import Blueprint, Response, current_app, request

from servekit.codecs import json as jsonc
from servekit.codecs import shared_memory
from servekit.codecs import v2 as codec
from servekit.dataplane.data_plane import DataPlane, check_inputs
from servekit.errors import BadRequest, NotFound, NotReady
from servekit.observability import tracing
from servekit.observability.request_log import logged
from servekit.protocols import v2_documents as documents
from servekit.protocols.http import Answer, control, dataplane, json_response
from servekit.protocols.model_control import require_model_control

bp = Blueprint("v2", __name__)

#: The output name of an ``explain`` result that is not a named tensor.
EXPLANATION = "explanation"


# -- metadata and readiness ----------------------------------------------------------


@bp.get("/v2")
@bp.get("/v2/")
def server_metadata():
    return json_response(documents.server_metadata(documents.EXTENSIONS))


@bp.get("/v2/models/<name>")
@bp.get("/v2/models/<name>/versions/<version>")
def model_metadata(name: str, version: str | None = None):
    return json_response(documents.model_metadata(dataplane(), name, version))


@bp.get("/v2/models/<name>/ready")
@bp.get("/v2/models/<name>/versions/<version>/ready")
def model_ready(name: str, version: str | None = None):
    try:
        # the repository, not the data plane: a probe must not wait for a load to finish
        dataplane().resolve_now(name, version)
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
    return infer_answer(
        dataplane(), name, version, body, request.headers.get(codec.HEADER_LENGTH), explain=explain
    ).response()


def infer_answer(
    dp: DataPlane, name: str, version: str | None, body: bytes, header_length: str | None, *, explain: bool
) -> Answer:
    """``.../infer`` or ``.../explain``: the raw body in, the encoded answer out (Flask and the fast lane)."""
    mv = dp.resolve(name, version)
    with tracing.span("servekit.decode"):
        req = codec.decode_infer_request(body, header_length, dp.shared_memory)
    req.check_addressed(name, str(mv.version), mv.name)
    if explain:
        check_inputs(mv, req.inputs, req.signature_name)
        outputs = _explanation_tensors(
            dp.explain(mv, req.inputs, parameters=req.parameters, signature_name=req.signature_name)
        )
    else:
        outputs = dp.infer(mv, req)  # V2 over HTTP does not stream: one answer joining every item
    with tracing.span("servekit.encode"):
        arrays = {n: codec.as_v2_array(v, n) for n, v in outputs.items()}
        if (handed := logged()) is not None:  # the request log is on: one prediction per batch row
            handed.add_rows(arrays)
        requested = {o.name: o.binary for o in req.outputs or []}
        binary = {n: b if (b := requested.get(n)) is not None else req.binary_output for n in arrays}
        shared = shared_memory.write_outputs(dp.shared_memory, arrays, req.placements, codec.tensor_to_bytes)
        encoded, binary_length = codec.encode_infer_response(
            arrays, model_name=name, model_version=str(mv.version), request_id=req.id, binary=binary, shared=shared
        )
    if binary_length is None:
        return Answer(encoded)
    return Answer(encoded, content_type="application/octet-stream", headers={codec.HEADER_LENGTH: str(binary_length)})


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
    arrives here already inflated, and size-capped, by :mod:`servekit.server.limits`."""
    return request.get_data(cache=False)


# -- model repository extension ----------------------------------------------------------


@bp.post("/v2/repository/index")
def repository_index():
    ready_only = _optional_json().get("ready", False)
    if not isinstance(ready_only, bool):
        raise BadRequest(f"'ready' must be true or false, found {ready_only!r}")
    return json_response(documents.repository_index(dataplane(), ready_only))


@bp.post("/v2/repository/models/<name>/load")
def repository_load(name: str):
    _require_model_control()
    config, files = documents.load_arguments(name, _parameters(_optional_json()))
    control().load(name, config, files)
    return json_response({"name": name, "load": True})


@bp.post("/v2/repository/models/<name>/unload")
def repository_unload(name: str):
    _require_model_control()
    control().unload(name, documents.unload_dependents(_parameters(_optional_json())))
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


# -- Triton's statistics and model configuration extensions ---------------------------------


@bp.get("/v2/models/stats")
@bp.get("/v2/models/<name>/stats")
@bp.get("/v2/models/<name>/versions/<version>/stats")
def model_stats(name: str | None = None, version: str | None = None):
    return json_response({"model_stats": documents.model_statistics(dataplane(), name, version)})


@bp.get("/v2/models/<name>/config")
@bp.get("/v2/models/<name>/versions/<version>/config")
def model_config(name: str, version: str | None = None):
    return json_response(documents.model_configuration(dataplane(), name, version))


# -- Triton's shared-memory extensions ---------------------------------------------------------


@bp.get("/v2/systemsharedmemory/status")
@bp.get("/v2/systemsharedmemory/region/<name>/status")
def system_shared_memory_status(name: str | None = None):
    return json_response(dataplane().shared_memory.status(name))


@bp.post("/v2/systemsharedmemory/region/<name>/register")
def system_shared_memory_register(name: str):
    body = _optional_json()
    unknown = sorted(set(body) - {"key", "offset", "byte_size"})
    if unknown:
        raise BadRequest(f"system shared memory register: unknown field(s) {', '.join(unknown)}")
    if "key" not in body or "byte_size" not in body:
        raise BadRequest("system shared memory register needs 'key' and 'byte_size' (and an optional 'offset')")
    control().register_region(name, body["key"], body.get("offset", 0), body["byte_size"])
    return json_response({})


@bp.post("/v2/systemsharedmemory/unregister")
@bp.post("/v2/systemsharedmemory/region/<name>/unregister")
def system_shared_memory_unregister(name: str = ""):
    control().unregister_region(name)
    return json_response({})


@bp.get("/v2/cudasharedmemory/status")
@bp.get("/v2/cudasharedmemory/region/<name>/status")
def cuda_shared_memory_status(name: str | None = None):
    if name:
        raise NotFound(f"Unable to find cuda shared memory region: '{name}'")
    return json_response([])


@bp.post("/v2/cudasharedmemory/unregister")
@bp.post("/v2/cudasharedmemory/region/<name>/unregister")
def cuda_shared_memory_unregister(name: str = ""):
    return json_response({})  # nothing can be registered: nothing to unregister


@bp.post("/v2/cudasharedmemory/region/<name>/register")
def cuda_shared_memory_register(name: str):
    raise BadRequest(f"failed to register CUDA shared memory region '{name}': {shared_memory.CUDA_REFUSED}")
