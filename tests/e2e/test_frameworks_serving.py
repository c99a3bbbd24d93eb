"""XGBoost, LightGBM, ONNX and MLflow models through a real server and the clients people use with their peers.

One ``servekit serve`` with gRPC on serves a model of each framework; Triton's
``tritonclient`` (HTTP and gRPC) and TF Serving's ``tensorflow-serving-api``
stubs ask it, and every answer must equal the library's own on the same rows,
and the metadata name the model's real inputs and outputs.  The server runs
two workers, so the plugins' threads are sized by their share of the CPUs; one
model batches adaptively and one runs in a model host (``placement: process``).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
from lazy_modules import lazy_module

pytestmark = pytest.mark.slow

# looked up at collection, imported by the first test that needs them
xgb = lazy_module("xgboost")
lgb = lazy_module("lightgbm")
ort = lazy_module("onnxruntime")
lazy_module("skl2onnx")
httpclient = lazy_module("tritonclient.http")
grpcclient = lazy_module("tritonclient.grpc")
from framework_models import FEATURES, data, save_lightgbm, save_pyfunc, save_xgboost, sklearn_onnx
from servekit.testing import ServerProcess

ROWS = data(seed=7)[0][:6]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    base = tmp_path_factory.mktemp("frameworks")
    save_xgboost(base / "xgb" / "1", "model.json", objective="multi:softprob", classes=3)
    (base / "xgb" / "servekit.yaml").write_text("batching: {max_batch_size: 16, max_batch_time_ms: 5}\n")
    save_xgboost(base / "xgb_named" / "1", "model.ubj", named=True)
    save_lightgbm(base / "lgb" / "1", "model.bst")
    save_lightgbm(base / "lgb_named" / "1", named=True)
    sklearn_named = save_sklearn_named(base / "sklearn_named" / "1")
    (base / "lgb" / "servekit.yaml").write_text("placement: process\n")
    sklearn_onnx(base / "onnx" / "1")
    (base / "onnx" / "servekit.yaml").write_text(
        "placement: process\nbatching: {max_batch_size: 16, max_batch_time_ms: 5}\n"
    )
    try:
        import mlflow.xgboost
    except ImportError:  # the mlflow cases skip
        return base
    booster = xgb.Booster(model_file=str(base / "xgb" / "1" / "model.json"))
    mlflow.xgboost.save_model(booster, base / "mlflow_xgb" / "1", pip_requirements=["mlflow"])
    save_pyfunc(base / "mlflow_pyfunc" / "1")
    import mlflow.sklearn

    mlflow.sklearn.save_model(sklearn_named, base / "mlflow_sklearn_named" / "1", pip_requirements=["mlflow"])
    return base


def save_sklearn_named(folder):
    """A LogisticRegression fitted on a DataFrame of ``FEATURES``: one input per feature, as the named boosters."""
    import joblib
    import pandas as pd
    from sklearn.linear_model import LogisticRegression

    X, y = data()
    estimator = LogisticRegression(max_iter=500).fit(pd.DataFrame(X, columns=FEATURES), y)
    folder.mkdir(parents=True)
    joblib.dump(estimator, folder / "model.joblib")
    return estimator


@pytest.fixture(scope="module")
def server(repo):
    with ServerProcess(repo, grpc_port="auto", workers=2, threads=8) as running:
        yield running


def expected(repo, name):
    """The library's own answer on ``ROWS``, from the file the server serves."""
    folder = repo / name / "1"
    if name == "onnx":
        session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
        label, proba = session.run(None, {"X": ROWS.astype(np.float32)})
        return {"label": label, "probabilities": proba}
    if name == "lgb":
        return {"predict": lgb.Booster(model_file=str(folder / "model.bst")).predict(ROWS)}
    if name == "mlflow_xgb":
        pytest.importorskip("mlflow")
        folder = repo / "xgb" / "1"
    (file,) = folder.iterdir()
    booster = xgb.Booster(model_file=str(file))
    return {"predict": booster.predict(xgb.DMatrix(ROWS, feature_names=booster.feature_names))}


def triton_inputs(module, name):
    if name == "xgb_named":
        columns = []
        for i, feature in enumerate(FEATURES):
            column = module.InferInput(feature, [len(ROWS)], "FP32")
            column.set_data_from_numpy(ROWS[:, i].astype(np.float32))
            columns.append(column)
        return columns
    dtype = "FP64" if name == "lgb" else "FP32"
    tensor = module.InferInput("X" if name == "onnx" else "input", list(ROWS.shape), dtype)
    tensor.set_data_from_numpy(ROWS.astype(np.float64 if name == "lgb" else np.float32))
    return [tensor]


@pytest.mark.parametrize("name", ["xgb", "xgb_named", "lgb", "onnx", "mlflow_xgb"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tritonclient_answers_equal_the_library(server, repo, name, protocol):
    module = httpclient if protocol == "http" else grpcclient
    port = server.http_port if protocol == "http" else server.grpc_port
    client = module.InferenceServerClient(f"127.0.0.1:{port}")
    result = client.infer(name, triton_inputs(module, name))
    for output, want in expected(repo, name).items():
        assert np.array_equal(result.as_numpy(output), want), (name, output)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tritonclient_metadata_names_the_real_tensors(server, protocol):
    module = httpclient if protocol == "http" else grpcclient
    port = server.http_port if protocol == "http" else server.grpc_port
    client = module.InferenceServerClient(f"127.0.0.1:{port}")

    def meta(name):
        got = client.get_model_metadata(name, as_json=True) if protocol == "grpc" else client.get_model_metadata(name)
        shape = [[int(d) for d in t["shape"]] for t in got["inputs"]]
        return got["platform"], [(t["name"], t["datatype"]) for t in got["inputs"]], shape, got["outputs"]

    platform, inputs, shapes, outputs = meta("onnx")
    assert platform == "onnxruntime_onnx" and inputs == [("X", "FP32")] and shapes == [[-1, 4]]
    assert [o["name"] for o in outputs] == ["label", "probabilities"]
    assert [o["datatype"] for o in outputs] == ["INT64", "FP32"]
    platform, inputs, shapes, outputs = meta("xgb_named")
    assert platform == "xgboost" and [n for n, _ in inputs] == FEATURES
    platform, inputs, shapes, _ = meta("lgb")
    assert platform == "lightgbm" and inputs == [("input", "FP64")] and shapes == [[-1, 4]]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_mlflow_pyfunc_model_through_tritonclient(server, protocol):
    """Not a flavor servekit serves natively: mlflow.pyfunc, its signature's columns as the inputs."""
    pytest.importorskip("mlflow")
    module = httpclient if protocol == "http" else grpcclient
    port = server.http_port if protocol == "http" else server.grpc_port
    client = module.InferenceServerClient(f"127.0.0.1:{port}")
    meta = client.get_model_metadata("mlflow_pyfunc", as_json=True) if protocol == "grpc" else None
    meta = meta or client.get_model_metadata("mlflow_pyfunc")
    assert [(t["name"], t["datatype"]) for t in meta["inputs"]] == [("age", "FP64"), ("income", "FP64")]
    columns = []
    for i, name in enumerate(("age", "income")):
        column = module.InferInput(name, [len(ROWS)], "FP64")
        column.set_data_from_numpy(ROWS[:, i].copy())
        columns.append(column)
    result = client.infer("mlflow_pyfunc", columns)
    assert np.array_equal(result.as_numpy("total"), (ROWS[:, 0] + ROWS[:, 1]) * 2.0)


@pytest.fixture(scope="module")
def tf_serving(server):
    pytest.importorskip("tensorflow_serving")
    tf = pytest.importorskip("tensorflow")
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        yield tf, prediction_service_pb2_grpc.PredictionServiceStub(channel)


@pytest.mark.parametrize("name", ["xgb", "lgb", "onnx"])
def test_tf_serving_predict_answers_equal_the_library(tf_serving, repo, name):
    from tensorflow_serving.apis import predict_pb2

    tf, stub = tf_serving
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    dtype = np.float64 if name == "lgb" else np.float32
    request.inputs["X" if name == "onnx" else "input"].CopyFrom(tf.make_tensor_proto(ROWS.astype(dtype)))
    response = stub.Predict(request, timeout=30)
    for output, want in expected(repo, name).items():
        assert np.array_equal(tf.make_ndarray(response.outputs[output]), want), (name, output)


def test_tf_serving_metadata_and_a_bad_request(tf_serving):
    from tensorflow_serving.apis import get_model_metadata_pb2, predict_pb2

    tf, stub = tf_serving
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = "xgb"
    request.metadata_field.append("signature_def")
    signatures = get_model_metadata_pb2.SignatureDefMap()
    assert stub.GetModelMetadata(request, timeout=30).metadata["signature_def"].Unpack(signatures)
    assert {"serving_default", "predict_proba", "predict_margin", "classification"} <= set(signatures.signature_def)
    serving = signatures.signature_def["serving_default"]
    assert [d.size for d in serving.inputs["input"].tensor_shape.dim] == [-1, 4]
    assert serving.inputs["input"].dtype == tf.float32.as_datatype_enum
    assert [d.size for d in serving.outputs["predict"].tensor_shape.dim] == [-1, 3]
    bad = predict_pb2.PredictRequest()
    bad.model_spec.name = "xgb"
    bad.inputs["input"].CopyFrom(tf.make_tensor_proto(np.zeros((2, 3), np.float32)))
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(bad, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "4 features" in info.value.details()


@pytest.mark.parametrize("name", ["xgb", "lgb", "onnx"])
def test_concurrent_rows_batched_or_hosted_answer_each_their_own(server, repo, name):
    """``xgb`` batches requests together, ``lgb`` runs in a model host, ``onnx`` batches in a model host:
    each row still gets its own answer."""
    import requests

    output = "probabilities" if name == "onnx" else "predict"
    want = expected(repo, name)[output]

    def one(i):
        r = requests.post(f"{server.url}/v1/models/{name}:predict", json={"instances": [ROWS[i].tolist()]}, timeout=30)
        answer = r.json()["predictions"][0]
        return answer[output] if name == "onnx" else answer

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(one, [i % len(ROWS) for i in range(48)]))
    for i, answer in enumerate(got):
        assert np.allclose(answer, want[i % len(ROWS)], rtol=0, atol=1e-7), i
    # the calls went through the batcher (xgb) or the host's (onnx): its rows-per-call histogram counted them
    metric = {"xgb": "servekit_batch_size_count", "onnx": "servekit_host_batch_size_count"}.get(name)
    if metric:
        for _ in range(50):  # workers write their counts every half second: poll, at most ~5 s
            text = requests.get(f"{server.url}/metrics", timeout=30).text
            found = [line for line in text.splitlines() if line.startswith(metric) and f'"{name}"' in line]
            if sum(float(line.split()[-1]) for line in found) > 0:
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"{metric} for {name} stayed 0")


def test_explain_over_the_wire_sums_to_the_margin(server, repo):
    import requests

    r = requests.post(f"{server.url}/v1/models/lgb:explain", json={"instances": ROWS.tolist()}, timeout=30)
    explanations = r.json()["explanations"]
    booster = lgb.Booster(model_file=str(repo / "lgb" / "1" / "model.bst"))
    sums = [sum(e["attributions"]) + e["base_values"] for e in explanations]
    assert np.allclose(sums, booster.predict(ROWS, raw_score=True))


def test_tf_serving_predict_of_an_mlflow_pyfunc_model(tf_serving):
    pytest.importorskip("mlflow")
    from tensorflow_serving.apis import predict_pb2

    tf, stub = tf_serving
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "mlflow_pyfunc"
    request.inputs["age"].CopyFrom(tf.make_tensor_proto(ROWS[:, 0]))
    request.inputs["income"].CopyFrom(tf.make_tensor_proto(ROWS[:, 1]))
    response = stub.Predict(request, timeout=30)
    assert np.array_equal(tf.make_ndarray(response.outputs["total"]), (ROWS[:, 0] + ROWS[:, 1]) * 2.0)


def test_a_sklearn_only_server_imports_none_of_the_framework_libraries(tmp_path):
    """The plugins are registered in every server, but their libraries load only for their own files."""
    import json
    import subprocess
    import sys
    import textwrap

    from sklearn_models import fit_regressor

    fit_regressor(tmp_path / "linear")
    script = textwrap.dedent(
        f"""
        import json, sys
        from servekit.server.app import create_app
        from servekit.server.settings import Settings

        app = create_app(Settings(paths=[{str(tmp_path / "linear")!r}], poll_interval=0), start=False)
        app.extensions["servekit"].repository.load_now()
        plugins = [name for name, _ in app.extensions["servekit"].repository.pm.list_name_plugin()]
        r = app.test_client().post("/v1/models/linear:predict", data=json.dumps({{"instances": [[1, 1]]}}))
        heavy = [m for m in ("xgboost", "lightgbm", "onnxruntime", "onnx", "mlflow") if m in sys.modules]
        print(json.dumps({{"status": r.status_code, "plugins": plugins, "heavy": heavy}}))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["status"] == 200
    assert {"xgboost", "lightgbm", "onnx", "mlflow"} <= set(result["plugins"])
    assert result["heavy"] == []


def test_tf_serving_classify_and_regress(tf_serving, repo):
    """TF Serving's Classify and Regress RPCs with tf.Example records: the boosters' probabilities and values."""
    from tensorflow.core.example import example_pb2
    from tensorflow_serving.apis import classification_pb2, regression_pb2

    _, stub = tf_serving
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "xgb"
    for row in ROWS:
        record = example_pb2.Example()
        record.features.feature["x"].float_list.value.extend(row.astype(np.float32).tolist())
        request.input.example_list.examples.append(record)
    response = stub.Classify(request, timeout=30)
    scores = [[k.score for k in c.classes] for c in response.result.classifications]
    assert [k.label for k in response.result.classifications[0].classes] == ["0", "1", "2"]
    assert np.allclose(scores, expected(repo, "xgb")["predict"], atol=1e-6)
    # a classifier has no regression signature: a clear refusal, not a 500
    regress = regression_pb2.RegressionRequest()
    regress.model_spec.name = "xgb"
    regress.input.CopyFrom(request.input)
    with pytest.raises(grpc.RpcError) as info:
        stub.Regress(regress, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()


# -- the same V2 body, the same answer: every plugin whose metadata declares one input per feature --------

#: models of four plugins (and MLflow's sklearn flavor) declaring the four ``FEATURES`` as inputs, one each
SAME_INPUTS = ["xgb_named", "lgb_named", "sklearn_named", "mlflow_sklearn_named"]


def _tensor(name, values, datatype="FP64"):
    values = np.asarray(values)
    data = values.reshape(-1).tolist()
    return {"name": name, "datatype": datatype, "shape": list(values.shape), "data": data}


def _columns(rows=ROWS):
    return [_tensor(feature, rows[:, i]) for i, feature in enumerate(FEATURES)]


#: case -> (V2 inputs, the status every one of SAME_INPUTS answers)
SAME_BODIES = {
    "one tensor per feature": (_columns(), 200),
    "one [rows, 4] tensor named input": ([_tensor("input", ROWS)], 200),
    "one [rows, 4] FP32 tensor under another name": ([_tensor("rows", ROWS.astype(np.float32), "FP32")], 200),
    "one [rows, 3] tensor": ([_tensor("input", ROWS[:, :3])], 400),
    "three of the four features": (_columns()[:3], 400),
    "the four features and one more": ([*_columns(), _tensor("extra", ROWS[:, 0])], 400),
    "a feature of two values per row": ([_tensor("age", np.c_[ROWS[:, 0], ROWS[:, 0]]), *_columns()[1:]], 400),
    "infinity in a feature": ([_tensor("age", [np.inf] + ROWS[1:, 0].tolist()), *_columns()[1:]], 400),
    "a string feature": ([_tensor("age", ["1.5"] * len(ROWS), "BYTES"), *_columns()[1:]], 400),
    "a boolean feature": ([_tensor("age", [True] * len(ROWS), "BOOL"), *_columns()[1:]], 400),
}


@pytest.mark.parametrize("case", list(SAME_BODIES))
@pytest.mark.parametrize("name", SAME_INPUTS)
def test_the_same_v2_body_is_answered_alike_by_every_plugin(server, name, case):
    import json

    import requests

    if name.startswith("mlflow"):
        pytest.importorskip("mlflow")
    meta = requests.get(f"{server.url}/v2/models/{name}", timeout=30).json()
    assert [(t["name"], t["shape"]) for t in meta["inputs"]] == [(f, [-1]) for f in FEATURES]
    inputs, status = SAME_BODIES[case]
    body = json.dumps({"inputs": inputs})  # Python's json writes Infinity as the token V2 reads
    r = requests.post(
        f"{server.url}/v2/models/{name}/infer", data=body, headers={"Content-Type": "application/json"}, timeout=30
    )
    assert r.status_code == status, r.text
    if status == 400:
        assert r.json()["error"]
