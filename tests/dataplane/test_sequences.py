"""Triton's sequence batching: a state per sequence, through the data plane and through tritonclient.

The model is ``tests/data/triton/simple_sequence``: Triton's ``config.pbtxt``
(``sequence_batching`` with START and READY control inputs) and a model.py.
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
import uuid
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
    # in this process: the unit tests need no model host; the sequence settings are config.pbtxt's
    (tmp_path / "simple_sequence" / "servekit.yaml").write_text("placement: worker\n")
    return tmp_path


def step(client, seq_id, value, **flags):
    doc = {
        "inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [value]}],
        "parameters": {"sequence_id": seq_id, **flags},
    }
    if seq_id is None:
        del doc["parameters"]["sequence_id"]
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
            # the START control input is 1 on the first request only: Triton's model adds it
            assert outputs["OUTPUT"] == [sign * value + (1 if i == 0 else 0)]
            assert outputs["COUNT"] == [i + 1]  # the sequence's own state, request after request
    status, doc = step(client, 1000, 1)  # ended: a new request needs the START flag
    assert status == 400 and "START flag" in doc["error"]
    status, doc = step(client, 1000, 1, sequence_end="no")
    assert status == 400 and "'sequence_end' must be true or false" in doc["error"]


def test_a_request_outside_any_sequence_is_refused_as_triton_refuses_it(servekit_app, sequence_repo):
    client = servekit_app(sequence_repo)
    for seq_id in (None, 0, ""):
        status, doc = step(client, seq_id, 1)
        assert status == 400, doc
        assert doc["error"] == (
            "inference request to model 'simple_sequence' must specify a non-zero or non-empty correlation ID"
        )
    wrong = {
        "inputs": [
            {"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [1]},
            {"name": "START", "shape": [1, 1], "datatype": "INT32", "data": [0]},
        ],
        "parameters": {"sequence_id": 5, "sequence_start": True},
    }
    answer = client.post("/v2/models/simple_sequence/infer", json=wrong)  # the server sets START, not the client
    assert answer.status_code == 400 and "START" in answer.get_json()["error"]


def test_triton_sequence_batching_becomes_servekit_sequence_settings(tmp_path):
    from servekit.folders import triton_config
    from servekit.folders.servekit_yaml import ConfigError, read_model_config

    shutil.copytree(TRITON / "simple_sequence", tmp_path / "simple_sequence")
    folder = tmp_path / "simple_sequence"
    config = read_model_config(folder).sequence
    assert config is not None and config.max_idle_ms == 5000.0 and config.require_sequence_id
    assert config.controls == [
        {"name": "START", "kind": "start", "datatype": "INT32", "shape": [1, 1], "values": [0, 1]},
        {"name": "READY", "kind": "ready", "datatype": "INT32", "shape": [1, 1], "values": [0, 1]},
    ]
    (folder / "servekit.yaml").write_text("sequence: {max_idle_ms: 250}\n")  # servekit.yaml's keys win
    merged = read_model_config(folder).sequence
    assert merged is not None and merged.max_idle_ms == 250.0 and len(merged.controls) == 2
    (folder / "servekit.yaml").write_text("sequence: false\n")
    assert read_model_config(folder).sequence is None
    unbatched = {
        "sequence_batching": {
            "oldest": {"max_candidate_sequences": 4},
            "control_input": [
                {"name": "END", "control": [{"kind": "CONTROL_SEQUENCE_END", "fp32_false_true": [0.0, 1.0]}]},
                {"name": "ID", "control": [{"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_STRING"}]},
            ],
        }
    }
    assert triton_config.sequence(unbatched) == {
        "require_sequence_id": True,
        "controls": [
            {"name": "END", "kind": "end", "datatype": "FP32", "shape": [1], "values": [0.0, 1.0]},
            {"name": "ID", "kind": "corrid", "datatype": "BYTES", "shape": [1]},
        ],
    }
    for field in ("state", "iterative_sequence"):
        (folder / "servekit.yaml").unlink(missing_ok=True)
        (folder / "config.pbtxt").write_text(f"sequence_batching {{ {field}: [] }}\n".replace(": []", " {}"))
        with pytest.raises(ConfigError, match=f"sequence_batching.{field} is not supported"):
            read_model_config(folder)


def test_control_tensors_follow_the_sequence():
    controls = [
        {"name": "S", "kind": "start", "datatype": "BOOL", "shape": [1], "values": [False, True]},
        {"name": "E", "kind": "end", "datatype": "FP32", "shape": [1, 1], "values": [0.0, 1.0]},
        {"name": "ID", "kind": "corrid", "datatype": "UINT64", "shape": [1]},
        {"name": "NAME", "kind": "corrid", "datatype": "BYTES", "shape": [1]},
    ]
    live = Sequences("m", require_sequence_id=True, controls=controls)
    first = live.open({"sequence_id": 42, "sequence_start": True})
    assert first is not None
    fed = live.with_controls(first, {"x": np.zeros(1)})
    assert fed["S"].tolist() == [True] and fed["E"].tolist() == [[0.0]] and fed["E"].dtype == np.float32
    assert fed["ID"].tolist() == [42] and fed["ID"].dtype == np.uint64 and fed["NAME"].tolist() == [b"42"]
    live.close(first)
    last = live.open({"sequence_id": 42, "sequence_end": True})
    assert last is not None
    fed = live.with_controls(last, {"x": np.zeros(1)})
    assert fed["S"].tolist() == [False] and fed["E"].tolist() == [[1.0]]
    live.close(last)
    named = live.open({"sequence_id": "abc", "sequence_start": True})
    assert named is not None
    with pytest.raises(BadRequest, match="holds a UINT64 correlation ID"):
        live.with_controls(named, {"x": np.zeros(1)})
    live.close(named)


def test_sequence_config_is_checked(servekit_app, sequence_repo):
    from servekit.control import triton_load_config
    from servekit.folders.servekit_yaml import ConfigError, parse_model_config

    assert parse_model_config({"sequence": True}).sequence is not None
    assert parse_model_config({}).sequence is None
    with pytest.raises(ConfigError, match="max_idle_ms"):
        parse_model_config({"sequence": {"max_idle_ms": 0}})
    for bad in (
        {"controls": [{"name": "S", "kind": "begin", "datatype": "INT32", "values": [0, 1]}]},
        {"controls": [{"name": "S", "kind": "start", "datatype": "INT32"}]},
        {"controls": [{"name": "S", "kind": "corrid", "datatype": "FP32"}]},
        {"require_sequence_id": "yes"},
    ):
        with pytest.raises(ConfigError, match="sequence"):
            parse_model_config({"sequence": bad})
    mapped = triton_load_config.settings_for("m", {"sequence_batching": {"max_sequence_idle_microseconds": 2500000}})
    assert mapped == {"sequence": {"max_idle_ms": 2500.0, "require_sequence_id": True}}


# -- end to end: tritonclient against two workers -------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    pytest.importorskip("tritonclient.grpc")
    from servekit.testing import ServerProcess

    base = tmp_path_factory.mktemp("sequence")
    shutil.copytree(TRITON / "simple_sequence", base / "simple_sequence")  # the folder as Triton users write it
    with ServerProcess(base, grpc_port="auto", workers=2, threads=4) as running:
        yield running


#: The three sequences of Triton's sequence examples: the id, the values sent, the OUTPUTs expected
#: (the input, plus one on the first request). The string id is a fresh UUID, as the programs use.
def example_sequences(string_id: str) -> list[tuple[int | str, list[int], list[int]]]:
    first = [0, *VALUES]
    negated = [-v for v in VALUES]
    return [
        (1000, first, [1, *VALUES]),
        (1001, [100, *negated], [101, *negated]),
        (string_id, [20, *negated], [21, *negated]),
    ]


def sync_send(make_client, module, seq_id, values) -> tuple[list[int], list[int], set[int]]:
    """The programs' ``sync_send``: one sequence's requests in order, each through a fresh client
    (so through either worker)."""
    outputs, counts, pids = [], [], set()
    for count, value in enumerate(values, 1):
        inputs = [module.InferInput("INPUT", [1, 1], "INT32")]
        inputs[0].set_data_from_numpy(np.full([1, 1], value, dtype=np.int32))
        result = make_client().infer(
            model_name="simple_sequence",
            inputs=inputs,
            outputs=[module.InferRequestedOutput(name) for name in ("OUTPUT", "COUNT", "PID")],
            sequence_id=seq_id,
            sequence_start=count == 1,
            sequence_end=count == len(values),
        )
        outputs.append(int(result.as_numpy("OUTPUT")[0][0]))
        counts.append(int(result.as_numpy("COUNT")[0][0]))
        pids.add(int(result.as_numpy("PID")[0][0]))
    return outputs, counts, pids


@pytest.mark.slow
@pytest.mark.parametrize("wire", ["http", "grpc"])
def test_simple_sequence_sync_infer_client(server, wire):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    if wire == "http":
        module, address = httpclient, f"127.0.0.1:{server.http_port}"
    else:
        module, address = grpcclient, f"127.0.0.1:{server.grpc_port}"
    seen = set()
    for seq_id, values, expected in example_sequences(str(uuid.uuid4())):
        outputs, counts, pids = sync_send(lambda: module.InferenceServerClient(address), module, seq_id, values)
        assert outputs == expected, seq_id
        assert counts == list(range(1, len(values) + 1))  # one state per sequence, in order
        seen |= pids
    assert len(seen) == 1  # one model host holds every sequence, whichever worker took the request


@pytest.mark.slow
def test_simple_grpc_sequence_stream_infer_client(server):
    import tritonclient.grpc as grpcclient

    answers: queue.Queue = queue.Queue()
    sequences = example_sequences(str(uuid.uuid4()))
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for seq_id, values, _ in sequences:  # the programs' async_stream_send
            for count, value in enumerate(values, 1):
                inputs = [grpcclient.InferInput("INPUT", [1, 1], "INT32")]
                inputs[0].set_data_from_numpy(np.full([1, 1], value, dtype=np.int32))
                client.async_stream_infer(
                    model_name="simple_sequence",
                    inputs=inputs,
                    outputs=[grpcclient.InferRequestedOutput("OUTPUT")],
                    request_id=f"{seq_id}_{count}",
                    sequence_id=seq_id,
                    sequence_start=count == 1,
                    sequence_end=count == len(values),
                )
        got: dict[str, dict[int, int]] = {str(seq_id): {} for seq_id, _, _ in sequences}
        for _ in range(sum(len(values) for _, values, _ in sequences)):
            result, error = answers.get(timeout=30)
            assert error is None, error
            seq_id, count = result.get_response().id.rsplit("_", 1)
            got[seq_id][int(count)] = int(result.as_numpy("OUTPUT")[0][0])
        client.stop_stream()
    for seq_id, values, expected in sequences:
        assert [got[str(seq_id)][c] for c in range(1, len(values) + 1)] == expected


@pytest.mark.slow
def test_sequence_without_start_or_id_is_refused_over_grpc(server):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    inputs = [grpcclient.InferInput("INPUT", [1, 1], "INT32")]
    inputs[0].set_data_from_numpy(np.array([[1]], dtype=np.int32))
    with pytest.raises(InferenceServerException, match="must specify the START flag") as info:
        client.infer("simple_sequence", inputs, sequence_id=424242)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    with pytest.raises(InferenceServerException) as info:
        client.infer("simple_sequence", inputs)  # outside any sequence: Triton's 400
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert info.value.message() == (
        "inference request to model 'simple_sequence' must specify a non-zero or non-empty correlation ID"
    )


@pytest.mark.slow
def test_sequence_without_id_is_a_400_over_http(server):
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    inputs = [httpclient.InferInput("INPUT", [1, 1], "INT32")]
    inputs[0].set_data_from_numpy(np.array([[1]], dtype=np.int32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("simple_sequence", inputs)
    assert info.value.status() == "400"
    assert "must specify a non-zero or non-empty correlation ID" in info.value.message()
