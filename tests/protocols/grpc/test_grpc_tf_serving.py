"""TF Serving's gRPC API through the real ``tensorflow-serving-api`` client stubs."""

from __future__ import annotations

import json

import grpc
import ml_dtypes
import numpy as np
import pytest
import requests
from google.protobuf import json_format
from grpc_support import shared_server, tf_plugin_installed
from lazy_modules import lazy_module
from repo_paths import TF_DATA

pytestmark = pytest.mark.slow  # starts real servers or subprocesses

# looked up at collection, imported by the first test that reads them (TF Serving's protos import TensorFlow)
tf = lazy_module("tensorflow")
example_pb2 = lazy_module("tensorflow.core.example.example_pb2")
feature_pb2 = lazy_module("tensorflow.core.example.feature_pb2")
classification_pb2 = lazy_module("tensorflow_serving.apis.classification_pb2")
get_model_metadata_pb2 = lazy_module("tensorflow_serving.apis.get_model_metadata_pb2")
get_model_status_pb2 = lazy_module("tensorflow_serving.apis.get_model_status_pb2")
inference_pb2 = lazy_module("tensorflow_serving.apis.inference_pb2")
model_service_pb2_grpc = lazy_module("tensorflow_serving.apis.model_service_pb2_grpc")
predict_pb2 = lazy_module("tensorflow_serving.apis.predict_pb2")
prediction_service_pb2_grpc = lazy_module("tensorflow_serving.apis.prediction_service_pb2_grpc")
regression_pb2 = lazy_module("tensorflow_serving.apis.regression_pb2")

IRIS_FEATURES = ("sepal_length", "sepal_width", "petal_length", "petal_width")
SETOSA = [5.1, 3.5, 1.4, 0.2]
VIRGINICA = [6.7, 3.0, 5.2, 2.3]


@pytest.fixture(scope="session")
def grpc_server(request, tmp_path_factory):
    return shared_server(request, tmp_path_factory)


@pytest.fixture(scope="session")
def channel(grpc_server):
    with grpc.insecure_channel(f"127.0.0.1:{grpc_server.grpc_port}") as ch:
        yield ch


@pytest.fixture(scope="session")
def predictions(channel):
    return prediction_service_pb2_grpc.PredictionServiceStub(channel)


@pytest.fixture(scope="session")
def models(channel):
    return model_service_pb2_grpc.ModelServiceStub(channel)


def iris_request(rows=(SETOSA, VIRGINICA), **spec) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "iris"
    for key, value in spec.items():
        if key == "version":
            request.model_spec.version.value = value
        else:
            setattr(request.model_spec, key, value)
    columns = np.asarray(rows, dtype=np.float64).T
    for name, column in zip(IRIS_FEATURES, columns):
        request.inputs[name].CopyFrom(tf.make_tensor_proto(column))
    return request


def outputs(response) -> dict[str, np.ndarray]:
    return {name: tf.make_ndarray(t) for name, t in response.outputs.items()}


def rpc_error(call, *args) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, timeout=30)
    return info.value


# -- Predict ------------------------------------------------------------------------------


def test_predict_tensor_content(predictions):
    request = iris_request()
    assert all(t.tensor_content for t in request.inputs.values())  # what make_tensor_proto sends
    response = predictions.Predict(request, timeout=30)
    assert outputs(response)["predict"].tolist() == [b"setosa", b"virginica"]


def test_predict_typed_value_fields(predictions):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "iris"
    for i, name in enumerate(IRIS_FEATURES):
        tensor = request.inputs[name]
        tensor.dtype = tf.float64.as_datatype_enum
        tensor.tensor_shape.dim.add(size=2)
        tensor.double_val.extend([SETOSA[i], VIRGINICA[i]])
    response = predictions.Predict(request, timeout=30)
    assert outputs(response)["predict"].tolist() == [b"setosa", b"virginica"]


def test_predict_effective_model_spec_latest(predictions):
    response = predictions.Predict(iris_request(), timeout=30)
    assert response.model_spec.name == "iris"
    assert response.model_spec.version.value == 2
    assert response.model_spec.signature_name == "serving_default"


@pytest.mark.parametrize(
    ("spec", "version"),
    [
        ({"version": 1}, 1),
        ({"version": 2}, 2),
        ({"version_label": "stable"}, 1),
        ({"version_label": "canary"}, 2),
    ],
)
def test_predict_version_and_label(predictions, spec, version):
    response = predictions.Predict(iris_request(**spec), timeout=30)
    assert response.model_spec.version.value == version
    assert response.model_spec.WhichOneof("version_choice") == "version"


def test_predict_named_signature(predictions):
    response = predictions.Predict(iris_request(signature_name="predict_proba"), timeout=30)
    assert response.model_spec.signature_name == "predict_proba"
    proba = outputs(response)["predict_proba"]
    assert proba.shape == (2, 3)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    assert proba[0].argmax() == 0 and proba[1].argmax() == 2


def echo_request(**tensors: np.ndarray) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "echo"
    for name, value in tensors.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
    return request


def test_predict_output_filter(predictions):
    request = echo_request(a=np.arange(3, dtype=np.int32), b=np.ones((2, 2), np.float32))
    request.output_filter.append("b")
    got = outputs(predictions.Predict(request, timeout=30))
    assert list(got) == ["b"]
    np.testing.assert_array_equal(got["b"], np.ones((2, 2), np.float32))


def test_predict_without_output_filter_returns_all(predictions):
    got = outputs(predictions.Predict(echo_request(a=np.arange(3), b=np.zeros(1)), timeout=30))
    assert sorted(got) == ["a", "b"]


def test_predict_request_options_servekit_does_not_honour_are_invalid_argument(predictions):
    request = iris_request()
    request.request_options.max_cache_length = 64  # TF Serving's decoding options, not honoured here
    err = rpc_error(predictions.Predict, request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'request_options'" in err.details()


@pytest.mark.parametrize("wanted", [["nope"], ["a", "a"]])
def test_predict_bad_output_filter(predictions, wanted):
    request = echo_request(a=np.arange(3))
    request.output_filter.extend(wanted)
    err = rpc_error(predictions.Predict, request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT


ALL_DTYPES = [
    np.float32,
    np.float64,
    np.float16,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.bool_,
    np.complex64,
    np.complex128,
    ml_dtypes.bfloat16,  # TensorFlow's own bfloat16 (tf.bfloat16.as_numpy_dtype)
]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_predict_round_trips_every_dtype(predictions, dtype):
    value = np.array([[0, 1, 2], [3, 4, 5]]).astype(dtype)
    response = predictions.Predict(echo_request(x=value), timeout=30)
    back = outputs(response)["x"]
    assert back.dtype == value.dtype
    np.testing.assert_array_equal(back, value)


def test_predict_strings(predictions):
    value = np.array([[b"a", b"\x00\xff"], ["caf\u00e9".encode(), b""]], dtype=object)
    back = outputs(predictions.Predict(echo_request(s=value), timeout=30))["s"]
    assert back.tolist() == value.tolist()


@pytest.mark.parametrize(
    ("field", "dtype", "values"),
    [
        ("float_val", "float32", [1.5, -2.0]),
        ("int_val", "int8", [-128, 127]),
        ("int_val", "uint16", [0, 65535]),
        ("int64_val", "int64", [-(2**63), 2**63 - 1]),
        ("uint32_val", "uint32", [0, 2**32 - 1]),
        ("uint64_val", "uint64", [0, 2**64 - 1]),
        ("bool_val", "bool", [True, False]),
        ("half_val", "float16", [np.float16(1.5).view(np.uint16), np.float16(-2).view(np.uint16)]),
        ("scomplex_val", "complex64", [1.0, 2.0, 3.0, -4.0]),
        ("dcomplex_val", "complex128", [1.0, 2.0, 3.0, -4.0]),
    ],
)
def test_predict_typed_fields_by_dtype(predictions, field, dtype, values):
    dtype = getattr(tf, dtype)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "echo"
    tensor = request.inputs["x"]
    tensor.dtype = dtype.as_datatype_enum
    tensor.tensor_shape.dim.add(size=2)
    getattr(tensor, field).extend(int(v) if field == "half_val" else v for v in values)
    back = outputs(predictions.Predict(request, timeout=30))["x"]
    np.testing.assert_array_equal(back, tf.make_ndarray(tensor))
    assert back.dtype == dtype.as_numpy_dtype


def test_predict_one_typed_value_fills_the_shape(predictions):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "echo"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(7.0, dtype=tf.float32, shape=[2, 3]))
    assert list(request.inputs["x"].float_val) == [7.0]
    back = outputs(predictions.Predict(request, timeout=30))["x"]
    np.testing.assert_array_equal(back, np.full((2, 3), 7.0, np.float32))


def test_predict_streaming_model_answers_once_with_items_joined(predictions):
    request = echo_request(x=np.arange(6, dtype=np.int64).reshape(3, 2))
    request.model_spec.name = "chunks"
    back = outputs(predictions.Predict(request, timeout=30))["y"]
    np.testing.assert_array_equal(back, np.arange(6).reshape(3, 2) * 2)


def test_predict_with_request_state_none_or_lone_end_split(predictions):
    for state in (
        predict_pb2.PredictStreamedOptions.NONE,
        predict_pb2.PredictStreamedOptions.END_SPLIT,
    ):
        request = iris_request()
        request.predict_streamed_options.request_state = state
        assert outputs(predictions.Predict(request, timeout=30))["predict"].tolist() == [
            b"setosa",
            b"virginica",
        ]


def test_predict_refuses_split_outside_a_stream(predictions):
    request = iris_request()
    request.predict_streamed_options.request_state = predict_pb2.PredictStreamedOptions.SPLIT
    err = rpc_error(predictions.Predict, request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "PredictStreamed" in err.details()


@pytest.mark.parametrize(
    ("change", "code"),
    [
        (lambda r: setattr(r.model_spec, "name", "nope"), grpc.StatusCode.NOT_FOUND),
        (lambda r: r.model_spec.version.__setattr__("value", 9), grpc.StatusCode.NOT_FOUND),
        (lambda r: setattr(r.model_spec, "version_label", "nope"), grpc.StatusCode.NOT_FOUND),
        (lambda r: r.ClearField("model_spec"), grpc.StatusCode.INVALID_ARGUMENT),
        (lambda r: setattr(r.model_spec, "name", "broken"), grpc.StatusCode.UNAVAILABLE),
        (
            lambda r: setattr(r.model_spec, "signature_name", "nope"),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            lambda r: setattr(r.inputs["sepal_length"], "tensor_content", b"\x00" * 3),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            lambda r: setattr(r.inputs["sepal_length"], "dtype", tf.qint8.as_datatype_enum),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            lambda r: r.inputs["sepal_length"].tensor_shape.__setattr__("unknown_rank", True),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (lambda r: r.inputs.__delitem__("sepal_length"), grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
def test_predict_errors(predictions, change, code):
    request = iris_request()
    change(request)
    err = rpc_error(predictions.Predict, request)
    assert err.code() == code, err.details()
    assert err.details()


# -- Classify, Regress, MultiInference ----------------------------------------------------


def example(**features) -> example_pb2.Example:
    out = example_pb2.Example()
    for name, values in features.items():
        feature: feature_pb2.Feature = out.features.feature[name]
        if isinstance(values[0], bytes):
            feature.bytes_list.value.extend(values)
        elif isinstance(values[0], int):
            feature.int64_list.value.extend(values)
        else:
            feature.float_list.value.extend(values)
    return out


def iris_examples(target, rows=(SETOSA, VIRGINICA)):
    for row in rows:
        target.example_list.examples.append(example(**{n: [v] for n, v in zip(IRIS_FEATURES, row)}))


def test_classify(predictions):
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "iris"
    iris_examples(request.input)
    response = predictions.Classify(request, timeout=30)
    assert response.model_spec.name == "iris" and response.model_spec.version.value == 2
    best = [max(c.classes, key=lambda k: k.score).label for c in response.result.classifications]
    assert best == ["setosa", "virginica"]
    for c in response.result.classifications:
        assert sorted(k.label for k in c.classes) == ["setosa", "versicolor", "virginica"]
        assert sum(k.score for k in c.classes) == pytest.approx(1.0, abs=1e-5)


def test_classify_with_context(predictions):
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "iris"
    request.model_spec.version_label = "stable"
    with_context = request.input.example_list_with_context
    with_context.context.CopyFrom(example(sepal_length=[5.1], sepal_width=[3.5]))
    with_context.examples.append(example(petal_length=[1.4], petal_width=[0.2]))
    # an example's own feature wins over the context's
    with_context.examples.append(example(petal_length=[5.2], petal_width=[2.3], sepal_length=[6.7], sepal_width=[3.0]))
    response = predictions.Classify(request, timeout=30)
    assert response.model_spec.version.value == 1
    best = [max(c.classes, key=lambda k: k.score).label for c in response.result.classifications]
    assert best == ["setosa", "virginica"]


def test_classify_empty_input(predictions):
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "iris"
    assert rpc_error(predictions.Classify, request).code() == grpc.StatusCode.INVALID_ARGUMENT


def test_regress(predictions):
    request = regression_pb2.RegressionRequest()
    request.model_spec.name = "linear"
    for row in ([1.0, 1.0], [2.0, 3.0]):
        request.input.example_list.examples.append(example(inputs=row))
    response = predictions.Regress(request, timeout=30)
    assert [r.value for r in response.result.regressions] == pytest.approx([6.0, 14.0])
    assert response.model_spec.name == "linear" and response.model_spec.version.value == 1


def test_regress_on_a_classifier_is_invalid(predictions):
    request = regression_pb2.RegressionRequest()
    request.model_spec.name = "iris"
    iris_examples(request.input)
    assert rpc_error(predictions.Regress, request).code() == grpc.StatusCode.INVALID_ARGUMENT


def multi_request(*tasks) -> inference_pb2.MultiInferenceRequest:
    request = inference_pb2.MultiInferenceRequest()
    for name, signature, method in tasks:
        task = request.tasks.add(method_name=method)
        task.model_spec.name = name
        task.model_spec.signature_name = signature
    iris_examples(request.input)
    return request


CLASSIFY = "tensorflow/serving/classify"
REGRESS = "tensorflow/serving/regress"


def test_multi_inference(predictions):
    request = multi_request(("iris", "", CLASSIFY), ("iris", "classification", CLASSIFY))
    response = predictions.MultiInference(request, timeout=30)
    assert [r.model_spec.signature_name for r in response.results] == [
        "serving_default",
        "classification",
    ]
    for result in response.results:
        assert result.WhichOneof("result") == "classification_result"
        best = [max(c.classes, key=lambda k: k.score).label for c in result.classification_result.classifications]
        assert best == ["setosa", "virginica"]


@pytest.mark.parametrize(
    "tasks",
    [
        [],
        [("iris", "", CLASSIFY), ("linear", "x", REGRESS)],
        [("iris", "", CLASSIFY), ("iris", "serving_default", CLASSIFY)],
        [("iris", "", "tensorflow/serving/predict")],
    ],
)
def test_multi_inference_invalid(predictions, tasks):
    err = rpc_error(predictions.MultiInference, multi_request(*tasks))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()


# -- GetModelMetadata ----------------------------------------------------------------------


def metadata_request(name, version=None, fields=("signature_def",)):
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = name
    if version is not None:
        request.model_spec.version.value = version
    request.metadata_field.extend(fields)
    return request


def as_json(response) -> dict:
    """The response as TF Serving's REST API prints it (the ``Any`` unpacked)."""
    doc = json_format.MessageToDict(
        response, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    doc["metadata"]["signature_def"].pop("@type")
    for signature in doc["metadata"]["signature_def"]["signature_def"].values():
        if not signature.get("defaults"):
            signature.pop("defaults", None)
    return doc


def test_metadata_packs_a_signature_def_map(predictions, grpc_server):
    response = predictions.GetModelMetadata(metadata_request("iris", 1), timeout=30)
    packed = response.metadata["signature_def"]
    assert packed.type_url == "type.googleapis.com/tensorflow.serving.SignatureDefMap"
    signatures = get_model_metadata_pb2.SignatureDefMap()
    assert packed.Unpack(signatures)
    serving = signatures.signature_def["serving_default"]
    assert sorted(serving.inputs) == sorted(IRIS_FEATURES)
    assert serving.inputs["sepal_length"].dtype == tf.float64.as_datatype_enum
    assert [d.size for d in serving.inputs["sepal_length"].tensor_shape.dim] == [-1]
    assert serving.outputs["predict"].dtype == tf.string.as_datatype_enum
    assert serving.method_name == "tensorflow/serving/predict"
    assert signatures.signature_def["classification"].method_name == "tensorflow/serving/classify"
    # the same document the REST API answers
    rest = requests.get(f"{grpc_server.url}/v1/models/iris/versions/1/metadata", timeout=30).json()
    for signature in rest["metadata"]["signature_def"]["signature_def"].values():
        if not signature.get("defaults"):
            signature.pop("defaults", None)
    assert as_json(response) == rest


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ((), grpc.StatusCode.INVALID_ARGUMENT),
        (("signature_def", "nope"), grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
def test_metadata_fields(predictions, fields, code):
    assert rpc_error(predictions.GetModelMetadata, metadata_request("iris", fields=fields)).code() == code


def test_metadata_unknown_model(predictions):
    assert rpc_error(predictions.GetModelMetadata, metadata_request("nope")).code() == grpc.StatusCode.NOT_FOUND


# -- GetModelStatus ------------------------------------------------------------------------


def status_request(name, version=None, label=None):
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = name
    if version is not None:
        request.model_spec.version.value = version
    if label is not None:
        request.model_spec.version_label = label
    return request


def test_model_status_all_versions(models):
    response = models.GetModelStatus(status_request("iris"), timeout=30)
    got = [
        (
            s.version,
            get_model_status_pb2.ModelVersionStatus.State.Name(s.state),
            s.status.error_code,
        )
        for s in response.model_version_status
    ]
    assert got == [(2, "AVAILABLE", 0), (1, "AVAILABLE", 0)]


def test_model_status_by_version_and_label(models):
    assert [s.version for s in models.GetModelStatus(status_request("iris", 1), timeout=30).model_version_status] == [1]
    response = models.GetModelStatus(status_request("iris", label="canary"), timeout=30)
    assert [s.version for s in response.model_version_status] == [2]


def test_model_status_of_a_failed_load(models):
    (status,) = models.GetModelStatus(status_request("broken"), timeout=30).model_version_status
    assert get_model_status_pb2.ModelVersionStatus.State.Name(status.state) == "END"
    assert status.status.error_code != 0 and status.status.error_message


@pytest.mark.parametrize("asked", [("nope",), ("iris", 9), ("",)], ids=["unknown-model", "unknown-version", "no-name"])
def test_model_status_errors(models, asked):
    code = rpc_error(models.GetModelStatus, status_request(*asked)).code()
    assert code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT)
    assert (code == grpc.StatusCode.INVALID_ARGUMENT) == (asked[0] == "")


def test_reload_config_without_a_model_list_is_refused(channel):
    from tensorflow_serving.apis import model_management_pb2

    err = rpc_error(
        model_service_pb2_grpc.ModelServiceStub(channel).HandleReloadConfigRequest,
        model_management_pb2.ReloadConfigRequest(),
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "model_config_list" in err.details()


# -- TensorFlow SavedModels (TF Serving's own test models) ---------------------------------

needs_tf_plugin = pytest.mark.skipif(
    not tf_plugin_installed(), reason="the servekit_tensorflow plugin is not installed"
)
HALF_PLUS_TWO = "saved_model_half_plus_two_2_versions"


@needs_tf_plugin
@pytest.mark.parametrize(("spec", "version"), [({}, 124), ({"version": 123}, 123), ({"version_label": "stable"}, 123)])
def test_tf_predict(predictions, spec, version):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = HALF_PLUS_TWO
    for key, value in spec.items():
        if key == "version":
            request.model_spec.version.value = value
        else:
            setattr(request.model_spec, key, value)
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([1.0, 2.0, 5.0], np.float32)))
    response = predictions.Predict(request, timeout=60)
    assert response.model_spec.version.value == version
    assert response.model_spec.signature_name == "serving_default"
    np.testing.assert_allclose(outputs(response)["y"], [2.5, 3.0, 4.5])


@needs_tf_plugin
def test_tf_predict_half_plus_three(predictions):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "saved_model_half_plus_three"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([1.0, 2.0, 5.0], np.float32)))
    np.testing.assert_allclose(outputs(predictions.Predict(request, timeout=60))["y"], [3.5, 4.0, 5.5])


@needs_tf_plugin
def test_tf_metadata_matches_tf_serving(predictions):
    response = predictions.GetModelMetadata(metadata_request(HALF_PLUS_TWO, 123), timeout=60)
    expected = json.loads((TF_DATA / "saved_model_half_plus_two_2_versions_metadata.json").read_text())
    for signature in expected["metadata"]["signature_def"]["signature_def"].values():
        if not signature.get("defaults"):
            signature.pop("defaults", None)
    assert as_json(response) == expected


@needs_tf_plugin
def test_tf_classify_and_regress(predictions):
    def with_x(target, key="x"):
        for value in (1.0, 2.0):
            target.example_list.examples.append(example(**{key: [value]}))

    classify = classification_pb2.ClassificationRequest()
    classify.model_spec.name = HALF_PLUS_TWO
    classify.model_spec.signature_name = "classify_x_to_y"
    with_x(classify.input)
    scores = [c.classes[0].score for c in predictions.Classify(classify, timeout=60).result.classifications]
    assert scores == pytest.approx([2.5, 3.0])

    regress = regression_pb2.RegressionRequest()
    regress.model_spec.name = HALF_PLUS_TWO
    regress.model_spec.signature_name = "regress_x_to_y"
    with_x(regress.input)
    values = [r.value for r in predictions.Regress(regress, timeout=60).result.regressions]
    assert values == pytest.approx([2.5, 3.0])


@needs_tf_plugin
def test_tf_model_status(models):
    response = models.GetModelStatus(status_request(HALF_PLUS_TWO), timeout=30)
    assert [(s.version, s.state) for s in response.model_version_status] == [
        (124, get_model_status_pb2.ModelVersionStatus.AVAILABLE),
        (123, get_model_status_pb2.ModelVersionStatus.AVAILABLE),
    ]
