"""Triton's sequence batching: a state per sequence, through the data plane and through tritonclient.

The end-to-end tests make the calls of Triton's sequence examples
(``simple_{http,grpc}_sequence_sync_infer_client`` with integer and string ids,
``simple_grpc_sequence_stream_infer_client``) against two workers: the model
runs in one model host, so each sequence's requests find their state whichever
worker they reach.
"""

from __future__ import annotations

import queue
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from repo_paths import DATA
from servekit.dataplane.sequences import Sequences, sequence_parameters
from servekit.errors import BadRequest

TRITON = DATA / "triton"
VALUES = [11, 7, 5, 3, 2, 0, 1]


def test_sequence_parameters_are_checked():
    assert sequence_parameters({}) is None
    assert sequence_parameters({"sequence_id": 0}) is None
    assert sequence_parameters({"sequence_id": "a", "sequence_start": True}) == ("a", True, False)
    for bad in ({"sequence_id": 1.5}, {"sequence_id": True}, {"sequence_id": 1, "sequence_end": "yes"}):
        with pytest.raises(BadRequest):
            sequence_parameters(bad)
    with pytest.raises(BadRequest, match="need a 'sequence_id'"):
        sequence_parameters({"sequence_start": True})


def test_sequences_keep_state_until_end_or_idle():
    live = Sequences("m", max_idle_ms=50)
    first = live.open({"sequence_id": 7, "sequence_start": True})
    assert first is not None and first.start
    first.state["n"] = 1
    live.close(first)
    again = live.open({"sequence_id": 7})
    assert again is first and again.state == {"n": 1} and not again.start
    again.end = True
    live.close(again)
    assert len(live) == 0
    with pytest.raises(BadRequest, match="must specify the START flag"):
        live.open({"sequence_id": 7})
    idle = live.open({"sequence_id": 8, "sequence_start": True})
    assert idle is not None
    live.close(idle)
    time.sleep(0.1)
    with pytest.raises(BadRequest, match="idle longer than 50 ms"):
        live.open({"sequence_id": 8})


@pytest.fixture
def sequence_repo(tmp_path) -> Path:
    shutil.copytree(TRITON / "simple_sequence", tmp_path / "simple_sequence")
    # in this process: the unit tests need no model host
    (tmp_path / "simple_sequence" / "servekit.yaml").write_text("sequence: {max_idle_ms: 5000}\nplacement: worker\n")
    return tmp_path


def step(client, seq_id, value, **flags):
    doc = {
        "inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [value]}],
        "parameters": {"sequence_id": seq_id, **flags},
    }
    response = client.post("/v2/models/simple_sequence/infer", json=doc)
    return response.status_code, response.get_json()


def test_two_sequences_interleaved_in_process(servekit_app, sequence_repo):
    client = servekit_app(sequence_repo)
    for i, value in enumerate(VALUES):
        for seq_id, sign in ((1000, 1), ("1001", -1)):
            flags = {"sequence_start": i == 0, "sequence_end": i == len(VALUES) - 1}
            status, doc = step(client, seq_id, sign * value, **flags)
            assert status == 200, doc
            outputs = {o["name"]: o["data"] for o in doc["outputs"]}
            assert outputs["OUTPUT"] == [sign * value + (1 if i == 0 else 0)]
            assert outputs["COUNT"] == [i + 1]  # the sequence's own state, request after request
    status, doc = step(client, 1000, 1)  # ended: a new request needs the START flag
    assert status == 400 and "START flag" in doc["error"]
    status, doc = step(client, 1000, 1, sequence_end="no")
    assert status == 400 and "'sequence_end' must be true or false" in doc["error"]


def test_sequence_config_is_checked(servekit_app, sequence_repo):
    from servekit.control import triton_load_config
    from servekit.folders.servekit_yaml import ConfigError, parse_model_config

    assert parse_model_config({"sequence": True}).sequence is not None
    assert parse_model_config({}).sequence is None
    with pytest.raises(ConfigError, match="max_idle_ms"):
        parse_model_config({"sequence": {"max_idle_ms": 0}})
    mapped = triton_load_config.settings_for("m", {"sequence_batching": {"max_sequence_idle_microseconds": 2500000}})
    assert mapped == {"sequence": {"max_idle_ms": 2500.0}}


# -- end to end: tritonclient against two workers -------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    pytest.importorskip("tritonclient.grpc")
    from servekit.testing import ServerProcess

    base = tmp_path_factory.mktemp("sequence")
    shutil.copytree(TRITON / "simple_sequence", base / "simple_sequence")
    with ServerProcess(base, grpc_port="auto", workers=2, threads=4) as running:
        yield running


def sync_sequences(make_client, module, ids) -> tuple[list[int], list[int], set[int]]:
    """Two sequences, interleaved, each request through a fresh client (so through either worker)."""
    results: dict = {seq_id: [] for seq_id in ids}
    counts: dict = {seq_id: [] for seq_id in ids}
    pids = set()
    for i, value in enumerate(VALUES):
        for seq_id, sign in zip(ids, (1, -1)):
            inputs = [module.InferInput("INPUT", [1, 1], "INT32")]
            inputs[0].set_data_from_numpy(np.array([[sign * value]], dtype=np.int32))
            result = make_client().infer(
                "simple_sequence",
                inputs,
                sequence_id=seq_id,
                sequence_start=i == 0,
                sequence_end=i == len(VALUES) - 1,
            )
            results[seq_id].append(int(result.as_numpy("OUTPUT")[0][0]))
            counts[seq_id].append(int(result.as_numpy("COUNT")[0]))
            pids.add(int(result.as_numpy("PID")[0]))
    assert all(seen == list(range(1, len(VALUES) + 1)) for seen in counts.values())  # one state per sequence
    return results[ids[0]], results[ids[1]], pids


#: What Triton's sequence example clients expect of `simple_sequence`: each input, plus one at the start.
EXPECTED = [v + (1 if i == 0 else 0) for i, v in enumerate(VALUES)]
NEGATED = [-v + (1 if i == 0 else 0) for i, v in enumerate(VALUES)]


@pytest.mark.slow
@pytest.mark.parametrize("wire", ["http", "grpc"])
@pytest.mark.parametrize("ids", [(1000, 1001), ("1000", "1001")], ids=["int-ids", "string-ids"])
def test_simple_sequence_sync_infer_client(server, wire, ids):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    if wire == "http":
        module, address = httpclient, f"127.0.0.1:{server.http_port}"
    else:
        module, address = grpcclient, f"127.0.0.1:{server.grpc_port}"
    first, second, pids = sync_sequences(lambda: module.InferenceServerClient(address), module, ids)
    assert first == EXPECTED and second == NEGATED
    assert len(pids) == 1  # one model host holds every sequence, whichever worker took the request


@pytest.mark.slow
def test_simple_grpc_sequence_stream_infer_client(server):
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for i, value in enumerate(VALUES):
            for seq_id, sign in ((1000, 1), (1001, -1)):
                inputs = [grpcclient.InferInput("INPUT", [1, 1], "INT32")]
                inputs[0].set_data_from_numpy(np.array([[sign * value]], dtype=np.int32))
                client.async_stream_infer(
                    "simple_sequence",
                    inputs,
                    request_id=f"{seq_id}_{i}",
                    sequence_id=seq_id,
                    sequence_start=i == 0,
                    sequence_end=i == len(VALUES) - 1,
                )
        got: dict[int, list[int]] = {1000: [], 1001: []}
        counts: dict[int, list[int]] = {1000: [], 1001: []}
        for _ in range(2 * len(VALUES)):
            result, error = answers.get(timeout=30)
            assert error is None, error
            seq_id = int(result.get_response().id.split("_")[0])
            got[seq_id].append(int(result.as_numpy("OUTPUT")[0][0]))
            counts[seq_id].append(int(result.as_numpy("COUNT")[0]))
    finally:
        client.stop_stream()
    assert got[1000] == EXPECTED and got[1001] == NEGATED
    assert counts[1000] == counts[1001] == list(range(1, len(VALUES) + 1))


@pytest.mark.slow
def test_sequence_without_start_is_refused_over_grpc(server):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    inputs = [grpcclient.InferInput("INPUT", [1, 1], "INT32")]
    inputs[0].set_data_from_numpy(np.array([[1]], dtype=np.int32))
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        client.infer("simple_sequence", inputs, sequence_id=424242)
