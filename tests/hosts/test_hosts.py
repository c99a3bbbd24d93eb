"""Model processes (servekit.hosts): configuration, the shared-memory hand-off, and serving through a host.

Real model folders with a ``model.py`` and real host processes; the app is the
in-process Flask client, so the test process is the server's owner.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from servekit import hosts
from servekit.folders.servekit_yaml import ConfigError, parse_model_config
from servekit.hosts import channel, runtime
from servekit.types import ModelConfig

MODEL = """
import os
import time
from pathlib import Path

import numpy as np
import servekit


@servekit.hookimpl
def load(path, config):
    return {"path": path, "device": config.device}


@servekit.hookimpl
def predict(model, inputs, parameters):
    if parameters.get("fail"):
        raise RuntimeError("asked to fail")
    if parameters.get("pid"):
        return {"pid": np.full((len(inputs), 1), os.getpid()), "device": np.array([model["device"]] * len(inputs))}
    gate = parameters.get("gate")
    if gate:  # the first call waits at the gate so that the others queue behind it
        deadline = time.monotonic() + 10
        while not Path(gate).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        with open(Path(gate).with_suffix(".rows"), "a") as f:
            f.write(f"{len(inputs)}\\n")
    if inputs.dtype.kind in "iuf":
        return inputs * 2
    return np.char.upper(inputs.astype(str)).astype(object)
"""


def host_model(base: Path, name: str = "echo", **config: object) -> Path:
    folder = base / name
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(MODEL)
    settings = {"placement": "process", **config}
    (folder / "servekit.yaml").write_text(json.dumps(settings))
    return folder


def infer(client, name: str, data, datatype: str = "FP32", shape=None, parameters=None):
    tensor = {
        "name": "x",
        "datatype": datatype,
        "shape": shape or [len(data), len(data[0])],
        "data": [v for row in data for v in row],
    }
    body = {"inputs": [tensor], **({"parameters": parameters} if parameters else {})}
    return client.post(f"/v2/models/{name}/infer", json=body)


# -- configuration -----------------------------------------------------------------------


def test_placement_and_replicas_are_read_from_servekit_yaml():
    config = parse_model_config({"placement": "process", "replicas": 3})
    assert (config.placement, config.replicas) == ("process", 3)
    assert hosts.placement_of(config) == ("process", 3)
    assert parse_model_config({}).placement is None


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"placement": "gpu"}, "'placement' must be worker or process"),
        ({"placement": "process", "replicas": 0}, "'replicas' must be a number"),
        ({"placement": "process", "replicas": "2"}, "'replicas' must be a number"),
        ({"placement": "worker", "replicas": 2}, "'replicas' needs placement: process"),
    ],
)
def test_bad_placement_settings_are_refused_naming_the_key(raw, message):
    with pytest.raises(ConfigError, match=message):
        parse_model_config(raw)


def test_the_server_default_applies_where_servekit_yaml_says_nothing(monkeypatch):
    monkeypatch.setenv(runtime.ENV_PLACEMENT, "process")
    assert hosts.placement_of(ModelConfig()) == ("process", 1)
    assert hosts.placement_of(ModelConfig(placement="worker")) == ("worker", 1)
    monkeypatch.setenv(runtime.ENV_PLACEMENT, "worker")
    assert hosts.placement_of(ModelConfig()) == ("worker", 1)


@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_a_cuda_model_gets_exactly_one_host_whatever_the_settings(device, monkeypatch):
    monkeypatch.setenv(runtime.ENV_PLACEMENT, "worker")
    assert hosts.placement_of(ModelConfig(device=device)) == ("process", 1)
    assert hosts.placement_of(ModelConfig(device=device, placement="worker")) == ("process", 1)
    assert hosts.placement_of(ModelConfig(device=device, placement="process", replicas=4)) == ("process", 1)


# -- the hand-off --------------------------------------------------------------------------


def test_arrays_cross_in_shared_memory_and_the_rest_in_the_header(tmp_path):
    slab = channel.Slab.create(f"servekit-test-{os.getpid()}-", 10)
    try:
        value = {
            "a": np.arange(12, dtype=np.float32).reshape(3, 4),
            "b": np.array([1, 2], dtype=np.int64),
            "s": np.array(["x", "y"], dtype=object),
            "n": 3,
        }
        assert slab.size >= channel.SLAB_MIN and channel.needed([value]) <= slab.size
        packed = channel.Packer(slab).pack(value)
        assert isinstance(packed["a"], channel.ShmArray) and isinstance(packed["b"], channel.ShmArray)
        assert packed["s"] is value["s"] and packed["n"] == 3
        peer = channel.Slab.attach(slab.name)  # the peer maps it and removes the name
        assert not (channel.SHM_DIR / f"servekit-test-{os.getpid()}-0").exists() or slab.name is None
        out = channel.unpack(packed, peer, copy=True)
        np.testing.assert_array_equal(out["a"], value["a"])
        np.testing.assert_array_equal(out["b"], value["b"])
        assert list(out["s"]) == ["x", "y"]
        peer.close()
    finally:
        slab.close()
    assert not list(channel.SHM_DIR.glob(f"servekit-test-{os.getpid()}-*"))


def test_a_slab_is_sized_in_powers_of_two_above_the_minimum():
    slab = channel.Slab.create(f"servekit-test-{os.getpid()}-", channel.SLAB_MIN * 3 + 1)
    try:
        assert slab.size == channel.SLAB_MIN * 4
    finally:
        slab.close()


def test_framing_reads_whole_messages_however_the_bytes_arrive():
    import socket

    left, right = socket.socketpair()
    try:
        framer = channel.Framer(right)
        assert framer.ready() == []  # nothing yet: never waits
        first, second = channel.encode({"n": 1}), channel.encode({"n": 2, "blob": b"x" * 300_000})
        left.sendall(first + second[:10])  # one message and the start of the next in one read
        assert framer.ready() == [{"n": 1}]
        sender = threading.Thread(target=left.sendall, args=(second[10:],))
        sender.start()
        assert framer.read() == {"n": 2, "blob": b"x" * 300_000}  # longer than one recv
        sender.join()
        left.close()
        with pytest.raises(channel.PeerGone):
            framer.read()
    finally:
        left.close()
        right.close()


# -- serving through a host ------------------------------------------------------------------


@pytest.fixture
def hosted(tmp_path, servekit_app):
    # a long batch window: the batch closes when the model frees up, not on the clock
    host_model(tmp_path, batching={"max_batch_size": 16, "max_batch_time_ms": 10_000})
    client = servekit_app(tmp_path)
    yield client
    runtime.cleanup()


def test_the_model_runs_in_a_host_process_and_answers_like_in_a_worker(hosted):
    r = infer(hosted, "echo", [[1.5, 2.0]], parameters={"pid": True})
    assert r.status_code == 200, r.json
    outputs = {o["name"]: o["data"] for o in r.json["outputs"]}
    assert outputs["pid"][0] != os.getpid()
    r = infer(hosted, "echo", [[1.5, 2.0], [3.0, 4.0]])
    assert r.json["outputs"][0]["data"] == [3.0, 4.0, 6.0, 8.0]


def test_strings_and_large_tensors_cross_both_ways(hosted):
    r = infer(hosted, "echo", [["ab"], ["c"]], datatype="BYTES")
    assert r.status_code == 200, r.json
    assert r.json["outputs"][0]["data"] == ["AB", "C"]
    rows = 300_000  # 2.4 MB in and out: both slabs grow
    mv = hosted.application.extensions["servekit"].resolve("echo")
    big = np.random.default_rng(0).random((rows, 2), dtype=np.float32)
    np.testing.assert_array_equal(hosted.application.extensions["servekit"].predict(mv, big), big * 2)


def test_concurrent_callers_each_get_their_own_answer(hosted):
    """Answers are copied out of a pooled connection's slab before another thread can reuse it."""
    dp = hosted.application.extensions["servekit"]
    mv = dp.resolve("echo")
    wrong: list[str] = []

    def caller(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(40):
            x = rng.random((int(rng.choice([1, 7, 200_000])), 3), dtype=np.float32)
            got = dp.predict(mv, x)
            if not np.array_equal(got, x * 2):
                wrong.append(f"caller {seed}: {got.shape} for {x.shape}")

    threads = [threading.Thread(target=caller, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not wrong, wrong[:5]


def test_model_errors_and_missing_hooks_keep_their_status(hosted):
    r = infer(hosted, "echo", [[1.0]], parameters={"fail": True})
    assert r.status_code == 500
    assert "asked to fail" in r.json["error"]
    r = hosted.post("/v1/models/echo:explain", json={"instances": [[1.0]]})
    assert r.status_code == 501, r.json


def test_the_batcher_in_the_host_merges_concurrent_requests(hosted, tmp_path):
    gate = tmp_path / "gate"
    dp = hosted.application.extensions["servekit"]
    mv = dp.resolve("echo")
    answers: list[np.ndarray] = []

    def call(value: float) -> None:
        answers.append(dp.predict(mv, np.full((1, 2), value, np.float32), parameters={"gate": str(gate)}))

    first = threading.Thread(target=call, args=(0.0,))
    first.start()
    threading.Event().wait(0.3)  # the first call takes the model and waits at the gate
    others = [threading.Thread(target=call, args=(float(i),)) for i in range(1, 6)]
    for t in others:
        t.start()
    threading.Event().wait(0.5)  # let them reach the host while the first call holds the model
    gate.touch()
    for t in [first, *others]:
        t.join(30)
    rows = [int(n) for n in gate.with_suffix(".rows").read_text().split()]
    assert sum(rows) == 6 and max(rows) > 1, rows
    assert sorted(float(a[0, 0]) for a in answers) == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]


def test_a_cuda_model_loads_in_one_host_without_cuda(tmp_path, servekit_app):
    host_model(tmp_path, "gpu", device="cuda", placement="worker", replicas=1)
    client = servekit_app(tmp_path)
    try:
        pids = set()
        for _ in range(3):
            r = infer(client, "gpu", [[1.0]], parameters={"pid": True})
            assert r.status_code == 200, r.json
            outputs = {o["name"]: o["data"] for o in r.json["outputs"]}
            pids.add(outputs["pid"][0])
            assert outputs["device"] == ["cuda"]
        assert len(pids) == 1 and os.getpid() not in pids
    finally:
        runtime.cleanup()


def test_replicas_take_calls_in_turn(tmp_path, servekit_app):
    host_model(tmp_path, replicas=2)
    client = servekit_app(tmp_path)
    try:
        pids = {
            infer(client, "echo", [[1.0]], parameters={"pid": True}).json["outputs"][0]["data"][0] for _ in range(4)
        }
        assert len(pids) == 2
    finally:
        runtime.cleanup()


def test_a_model_that_fails_to_load_in_its_host_is_reported(tmp_path, servekit_app):
    folder = host_model(tmp_path, "broken")
    (folder / "1" / "model.py").write_text(
        "import servekit\n\n@servekit.hookimpl\ndef load(path):\n    raise ValueError('no weights here')\n"
    )
    client = servekit_app(tmp_path)
    try:
        r = infer(client, "broken", [[1.0]])
        assert r.status_code == 503
        assert "no weights here" in r.json["error"]
    finally:
        runtime.cleanup()


def test_owner_cleanup_stops_hosts_and_leaves_no_shared_memory(tmp_path, servekit_app):
    host_model(tmp_path)
    client = servekit_app(tmp_path)
    pid = infer(client, "echo", [[1.0]], parameters={"pid": True}).json["outputs"][0]["data"][0]
    prefix = runtime.shm_prefix()
    folder = Path(os.environ[runtime.ENV_DIR])
    runtime.cleanup()
    assert not runtime._alive(pid)
    assert not list(channel.SHM_DIR.glob(prefix + "*"))
    assert not folder.exists()


STREAMING = """
import numpy as np
import servekit


@servekit.hookimpl
def load(path):
    return "ticker"


@servekit.hookimpl
def predict(inputs, parameters):
    for i in range(int(inputs[0, 0])):
        if parameters.get("fail_at") == i:
            raise RuntimeError("stream broke")
        yield {"tick": np.array([i])}
"""


def test_a_streaming_model_streams_through_its_host(tmp_path, servekit_app):
    folder = host_model(tmp_path, "ticker")
    (folder / "1" / "model.py").write_text(STREAMING)
    client = servekit_app(tmp_path)
    dp = client.application.extensions["servekit"]
    mv = dp.resolve("ticker")
    try:
        items = list(dp.predict(mv, np.array([[3.0]])))
        assert [int(item["tick"][0]) for item in items] == [0, 1, 2]
        broken = dp.predict(mv, np.array([[3.0]]), parameters={"fail_at": 1})
        assert int(next(broken)["tick"][0]) == 0
        with pytest.raises(Exception, match="stream broke"):
            next(broken)
        assert len(list(dp.predict(mv, np.array([[2.0]])))) == 2  # the connection is usable again
    finally:
        runtime.cleanup()


def test_a_removed_version_stops_its_host_and_a_new_one_starts(tmp_path, servekit_app):
    folder = host_model(tmp_path)
    client = servekit_app(tmp_path)
    dp = client.application.extensions["servekit"]
    try:
        old = infer(client, "echo", [[1.0]], parameters={"pid": True}).json["outputs"][0]["data"][0]
        (folder / "2").mkdir()
        (folder / "2" / "model.py").write_text(MODEL)
        dp.repository.sync()  # version 2 loads in a new host, version 1 is unloaded
        r = infer(client, "echo", [[1.0]], parameters={"pid": True})
        assert r.json["model_version"] == "2"
        assert r.json["outputs"][0]["data"][0] != old
        deadline = time.monotonic() + 10
        while runtime._alive(old) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not runtime._alive(old)
    finally:
        runtime.cleanup()


@pytest.mark.slow  # seconds of its own: out of the quick lane
def test_a_hung_call_in_a_batching_host_bounds_the_next_requests_too(tmp_path, servekit_app, monkeypatch):
    """One batch at a time: while a call hangs, later requests (on new connections) get 504 in time."""
    monkeypatch.setenv("SERVEKIT_REQUEST_TIMEOUT", "1")
    host_model(tmp_path, "hang", batching={"max_batch_size": 8, "max_batch_time_ms": 1})
    client = servekit_app(tmp_path)
    try:
        never = str(tmp_path / "never")  # the model waits 10 s for this file
        assert infer(client, "hang", [[1.0]]).status_code == 200  # the host is up
        r = infer(client, "hang", [[1.0]], parameters={"gate": never})
        assert r.status_code == 504
        began = time.monotonic()
        r = infer(client, "hang", [[1.0]])  # its connection was dropped: a new one waits for the host's hello
        assert r.status_code == 504 and "did not answer within 1s" in r.json["error"], r.json
        assert time.monotonic() - began < 5  # not one timeout per retry
    finally:
        runtime.cleanup()


@pytest.mark.slow  # seconds of its own: out of the quick lane
def test_a_hung_model_call_is_bounded_by_the_request_timeout(tmp_path, servekit_app, monkeypatch):
    monkeypatch.setenv("SERVEKIT_REQUEST_TIMEOUT", "1")
    host_model(tmp_path, "hang")
    client = servekit_app(tmp_path)
    try:
        never = str(tmp_path / "never")  # the model waits 10 s for this file
        r = infer(client, "hang", [[1.0]], parameters={"gate": never})
        assert r.status_code == 504
        assert "did not answer within 1s" in r.json["error"]
        r = infer(client, "hang", [[1.0]])
        assert r.status_code == 200 and r.json["outputs"][0]["data"] == [2.0]
    finally:
        runtime.cleanup()
