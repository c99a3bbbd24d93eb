"""Triton's classification and shared-memory extensions through tritonclient, against two workers.

The calls are those of Triton's example clients (``image_client`` and
``grpc_image_client`` for classification; ``simple_{http,grpc}_shm_client``,
``simple_{http,grpc}_shm_string_client`` and ``reuse_infer_objects_client``
for shared memory), over ``tests/data/triton``'s model folders.  The server
runs two workers: a region registered through one connection is used through
fresh connections, which the kernel spreads over both.
"""

from __future__ import annotations

import shutil
import uuid
import warnings

import numpy as np
import pytest
from repo_paths import DATA

pytestmark = pytest.mark.slow

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # it imports pkg_resources
    shm = pytest.importorskip("tritonclient.utils.shared_memory")
from servekit.testing import ServerProcess
from tritonclient import utils
from tritonclient.utils import InferenceServerException

MODELS = DATA / "triton"
INPUT0 = np.arange(16, dtype=np.int32).reshape(1, 16)
INPUT1 = np.ones((1, 16), dtype=np.int32)
FRESH_CONNECTIONS = 8  # with two workers, both answer some of these


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("triton-ext")
    for name in ("simple", "simple_string", "classifier"):
        shutil.copytree(MODELS / name, base / name)
    with ServerProcess(base, grpc_port="auto", workers=2, threads=4) as running:
        yield running


CLIENTS = {
    "http": lambda s: httpclient.InferenceServerClient(f"127.0.0.1:{s.http_port}"),
    "grpc": lambda s: grpcclient.InferenceServerClient(f"127.0.0.1:{s.grpc_port}"),
}
MODULES = {"http": httpclient, "grpc": grpcclient}


def output_of(result, name: str, wire: str) -> tuple[str, list[int]]:
    out = result.get_output(name)
    if wire == "http":
        return out["datatype"], out["shape"]
    return out.datatype, list(out.shape)


# -- classification (image_client, grpc_image_client) -------------------------------------------


@pytest.mark.parametrize("wire", ["http", "grpc"])
def test_image_client_classification(server, wire):
    client, module = CLIENTS[wire](server), MODULES[wire]
    # image_client reads the batch size from the configuration and requests class_count classes
    config = client.get_model_config("classifier")
    max_batch_size = config["max_batch_size"] if wire == "http" else config.config.max_batch_size
    assert max_batch_size == 8
    batch = np.array([[1, 2, 3, 4], [4, 3, 2, 1], [0, 0, 1, 0]], np.float32)
    inputs = [module.InferInput("INPUT", list(batch.shape), "FP32")]
    inputs[0].set_data_from_numpy(batch)
    outputs = [module.InferRequestedOutput("PROBS", class_count=3)]
    result = client.infer("classifier", inputs, outputs=outputs)
    classes = result.as_numpy("PROBS")
    assert classes.shape == (3, 3) and len(classes) == len(batch)
    parsed = [[c.decode().split(":") for c in row] for row in classes]
    # image_client prints "{score} ({index}) = {label}"
    assert parsed[0][0] == ["0.500000", "4", "total"]
    assert parsed[0][1] == ["0.200000", "3", "yellow"] and parsed[1][1] == ["0.200000", "0", "red"]
    assert parsed[1][0] == ["0.500000", "4", "total"]
    # blue equals the total: the lower index comes first
    assert parsed[2][:2] == [["0.500000", "2", "blue"], ["0.500000", "4", "total"]]


@pytest.mark.parametrize("wire", ["http", "grpc"])
def test_classification_beside_plain_outputs(server, wire):
    client, module = CLIENTS[wire](server), MODULES[wire]
    inputs = [module.InferInput("INPUT", [1, 4], "FP32")]
    inputs[0].set_data_from_numpy(np.array([[1, 1, 1, 5]], np.float32))
    outputs = [module.InferRequestedOutput("COUNTS", class_count=2), module.InferRequestedOutput("PROBS")]
    result = client.infer("classifier", inputs, outputs=outputs)
    assert result.as_numpy("COUNTS").tolist() == [[b"50:4", b"31:3"]]  # no label file for COUNTS
    assert result.as_numpy("PROBS").dtype == np.float32


# -- system shared memory ------------------------------------------------------------------------


def unique(key: str) -> str:
    return f"/{key}_{uuid.uuid4().hex[:8]}"


@pytest.fixture
def regions():
    made = []

    def create(name: str, size: int):
        key = unique(name)
        handle = shm.create_shared_memory_region(name, key, size)
        made.append(handle)
        return key, handle

    yield create
    for handle in made:
        shm.destroy_shared_memory_region(handle)


@pytest.mark.parametrize("wire", ["http", "grpc"])
def test_simple_shm_client(server, regions, wire):
    client, module = CLIENTS[wire](server), MODULES[wire]
    # every shared-memory example starts by clearing both kinds of registration
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory()
    size = INPUT0.size * INPUT0.itemsize
    out_key, out_handle = regions("output_data", size * 2)
    in_key, in_handle = regions("input_data", size * 2)
    shm.set_shared_memory_region(in_handle, [INPUT0])
    shm.set_shared_memory_region(in_handle, [INPUT1], offset=size)
    client.register_system_shared_memory("output_data", out_key, size * 2)
    client.register_system_shared_memory("input_data", in_key, size * 2)
    try:
        for _ in range(FRESH_CONNECTIONS):  # a fresh client each time: both workers see the regions
            fresh = CLIENTS[wire](server)
            inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
            inputs[0].set_shared_memory("input_data", size)
            inputs[1].set_shared_memory("input_data", size, offset=size)
            outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
            outputs[0].set_shared_memory("output_data", size)
            outputs[1].set_shared_memory("output_data", size, offset=size)
            result = fresh.infer("simple", inputs, outputs=outputs)
            datatype, shape = output_of(result, "OUTPUT0", wire)
            dtype = utils.triton_to_np_dtype(datatype)
            assert shm.get_contents_as_numpy(out_handle, dtype, shape).tolist() == (INPUT0 + INPUT1).tolist()
            got = shm.get_contents_as_numpy(out_handle, dtype, shape, offset=size)
            assert got.tolist() == (INPUT0 - INPUT1).tolist()
            shm.set_shared_memory_region(out_handle, [np.zeros((2, 16), np.int32)])
        status = client.get_system_shared_memory_status()
        if wire == "http":
            assert sorted(s["name"] for s in status) == ["input_data", "output_data"]
            assert {s["key"] for s in status} == {in_key, out_key}
        else:
            assert sorted(status.regions) == ["input_data", "output_data"]
            assert status.regions["input_data"].byte_size == size * 2
    finally:
        client.unregister_system_shared_memory()
    for _ in range(FRESH_CONNECTIONS // 2):
        status = CLIENTS[wire](server).get_system_shared_memory_status()
        assert (status == []) if wire == "http" else (len(status.regions) == 0)
        with pytest.raises(InferenceServerException, match="Unable to find shared memory region: 'input_data'"):
            fresh = CLIENTS[wire](server)
            inputs = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            for tensor in inputs:
                tensor.set_shared_memory("input_data", size)
            fresh.infer("simple", inputs)


@pytest.mark.parametrize("wire", ["http", "grpc"])
def test_simple_shm_string_client(server, regions, wire):
    client, module = CLIENTS[wire](server), MODULES[wire]
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory()
    in0 = np.array([str(x).encode() for x in range(16)], dtype=object).reshape(1, 16)
    in1 = np.array([b"1"] * 16, dtype=object).reshape(1, 16)
    serialized = [utils.serialize_byte_tensor(in0), utils.serialize_byte_tensor(in1)]
    sizes = [utils.serialized_byte_size(s) for s in serialized]
    out_size = 2 * max(sizes)  # sums and differences are at most one digit longer each
    in_key, in_handle = regions("input_data", sum(sizes))
    out_key, out_handle = regions("output_data", out_size * 2)
    shm.set_shared_memory_region(in_handle, serialized[:1])
    shm.set_shared_memory_region(in_handle, serialized[1:], offset=sizes[0])
    client.register_system_shared_memory("input_data", in_key, sum(sizes))
    client.register_system_shared_memory("output_data", out_key, out_size * 2)
    try:
        inputs = [module.InferInput("INPUT0", [1, 16], "BYTES"), module.InferInput("INPUT1", [1, 16], "BYTES")]
        inputs[0].set_shared_memory("input_data", sizes[0])
        inputs[1].set_shared_memory("input_data", sizes[1], offset=sizes[0])
        outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
        outputs[0].set_shared_memory("output_data", out_size)
        outputs[1].set_shared_memory("output_data", out_size, offset=out_size)
        result = CLIENTS[wire](server).infer("simple_string", inputs, outputs=outputs)
        _, shape = output_of(result, "OUTPUT0", wire)
        sums = shm.get_contents_as_numpy(out_handle, np.object_, shape)
        differences = shm.get_contents_as_numpy(out_handle, np.object_, shape, offset=out_size)
        assert [int(v) for v in sums[0]] == [x + 1 for x in range(16)]
        assert [int(v) for v in differences[0]] == [x - 1 for x in range(16)]
        # an output region too small is a client error that says how much it needs
        outputs[0].set_shared_memory("output_data", 8)
        with pytest.raises(InferenceServerException, match="should be at least"):
            client.infer("simple_string", inputs, outputs=outputs)
    finally:
        client.unregister_system_shared_memory()


@pytest.mark.parametrize("wire", ["http", "grpc"])
def test_reuse_infer_objects_client(server, regions, wire):
    """The same InferInput/InferRequestedOutput objects, in and out of shared memory."""
    client, module = CLIENTS[wire](server), MODULES[wire]
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory()
    size = INPUT0.size * INPUT0.itemsize
    in_key, in_handle = regions("input_data", size * 2)
    out_key, out_handle = regions("output_data", size * 2)
    shm.set_shared_memory_region(in_handle, [INPUT0, INPUT1])
    client.register_system_shared_memory("input_data", in_key, size * 2)
    client.register_system_shared_memory("output_data", out_key, size * 2)
    try:
        inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
        outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
        inputs[0].set_shared_memory("input_data", size)
        inputs[1].set_shared_memory("input_data", size, offset=size)
        outputs[0].set_shared_memory("output_data", size)
        outputs[1].set_shared_memory("output_data", size, offset=size)
        client.infer("simple", inputs, outputs=outputs)
        assert shm.get_contents_as_numpy(out_handle, np.int32, [1, 16]).tolist() == (INPUT0 + INPUT1).tolist()
        # the same objects again, now carrying their data in the request and answer
        inputs[0].set_data_from_numpy(INPUT1)
        inputs[1].set_data_from_numpy(INPUT0)
        outputs[0].unset_shared_memory()
        result = client.infer("simple", inputs, outputs=outputs)
        assert result.as_numpy("OUTPUT0").tolist() == (INPUT0 + INPUT1).tolist()
        assert (
            shm.get_contents_as_numpy(out_handle, np.int32, [1, 16], offset=size).tolist() == (INPUT1 - INPUT0).tolist()
        )
    finally:
        client.unregister_system_shared_memory()


@pytest.mark.parametrize("wire", ["http", "grpc"])
def test_shared_memory_registration_errors(server, regions, wire):
    client = CLIENTS[wire](server)
    key, _ = regions("errors", 64)
    with pytest.raises(InferenceServerException, match="Unable to open shared memory region"):
        client.register_system_shared_memory("missing", "/servekit_no_such_region", 64)
    with pytest.raises(InferenceServerException, match="past the end"):
        client.register_system_shared_memory("big", key, 128)
    client.register_system_shared_memory("errors", key, 64)
    try:
        with pytest.raises(InferenceServerException, match="already in manager"):
            client.register_system_shared_memory("errors", key, 64)
        client.unregister_system_shared_memory("not_registered")  # no error, as in Triton
    finally:
        client.unregister_system_shared_memory("errors")
    # CUDA shared memory: nothing registered, nothing to register without CUDA
    client.unregister_cuda_shared_memory()
    status = client.get_cuda_shared_memory_status()
    assert (status == []) if wire == "http" else (len(status.regions) == 0)
    with pytest.raises(InferenceServerException, match="CUDA shared memory is not supported"):
        client.register_cuda_shared_memory("gpu", "aGFuZGxl", 0, 64)  # base64
