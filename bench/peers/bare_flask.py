"""The ceiling of our own stack: a bare Flask V2 ``infer`` route over one joblib model.

No model repository, no plugins, no validation beyond what numpy does.  Served by
gunicorn with gthread workers, like servekit:

    BENCH_MODEL=path/model.joblib gunicorn -w 2 -k gthread --threads 8 bare_flask:app
"""

from __future__ import annotations

import os

import joblib
import numpy as np
import orjson
from flask import Flask, Response, request

app = Flask(__name__)
model = joblib.load(os.environ["BENCH_MODEL"])
NAME = os.environ.get("BENCH_NAME", "iris")


@app.get("/v2/health/ready")
def ready():
    return Response(b"", status=200)


@app.post(f"/v2/models/{NAME}/infer")
def infer():
    body = orjson.loads(request.get_data())
    tensor = body["inputs"][0]
    X = np.asarray(tensor["data"], dtype=np.float64).reshape(tensor["shape"])
    y = model.predict(X)
    out = {"model_name": NAME, "outputs": [
        {"name": "predict", "datatype": "INT64", "shape": list(y.shape), "data": y}]}
    return Response(orjson.dumps(out, option=orjson.OPT_SERIALIZE_NUMPY), mimetype="application/json")
