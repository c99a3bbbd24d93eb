"""The calls Triton's example clients make, through tritonclient, against servekit.

Each test makes the calls of one program of Triton's client examples
(``simple_http_infer_client``, ``simple_grpc_infer_client``, the string, the
explicit-content, the health/metadata, the aio and the model-control ones)
against ``tests/data/triton``'s ``simple`` and ``simple_string`` model.py files,
and checks the answers the way the programs do.  The inference server runs two
workers, so the statistics checks also show that the workers' counts are summed.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from repo_paths import DATA

pytestmark = pytest.mark.slow

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
from servekit.testing import ServerProcess
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

MODELS = DATA / "triton"
INPUT0 = np.arange(16, dtype=np.int32).reshape(1, 16)
INPUT1 = np.full((1, 16), -1, dtype=np.int32)


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("triton")
    for name in ("simple", "simple_string"):
        shutil.copytree(MODELS / name, base / name)
    return base


@pytest.fixture(scope="module")
def server(repo):
    with ServerProcess(repo, grpc_port="auto", workers=2, threads=4) as running:
        yield running


@pytest.fixture(scope="module")
def control_server(repo):
    """One worker: a load or unload changes the one repository every request reaches."""
    with ServerProcess(repo, grpc_port="auto", workers=1, threads=4, model_control_mode="explicit") as running:
        yield running


def http_client(server) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")


def grpc_client(server) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")


def check_sum_and_difference(result, a=INPUT0, b=INPUT1) -> None:
    assert result.as_numpy("OUTPUT0").tolist() == (a + b).tolist()
    assert result.as_numpy("OUTPUT1").tolist() == (a - b).tolist()


def settled(fetch, done, attempts: int = 50):
    """``fetch()`` until ``done(result)`` (workers flush statistics every half second), at most ~5 s."""
    for _ in range(attempts):
        got = fetch()
        if done(got):
            return got
        time.sleep(0.1)
    return got


def stat_counts(stats: dict, version: str = "1") -> tuple[int, int]:
    (entry,) = [s for s in stats["model_stats"] if s["version"] == version]
    return int(entry.get("inference_count", 0)), int(entry["inference_stats"]["success"].get("count", 0))


# -- simple_http_infer_client ---------------------------------------------------------------------


def test_simple_http_infer_client(server):
    client = http_client(server)
    before = stat_counts(client.get_inference_statistics(model_name="simple"))
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(INPUT0, binary_data=False)
    inputs[1].set_data_from_numpy(INPUT1, binary_data=True)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=False),
    ]
    for _ in range(4):  # two workers: only summed statistics count all four
        result = client.infer("simple", inputs, outputs=outputs, query_params={"test_1": 1, "test_2": 2})
        check_sum_and_difference(result)
    stats = client.get_inference_statistics(model_name="simple")
    assert len(stats["model_stats"]) == 1
    # each worker flushes its tally into the shared counters within half a second
    after = settled(
        lambda: stat_counts(client.get_inference_statistics(model_name="simple")),
        lambda got: (got[0] - before[0], got[1] - before[1]) == (4, 4),
    )
    assert (after[0] - before[0], after[1] - before[1]) == (4, 4)
    check_sum_and_difference(client.infer("simple", inputs, outputs=None))
    with pytest.raises(InferenceServerException):
        client.infer("wrong_model_name", inputs, outputs=outputs)


def test_http_statistics_document(server):
    client = http_client(server)
    inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(INPUT0)
    inputs[1].set_data_from_numpy(INPUT1)
    client.infer("simple", inputs)
    entry = settled(
        lambda: client.get_inference_statistics("simple", "1")["model_stats"][0],
        lambda got: int(got["inference_stats"].get("success", {}).get("count", 0)) >= 1,
    )
    assert (entry["name"], entry["version"]) == ("simple", "1")
    phases = entry["inference_stats"]
    for phase in ("success", "compute_infer"):
        assert phase in phases and phases[phase]["count"] >= 1 and phases[phase]["ns"] > 0
    assert entry["execution_count"] >= 1 and entry["last_inference"] > 0
    assert [b["batch_size"] for b in entry["batch_stats"]] == [1]
    every = client.get_inference_statistics()
    assert {s["name"] for s in every["model_stats"]} == {"simple", "simple_string"}
    for bad, status in (("nope", 404), ("simple/versions/7", 404), ("simple/versions/x", 400)):
        with pytest.raises(InferenceServerException) as info:
            name, _, version = bad.partition("/versions/")
            client.get_inference_statistics(name, version)
        assert info.value.status() == str(status)


# -- simple_grpc_infer_client ---------------------------------------------------------------------


def test_simple_grpc_infer_client(server):
    client = grpc_client(server)
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(INPUT0)
    inputs[1].set_data_from_numpy(INPUT1)
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
    before = client.get_inference_statistics(model_name="simple")
    for _ in range(3):
        check_sum_and_difference(client.infer("simple", inputs, outputs=outputs))
    success = before.model_stats[0].inference_stats.success.count
    stats = settled(
        lambda: client.get_inference_statistics(model_name="simple"),
        lambda got: got.model_stats[0].inference_stats.success.count - success == 3,
    )
    assert len(stats.model_stats) == 1
    done = stats.model_stats[0].inference_stats.success.count - success
    assert done == 3
    assert stats.model_stats[0].inference_stats.compute_infer.ns > 0


# -- simple_{http,grpc}_string_infer_client ----------------------------------------------------------


def string_data() -> tuple[np.ndarray, np.ndarray]:
    a = np.array([str(x).encode() for x in range(16)], dtype=np.object_).reshape(1, 16)
    b = np.array([b"1"] * 16, dtype=np.object_).reshape(1, 16)
    return a, b


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_simple_string_infer_client(server, module):
    client = http_client(server) if module is httpclient else grpc_client(server)
    a, b = string_data()
    inputs = [module.InferInput("INPUT0", [1, 16], "BYTES"), module.InferInput("INPUT1", [1, 16], "BYTES")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
    result = client.infer("simple_string", inputs, outputs=outputs)
    sums = [int(v) for v in result.as_numpy("OUTPUT0").reshape(-1)]
    differences = [int(v) for v in result.as_numpy("OUTPUT1").reshape(-1)]
    assert sums == [x + 1 for x in range(16)] and differences == [x - 1 for x in range(16)]
    stats = client.get_inference_statistics(model_name="simple_string")
    count = len(stats["model_stats"]) if module is httpclient else len(stats.model_stats)
    assert count == 1


# -- grpc_explicit_{int,int8,byte}_content_client ------------------------------------------------------


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def explicit_request(model: str, datatype: str, field: str, a: list, b: list):
    request = service_pb2.ModelInferRequest(model_name=model, model_version="")
    for name, values in (("INPUT0", a), ("INPUT1", b)):
        tensor = service_pb2.ModelInferRequest().InferInputTensor(name=name, datatype=datatype, shape=[1, 16])
        getattr(tensor.contents, field)[:] = values
        request.inputs.extend([tensor])
    for name in ("OUTPUT0", "OUTPUT1"):
        request.outputs.extend([service_pb2.ModelInferRequest().InferRequestedOutputTensor(name=name)])
    return request


def test_grpc_explicit_int_content_client(stub):
    a, b = list(range(16)), [1] * 16
    request = explicit_request("simple", "INT32", "int_contents", a, b)
    response = stub.ModelInfer(request)
    # typed contents in, raw_output_contents out: the program reads them with np.frombuffer
    results = [
        np.resize(np.frombuffer(response.raw_output_contents[i], dtype=np.int32), list(out.shape))
        for i, out in enumerate(response.outputs)
    ]
    assert len(results) == 2
    assert results[0][0].tolist() == [x + 1 for x in a] and results[1][0].tolist() == [x - 1 for x in a]
    request.raw_input_contents.extend([np.array(a[0:8]).tobytes()])
    request.inputs[0].contents.int_contents[:] = a[8:]
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request)
    assert (
        "contents field must not be specified when using raw_input_contents for 'INPUT0' for model 'simple'"
    ) in info.value.details()


def test_grpc_explicit_byte_content_client(stub):
    a = [str(x).encode() for x in range(16)]
    b = [b"1"] * 16
    response = stub.ModelInfer(explicit_request("simple_string", "BYTES", "bytes_contents", a, b))
    # BYTES in raw form: each element a 4-byte little-endian length, then the bytes
    results = [grpcclient.InferResult(response).as_numpy(name) for name in ("OUTPUT0", "OUTPUT1")]
    assert [int(v) for v in results[0][0]] == [x + 1 for x in range(16)]
    assert [int(v) for v in results[1][0]] == [x - 1 for x in range(16)]
    raw = response.raw_output_contents[0]
    assert int.from_bytes(raw[:4], "little") == len(b"1")


def test_grpc_explicit_int8_content_client(stub):
    # INT8 travels in int_contents; the `simple` model widens nothing: it answers INT32 sums of INT8
    request = explicit_request("simple", "INT8", "int_contents", list(range(16)), [1] * 16)
    response = stub.ModelInfer(request)
    assert [o.datatype for o in response.outputs] == ["INT8", "INT8"]
    sums = np.frombuffer(response.raw_output_contents[0], dtype=np.int8)
    assert sums.tolist() == [x + 1 for x in range(16)]


def test_grpc_malformed_version_is_invalid_argument(stub):
    request = explicit_request("simple", "INT32", "int_contents", list(range(16)), [1] * 16)
    request.model_version = "latest"
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="simple", version="x1"))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    request.model_version = "9"  # well formed, but no such version: NOT_FOUND
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


# -- simple_{http,grpc}_health_metadata (and the model configuration) -----------------------------------


def test_simple_http_health_metadata(server):
    client = http_client(server)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("simple")
    meta = client.get_server_metadata()
    assert meta["name"] == "servekit"
    assert {"statistics", "model_configuration", "model_repository"} <= set(meta["extensions"])
    model = client.get_model_metadata("simple")
    assert model["name"] == "simple"
    assert [(t["name"], t["datatype"], t["shape"]) for t in model["inputs"]] == [
        ("INPUT0", "INT32", [1, 16]),
        ("INPUT1", "INT32", [1, 16]),
    ]
    config = client.get_model_config("simple")
    assert config["name"] == "simple" and config["max_batch_size"] == 0
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("INPUT0", "TYPE_INT32", [1, 16]),
        ("INPUT1", "TYPE_INT32", [1, 16]),
    ]
    assert [t["name"] for t in config["output"]] == ["OUTPUT0", "OUTPUT1"]
    with pytest.raises(InferenceServerException) as info:
        client.get_model_config("nope")
    assert info.value.status() == "404"


def test_simple_grpc_health_metadata(server):
    client = grpc_client(server)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("simple")
    meta = client.get_server_metadata()
    assert meta.name == "servekit" and "statistics" in meta.extensions
    model = client.get_model_metadata("simple")
    assert [(t.name, t.datatype, list(t.shape)) for t in model.outputs] == [
        ("OUTPUT0", "INT32", [1, 16]),
        ("OUTPUT1", "INT32", [1, 16]),
    ]
    config = client.get_model_config("simple").config
    assert (config.name, config.max_batch_size, config.backend) == ("simple", 0, "python")
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [
        ("INPUT0", grpcclient.model_config_pb2.TYPE_INT32, [1, 16]),
        ("INPUT1", grpcclient.model_config_pb2.TYPE_INT32, [1, 16]),
    ]
    assert config.version_policy.WhichOneof("policy_choice") == "latest"
    as_json = client.get_model_config("simple_string", "1", as_json=True)
    assert as_json["config"]["input"][0]["data_type"] == "TYPE_STRING"


# -- simple_{http,grpc}_aio_infer_client --------------------------------------------------------------


def test_simple_http_aio_infer_client(server):
    aio = pytest.importorskip("tritonclient.http.aio")

    async def run():
        client = aio.InferenceServerClient(f"127.0.0.1:{server.http_port}")
        try:
            inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            inputs[0].set_data_from_numpy(INPUT0, binary_data=False)
            inputs[1].set_data_from_numpy(INPUT1, binary_data=True)
            result = await client.infer("simple", inputs)
            stats = await client.get_inference_statistics(model_name="simple")
            return result, stats
        finally:
            await client.close()

    result, stats = asyncio.run(run())
    check_sum_and_difference(result)
    assert len(stats["model_stats"]) == 1


def test_simple_grpc_aio_infer_client(server):
    aio = pytest.importorskip("tritonclient.grpc.aio")

    async def run():
        client = aio.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        try:
            inputs = [grpcclient.InferInput(n, [1, 16], np_to_triton_dtype(np.int32)) for n in ("INPUT0", "INPUT1")]
            inputs[0].set_data_from_numpy(INPUT0)
            inputs[1].set_data_from_numpy(INPUT1)
            outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
            result = await client.infer("simple", inputs, outputs=outputs)
            stats = await client.get_inference_statistics(model_name="simple")
            return result, stats
        finally:
            await client.close()

    result, stats = asyncio.run(run())
    check_sum_and_difference(result)
    assert len(stats.model_stats) == 1


# -- simple_{http,grpc}_model_control -------------------------------------------------------------------


def test_grpc_model_control_needs_explicit_mode(server):
    client = grpc_client(server)
    assert {m.name for m in client.get_model_repository_index().models} == {"simple", "simple_string"}
    for call in (client.load_model, client.unload_model):
        with pytest.raises(InferenceServerException) as info:
            call("simple")
        assert info.value.status() == "StatusCode.PERMISSION_DENIED"
        assert "--model-control-mode explicit" in info.value.message()
    assert client.is_model_ready("simple")


def test_simple_grpc_model_control(control_server):
    client = grpc_client(control_server)
    index = client.get_model_repository_index()
    assert len(index.models) == 2
    assert {(m.name, m.version, m.state) for m in index.models} == {
        ("simple", "1", "READY"),
        ("simple_string", "1", "READY"),
    }
    client.load_model("simple")
    assert client.is_model_ready("simple")
    with pytest.raises(InferenceServerException) as info:  # the example's malformed override
        client.load_model("simple", config='"parameters": {"config": {{"max_batch_size": "16"}}}')
    assert "failed to load" in info.value.message()
    client.load_model("simple", config='{"max_batch_size":"16"}')  # the example's override
    assert client.get_model_config("simple").config.max_batch_size == 16
    client.unload_model("simple")
    assert not client.is_model_ready("simple")
    as_json = client.get_model_repository_index(as_json=True)
    assert {m["name"]: m["state"] for m in as_json["models"]}["simple"] == "UNAVAILABLE"
    assert [m.name for m in client.get_model_repository_index().models if m.state == "READY"] == ["simple_string"]
    # the example's file parameter whose name no file system takes: Triton's INTERNAL, the server lives on
    with pytest.raises(InferenceServerException) as info:
        client.load_model("simple", config="{}", files={"file:" + "A" * 256: b"a"})
    assert info.value.status() == "StatusCode.INTERNAL"
    assert "failed to poll from model repository" in info.value.message()
    assert not any(leak in info.value.message() for leak in ("Errno", "/tmp", "servekit-uploads", "OSError"))
    assert client.is_server_live()
    client.load_model("simple")
    assert client.is_model_ready("simple")
    with pytest.raises(InferenceServerException) as info:
        client.load_model("wrong_model_name")
    assert "failed to load" in info.value.message()
    assert client.is_server_live()


def test_simple_http_model_control(control_server):
    client = http_client(control_server)
    assert len(client.get_model_repository_index()) == 2
    client.load_model("simple", config='{"max_batch_size":"16"}')
    assert client.get_model_config("simple")["max_batch_size"] == 16
    client.load_model("simple")  # without a config: the folder's own again
    assert client.get_model_config("simple")["max_batch_size"] != 16
    client.unload_model("simple")
    assert not client.is_model_ready("simple")
    client.load_model("simple")
    assert client.is_model_ready("simple")
    with pytest.raises(InferenceServerException):
        client.load_model("wrong_model_name")


@pytest.mark.parametrize(
    "key, why",
    [
        ("file:" + "A" * 256, "a name of 256 bytes"),
        ("file:" + "/".join(["d" * 200] * 6), "a path of 1205 bytes"),
        ("file:1/../../escape", "relative path"),
        ("file:/etc/passwd", "relative path"),
        ("file:1//model.py", "relative path"),
        ("file:1/mo\x00del.py", "NUL"),
    ],
    ids=["long-name", "long-path", "dot-dot", "absolute", "empty-part", "nul"],
)
def test_http_load_refuses_file_names_no_file_system_takes(control_server, key, why):
    """Over HTTP the same refusal is a 400 (the client's parameter), with no server path in it."""
    import requests

    body = {"parameters": {"config": "{}", key: "YQ=="}}
    answer = requests.post(f"{control_server.url}/v2/repository/models/simple/load", json=body, timeout=30)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error.startswith("failed to load 'simple', failed to poll from model repository") and why in error
    assert "servekit-uploads" not in error and "Errno" not in error
    assert http_client(control_server).is_model_ready("simple")  # the model it serves is untouched
