"""The calls Triton's image examples make, through tritonclient and the raw gRPC stub, against servekit.

``image_client.py`` (HTTP, and ``-i grpc`` with ``-a`` and ``--streaming``),
``grpc_image_client.py`` (the generated stub: raw input contents, ``ModelInfer``
futures and ``ModelStreamInfer``) and ``ensemble_image_client.py`` (encoded
images into ``preprocess_inception_ensemble``).  Each test reads the model's
metadata and configuration and checks them as the program's ``parse_model``
does, preprocesses images as it does, and checks the classes it would print.
The models are ``tests/data/triton``'s stand-ins, which score colours, so each
image's top class is known.  The server runs two workers.
"""

from __future__ import annotations

import io
import queue
import shutil
from functools import partial

import numpy as np
import pytest
from repo_paths import DATA

pytestmark = pytest.mark.slow

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
Image = pytest.importorskip("PIL.Image")
from servekit.testing import ServerProcess
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException, deserialize_bytes_tensor, triton_to_np_dtype

MODELS = DATA / "triton"
FOLDERS = ("inception_graphdef", "densenet_onnx", "image_preprocess_model", "preprocess_inception_ensemble")
#: Test images and the class the stand-ins rank first for each.
COLOURS = {"red": (220, 30, 30), "blue": (20, 40, 200), "gray": (128, 128, 128), "green": (10, 190, 20)}
LABELS = ["red", "green", "blue", "gray"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("triton-images")
    for name in FOLDERS:
        shutil.copytree(MODELS / name, base / name)  # the folders' links become files
    with ServerProcess(base, grpc_port="auto", workers=2, threads=4) as running:
        yield running


def image(colour: str, size=(48, 40)) -> Image.Image:
    return Image.new("RGB", size, COLOURS[colour])


def encoded(colour: str, fmt: str = "PNG") -> bytes:
    out = io.BytesIO()
    image(colour).save(out, format=fmt)
    return out.getvalue()


def parse_model(metadata, config) -> tuple[int, str, str, int, int, int, int, str]:
    """The checks of the programs' ``parse_model``, on attribute-style metadata and configuration."""
    assert len(metadata.inputs) == 1 and len(metadata.outputs) == 1 and len(config.input) == 1
    input_meta, input_config, output_meta = metadata.inputs[0], config.input[0], metadata.outputs[0]
    assert output_meta.datatype == "FP32"
    batched = config.max_batch_size > 0
    assert sum(1 for d in list(output_meta.shape)[1 if batched else 0 :] if d > 1) <= 1  # a vector
    assert len(input_meta.shape) == 3 + (1 if batched else 0)
    fmt = input_config.format
    if isinstance(fmt, str):  # HTTP's JSON names the enum
        fmt = mc.ModelInput.Format.Value(fmt)
    assert fmt in (mc.ModelInput.FORMAT_NCHW, mc.ModelInput.FORMAT_NHWC)
    dims = list(input_meta.shape)[1 if batched else 0 :]
    h, w, c = dims if fmt == mc.ModelInput.FORMAT_NHWC else (dims[1], dims[2], dims[0])
    return config.max_batch_size, input_meta.name, output_meta.name, c, h, w, fmt, input_meta.datatype


class Attrs(dict):
    """A JSON document read by attribute, as the HTTP program's AttrDict reads it."""

    def __getattr__(self, key):
        value = self[key]
        if isinstance(value, dict):
            return Attrs(value)
        if isinstance(value, list):
            return [Attrs(v) if isinstance(v, dict) else v for v in value]
        return value


def preprocess(img, fmt, dtype, c, h, w, scaling):
    """The programs' ``preprocess``: resize, type, scale, and CHW when the model wants it."""
    resized = np.array(img.convert("RGB" if c == 3 else "L").resize((w, h), Image.BILINEAR))
    if resized.ndim == 2:
        resized = resized[:, :, np.newaxis]
    typed = resized.astype(triton_to_np_dtype(dtype))
    scaled = typed / 127.5 - 1 if scaling == "INCEPTION" else typed
    return np.transpose(scaled, (2, 0, 1)) if fmt == mc.ModelInput.FORMAT_NCHW else scaled


def classes(rows) -> list[list[tuple[float, int, str]]]:
    """``value:index:label`` strings, per row, as the programs split and print them."""
    out = []
    for row in rows:
        parsed = []
        for item in row:
            text = item.decode() if isinstance(item, bytes) else "".join(chr(x) for x in item)
            value, index, label = text.split(":")
            parsed.append((float(value), int(index), label))
        out.append(parsed)
    return out


def http_model(server, name):
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}", concurrency=4)
    metadata, config = client.get_model_metadata(name), client.get_model_config(name)
    return client, parse_model(Attrs(metadata), Attrs(config))


def grpc_model(server, name):
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    metadata, config = client.get_model_metadata(name), client.get_model_config(name).config
    return client, parse_model(metadata, config)


# -- image_client.py over HTTP -----------------------------------------------------------------------


def test_image_client_http_batched_nhwc(server):
    client, (batch, input_name, output_name, c, h, w, fmt, dtype) = http_model(server, "inception_graphdef")
    assert (batch, input_name, output_name, c, h, w, fmt) == (
        128,
        "input",
        "InceptionV3/Predictions/Softmax",
        3,
        299,
        299,
        mc.ModelInput.FORMAT_NHWC,
    )
    names = ["red", "blue", "gray"]
    data = np.stack([preprocess(image(n), fmt, dtype, c, h, w, "INCEPTION") for n in names])
    inputs = [httpclient.InferInput(input_name, data.shape, dtype)]
    inputs[0].set_data_from_numpy(data)
    outputs = [httpclient.InferRequestedOutput(output_name, class_count=3)]
    result = client.infer("inception_graphdef", inputs, request_id="1", outputs=outputs)
    assert result.get_response()["id"] == "1"
    ranked = result.as_numpy(output_name)
    assert ranked.shape == (3, 3)  # a row per image: the configuration has a batch dimension
    got = classes(ranked)
    assert [row[0][2] for row in got] == names
    assert got[0] == [(1.0, 0, "red"), (0.0, 1, "green"), (0.0, 2, "blue")]
    assert got[2][0] == (1.0, 3, "gray")


def test_image_client_http_async_unbatched_nchw(server):
    client, (batch, input_name, output_name, c, h, w, fmt, dtype) = http_model(server, "densenet_onnx")
    assert (batch, c, h, w, fmt) == (0, 3, 224, 224, mc.ModelInput.FORMAT_NCHW)
    pending = []
    for n, colour in enumerate(COLOURS, start=1):
        data = preprocess(image(colour), fmt, dtype, c, h, w, "NONE")
        inputs = [httpclient.InferInput(input_name, data.shape, dtype)]
        inputs[0].set_data_from_numpy(data)
        outputs = [httpclient.InferRequestedOutput(output_name, class_count=2)]
        pending.append(client.async_infer("densenet_onnx", inputs, request_id=str(n), outputs=outputs))
    for n, (colour, request) in enumerate(zip(COLOURS, pending), start=1):
        result = request.get_result()
        assert result.get_response()["id"] == str(n)
        ranked = result.as_numpy(output_name)
        assert ranked.shape == (2,)  # no batch dimension: the output is ranked as a whole
        assert classes([ranked])[0][0][2] == colour


def test_image_client_refuses_nothing_it_should_not(server):
    """Batch size 2 on a model without batching is refused by the program itself; the server checks shapes."""
    client, (_, input_name, output_name, *_rest) = http_model(server, "densenet_onnx")
    inputs = [httpclient.InferInput(input_name, [2, 3, 224, 224], "FP32")]
    inputs[0].set_data_from_numpy(np.zeros((2, 3, 224, 224), np.float32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("densenet_onnx", inputs)
    assert info.value.status() == "400" and "data_0" in info.value.message()


# -- image_client.py -i grpc (-a, --streaming) ---------------------------------------------------------


def test_image_client_grpc_async_and_streaming(server):
    client, (batch, input_name, output_name, c, h, w, fmt, dtype) = grpc_model(server, "inception_graphdef")
    assert (batch, fmt, dtype) == (128, mc.ModelInput.FORMAT_NHWC, "FP32")
    done: queue.Queue = queue.Queue()

    def callback(user_data, result, error):
        user_data.put((result, error))

    def request(names):
        data = np.stack([preprocess(image(n), fmt, dtype, c, h, w, "INCEPTION") for n in names])
        inputs = [grpcclient.InferInput(input_name, data.shape, dtype)]
        inputs[0].set_data_from_numpy(data)
        return inputs, [grpcclient.InferRequestedOutput(output_name, class_count=2)]

    batches = {"1": ["red", "blue"], "2": ["gray", "green"]}
    for request_id, names in batches.items():
        inputs, outputs = request(names)
        client.async_infer(
            "inception_graphdef", inputs, partial(callback, done), request_id=request_id, outputs=outputs
        )
    client.start_stream(partial(callback, done))
    try:
        for request_id, names in batches.items():
            inputs, outputs = request(names)
            client.async_stream_infer("inception_graphdef", inputs, request_id=f"s{request_id}", outputs=outputs)
        answers = [done.get(timeout=30) for _ in range(4)]
    finally:
        client.stop_stream()
    seen = {}
    for result, error in answers:
        assert error is None, error
        seen[result.get_response().id] = [row[0][2] for row in classes(result.as_numpy(output_name))]
    assert seen == {"1": ["red", "blue"], "2": ["gray", "green"], "s1": ["red", "blue"], "s2": ["gray", "green"]}


def test_config_document_is_the_same_on_both_wires(server):
    json_format = pytest.importorskip("google.protobuf.json_format")
    http = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    grpc_client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    for name in FOLDERS:
        over_http = http.get_model_config(name)
        over_grpc = grpc_client.get_model_config(name).config
        # protobuf's JSON writes int64 as strings; compare through the message
        assert json_format.ParseDict(over_http, mc.ModelConfig()) == over_grpc, name
    ensemble = grpc_client.get_model_config("preprocess_inception_ensemble").config
    assert ensemble.platform == "ensemble" and ensemble.max_batch_size == 128
    steps = ensemble.ensemble_scheduling.step
    assert [s.model_name for s in steps] == ["image_preprocess_model", "inception_graphdef"]
    assert dict(steps[1].input_map) == {"input": "preprocessed_image"}
    assert ensemble.output[0].label_filename == ""  # as Triton's: the classes come from its step
    inception = grpc_client.get_model_config("inception_graphdef").config
    assert inception.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU


# -- grpc_image_client.py: the generated stub ----------------------------------------------------------


def test_grpc_image_client_raw_contents_futures_and_stream(server):
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        metadata = stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="inception_graphdef", version=""))
        config = stub.ModelConfig(service_pb2.ModelConfigRequest(name="inception_graphdef", version="")).config
        batch, input_name, output_name, c, h, w, fmt, dtype = parse_model(metadata, config)
        names = ["red", "blue", "gray", "green"]
        images = [preprocess(image(n), fmt, dtype, c, h, w, "INCEPTION") for n in names]

        def requests():
            for start in (0, 2):
                request = service_pb2.ModelInferRequest(model_name="inception_graphdef", model_version="")
                output = service_pb2.ModelInferRequest().InferRequestedOutputTensor(name=output_name)
                output.parameters["classification"].int64_param = 3
                request.outputs.extend([output])
                tensor = service_pb2.ModelInferRequest().InferInputTensor(name=input_name, datatype=dtype)
                tensor.shape.extend([2, h, w, c])
                request.inputs.extend([tensor])
                request.raw_input_contents.extend([images[start].tobytes() + images[start + 1].tobytes()])
                yield request

        def tops(response):
            assert len(response.outputs) == 1 and len(response.raw_output_contents) == 1
            contents = np.reshape(deserialize_bytes_tensor(response.raw_output_contents[0]), response.outputs[0].shape)
            assert contents.shape == (2, 3)
            return [row[0][2] for row in classes(contents)]

        futures = [stub.ModelInfer.future(r) for r in requests()]
        assert [tops(f.result()) for f in futures] == [names[:2], names[2:]]
        streamed = list(stub.ModelStreamInfer(requests()))
        assert [r.error_message for r in streamed] == ["", ""]
        assert [tops(r.infer_response) for r in streamed] == [names[:2], names[2:]]


# -- ensemble_image_client.py ---------------------------------------------------------------------------


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_ensemble_image_client(server, module):
    if module is httpclient:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
        metadata = Attrs(client.get_model_metadata("preprocess_inception_ensemble"))
        config = Attrs(client.get_model_config("preprocess_inception_ensemble"))
    else:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        metadata = client.get_model_metadata("preprocess_inception_ensemble")
        config = client.get_model_config("preprocess_inception_ensemble").config
    assert len(metadata.inputs) == 1 and len(config.input) == 1
    input_name, output_names, batch_size = (
        metadata.inputs[0].name,
        [o.name for o in metadata.outputs],
        config.max_batch_size,
    )
    assert (input_name, output_names, batch_size) == ("INPUT", ["OUTPUT"], 128)
    files = [("red", "PNG"), ("blue", "JPEG"), ("gray", "BMP")]
    data = np.stack([np.array([encoded(colour, fmt)], dtype=bytes) for colour, fmt in files], axis=0)
    inputs = [module.InferInput(input_name, data.shape, "BYTES")]
    if module is httpclient:
        inputs[0].set_data_from_numpy(data, binary_data=True)
        outputs = [httpclient.InferRequestedOutput("OUTPUT", binary_data=True, class_count=2)]
    else:
        inputs[0].set_data_from_numpy(data)
        outputs = [grpcclient.InferRequestedOutput("OUTPUT", class_count=2)]
    result = client.infer("preprocess_inception_ensemble", inputs, outputs=outputs)
    ranked = result.as_numpy("OUTPUT")
    assert len(ranked) == len(files)
    got = classes(ranked)  # the program's postprocess: value (index) = label
    # labelled as Triton labels an ensemble's output: by inception_graphdef's label_filename
    assert [row[0][2] for row in got] == [colour for colour, _ in files]
    assert got[0][0] == (1.0, 0, "red")


def test_ensemble_refuses_bytes_that_are_not_an_image(server):
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    data = np.array([[b"not an image"]], dtype=bytes)
    inputs = [httpclient.InferInput("INPUT", data.shape, "BYTES")]
    inputs[0].set_data_from_numpy(data)
    with pytest.raises(InferenceServerException) as info:
        client.infer("preprocess_inception_ensemble", inputs)
    assert info.value.status() == "400"
    assert "INPUT row 0 is not an image" in info.value.message()
