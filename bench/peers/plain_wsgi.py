"""The ceiling of a Python WSGI server: one plain callable, no framework, no checks.

For each ``BASE/NAME/1/model.joblib`` it answers V2 ``POST /v2/models/NAME/infer``
(the first input tensor) and V1 ``POST /v1/models/NAME:predict`` (``instances``)
the naive way: orjson in, one numpy array, ``model.predict``, orjson out.  No
validation, no metrics, no limits: whatever servekit adds on top of this costs
throughput, so the ratio servekit / this is how much of the engine it keeps.

    BENCH_MODELS=BASE gunicorn -w 2 -k gthread --threads 16 plain_wsgi:app
    BENCH_MODELS=BASE granian --interface wsgi --workers 2 --blocking-threads 16 plain_wsgi:app
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import orjson

MODELS = {
    p.parent.parent.name: joblib.load(p) for p in sorted(Path(os.environ["BENCH_MODELS"]).glob("*/1/model.joblib"))
}
JSON = [("Content-Type", "application/json")]


def v2(name: str, body: bytes) -> bytes:
    tensor = orjson.loads(body)["inputs"][0]
    y = MODELS[name].predict(np.asarray(tensor["data"], dtype=np.float64).reshape(tensor["shape"]))
    out = {"model_name": name, "outputs": [{"name": "predict", "datatype": "INT64", "shape": list(y.shape), "data": y}]}
    return orjson.dumps(out, option=orjson.OPT_SERIALIZE_NUMPY)


def v1(name: str, body: bytes) -> bytes:
    y = MODELS[name].predict(np.asarray(orjson.loads(body)["instances"], dtype=np.float64))
    return orjson.dumps({"predictions": y}, option=orjson.OPT_SERIALIZE_NUMPY)


def route(path: str) -> tuple[Callable[[str, bytes], bytes], str] | None:
    if path.startswith("/v2/models/") and path.endswith("/infer"):
        return v2, path[len("/v2/models/") : -len("/infer")]
    if path.startswith("/v1/models/") and path.endswith(":predict"):
        return v1, path[len("/v1/models/") : -len(":predict")]
    return None


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    path = environ["PATH_INFO"]
    if path == "/v2/health/ready":
        start_response("200 OK", [("Content-Length", "0")])
        return [b""]
    found = route(path) if environ["REQUEST_METHOD"] == "POST" else None
    if found is None or found[1] not in MODELS:
        start_response("404 Not Found", [("Content-Length", "0")])
        return [b""]
    length = int(environ.get("CONTENT_LENGTH") or 0)
    payload = found[0](found[1], environ["wsgi.input"].read(length))
    start_response("200 OK", [*JSON, ("Content-Length", str(len(payload)))])
    return [payload]
