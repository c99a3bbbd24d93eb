"""Shadow copies on their way to the shadow process (servekit.hosts.shadow_pipe): frames, the pipe's room, drops.

The pipe's far end is a stand-in process here (one that sleeps, then reads the
frames back); the shadow process itself runs in tests/e2e/test_canary_shadow.py
and in the in-process app below.
"""

from __future__ import annotations

import json
import logging
import os
import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from prometheus_client import REGISTRY
from servekit.hosts import shadow_pipe
from servekit.observability import metrics
from servekit.observability.log_store import Query
from servekit.types import BatchingConfig
from sklearn_models import SCALING_MODEL


class Version(SimpleNamespace):
    """What the runner reads of a candidate version (a ModelVersion has more)."""


def version(name: str = "candidate", number: int = 2) -> Version:
    return Version(
        name=name,
        version=number,
        path=Path(f"/models/{name}/{number}"),
        fingerprint=1.5,
        raw_config={},
        config=SimpleNamespace(base_path=None),
    )


def frames_of(data: bytes) -> list[tuple]:
    """Every whole frame in ``data``, in order (what the shadow process would read)."""
    r, w = os.pipe()
    found = []
    try:
        with open(w, "wb") as out:  # closed before reading: the reader meets the end
            out.write(data)
        reader = shadow_pipe.FrameReader(r)
        while (body := reader.read()) is not None:
            found.append(shadow_pipe.decode(body))
    finally:
        os.close(r)
    return found


def test_a_frame_carries_arrays_of_every_kind_and_a_cut_frame_is_never_read():
    message = (
        "copy",
        {
            "x": np.arange(6, dtype=np.float32).reshape(2, 3).T,  # not contiguous
            "s": np.array(["a", "bb"]),
            "b": np.array([b"raw"]),
            "o": np.array([1, "mixed"], dtype=object),
            "rec": np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")]),
            "scalar": np.float16(2.5),
        },
    )
    frame = shadow_pipe.encode(message)
    ((kind, got),) = frames_of(frame)
    assert kind == "copy" and set(got) == set(message[1])
    for name, value in message[1].items():
        assert np.asarray(got[name]).dtype == np.asarray(value).dtype
        assert np.array_equal(got[name], value)
    assert got["x"].flags.writeable  # the model gets an array it may change, as a served request does
    assert len(frames_of(frame + frame[:-1])) == 1
    assert frames_of(frame[:3]) == [] and frames_of(frame[:-1]) == []


def test_the_room_followed_from_the_writer_is_what_the_kernel_takes():
    """Small frames share the kernel's page buffers only where their remainder fits: the room
    is not capacity minus unread bytes.  Whatever the sizes and reads, a write the room allows
    goes in whole and one it refuses would not have."""
    r, w = os.pipe()
    try:
        capacity = shadow_pipe.pipe_capacity(w)
        os.set_blocking(w, False)
        os.set_blocking(r, False)
        room = shadow_pipe.PipeRoom(capacity)
        rng = random.Random(7)
        allowed = refused = 0
        for _ in range(4000):
            if rng.random() < 0.3:
                try:
                    os.read(r, rng.choice([1, 100, 4096, 5000, 70000]))
                except BlockingIOError:
                    pass
                continue
            size = rng.choice([300, 2049, 4095, 4096, 4097, 9000, 70000, rng.randint(1, 200000)])
            fits = room.fits(size, shadow_pipe.unread(w))
            try:
                written = os.write(w, b"x" * size) if fits else 0
            except BlockingIOError:
                written = 0
            if fits:
                assert written == size, f"the room allowed {size} bytes; the kernel took {written}"
                room.wrote(size)
                allowed += 1
            else:
                refused += 1
                if size <= 4096:  # a write of a page or less is all or nothing: the kernel refuses it too
                    with pytest.raises(BlockingIOError):
                        os.write(w, b"x" * size)
        assert allowed > 1000 and refused > 100
    finally:
        os.close(r)
        os.close(w)


STAND_IN = """
import json, os, sys, time
from pathlib import Path
from servekit.hosts import shadow_pipe
frames, answers, config = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
go = Path(os.environ["SHADOW_TEST_GO"])
while not go.exists():
    time.sleep(0.01)
reader = shadow_pipe.FrameReader(frames)
got = []
while (body := reader.read()) is not None:
    kind, *rest = shadow_pipe.decode(body)
    got.append([kind, rest[5] if kind == "copy" else rest[0]])
Path(str(go) + ".json").write_text(json.dumps(got))
"""


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """A runner whose "shadow process" reads nothing until told to, then lists every frame it got."""
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    go = tmp_path / "go"
    monkeypatch.setenv("SHADOW_TEST_GO", str(go))
    monkeypatch.setattr(shadow_pipe, "COMMAND", [sys.executable, str(script)])
    monkeypatch.setattr(shadow_pipe, "idle_priority", lambda pid=0: "left as it was")  # a loaded machine
    runner = shadow_pipe.ShadowProcess(SimpleNamespace(), BatchingConfig())
    yield runner, go
    go.touch()
    runner.close(grace=10)


def dropped_total(model: str) -> float:
    metrics.metrics()
    return REGISTRY.get_sample_value("servekit_shadow_dropped_total", {"model": model}) or 0.0


def test_a_full_pipe_drops_and_counts_the_copy_without_waiting_and_never_cuts_a_frame(stand_in):
    runner, go = stand_in
    candidate = version()
    inputs = ({"x": np.ones((4, 256), dtype=np.float32)}, {"parameters": None})
    before = dropped_total("full")
    slowest = 0.0
    for i in range(3000):  # about 5 MB of frames against a pipe of at most 1 MiB that nobody reads
        started = time.perf_counter()
        runner.submit(candidate, inputs, {"y": np.zeros(4)}, f"served-{i}", "full", "/shadow/full")
        slowest = max(slowest, time.perf_counter() - started)
    assert slowest < 0.5  # never waits for room (the first copy also creates the pipe)
    runner.flush()  # what the writer thread has not written yet
    assert runner.dropped > 1000
    assert dropped_total("full") - before == runner.dropped
    go.touch()
    runner.close(grace=30)
    got = json.loads(Path(str(go) + ".json").read_text())
    ids = [served for kind, served in got if kind == "copy"]
    assert len(ids) == 3000 - runner.dropped  # every copy written arrived whole, in order
    assert ids == sorted(ids, key=lambda s: int(s.split("-")[1]))


def test_a_sync_waits_for_room_where_a_copy_would_be_dropped(stand_in, caplog):
    runner, go = stand_in
    candidate = version()
    big = ({"x": np.ones((1024, 512), dtype=np.float32)}, {})  # 2 MiB: never fits
    with caplog.at_level(logging.WARNING, logger="servekit.hosts"):
        for _ in range(3):
            runner.submit(candidate, big, {}, "too-big", "m", "/shadow/m")
    assert runner.dropped == 3
    assert [r.getMessage() for r in caplog.records].count(
        f"model m: a shadow copy larger than the pipe to the shadow process ({runner._child.room.capacity} bytes) "
        "is dropped; copies that large never run"
    ) == 1  # said once
    runner.submit(candidate, ({"x": np.ones(3)}, {}), {}, "small", "m", "/shadow/m")
    assert runner.dropped == 3
    assert not runner.wait_idle(timeout=0.5)  # the stand-in answers no sync: timed out, not hung
    go.touch()
    runner.close(grace=30)
    got = json.loads(Path(str(go) + ".json").read_text())
    assert got[0] == ["copy", "small"] and got[1][0] == "sync"


@pytest.mark.slow
# the shadow process computes only on CPU time nothing else wants (SCHED_IDLE)
@pytest.mark.alone
def test_wait_idle_returns_once_every_copy_is_logged_and_in_the_store(servekit_app, tmp_path):
    base = tmp_path / "models"
    for number in (1, 2):
        (base / "shadowed" / str(number)).mkdir(parents=True)
        (base / "shadowed" / str(number) / "model.py").write_text(SCALING_MODEL.replace("FACTOR", str(number * 10)))
    (base / "shadowed" / "servekit.yaml").write_text(
        "version_policy: all\ntraffic:\n  weights: {1: 1}\nshadow:\n  target: 2\n  fraction: 1.0\n"
    )
    client = servekit_app(base, request_log_url=f"sqlite:///{tmp_path / 'logs.db'}")
    served = {}
    for i in range(30):
        body = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [float(i)]}]}
        r = client.post("/v2/models/shadowed/infer", json=body)
        assert r.status_code == 200 and r.get_json()["model_version"] == "1"
        served[r.headers["X-Request-Log-Id"]] = i
    app = client.application
    assert app.extensions["servekit"].shadows.wait_idle(timeout=60)
    # read straight from the database: the shadow process flushed its records before answering
    found = app.extensions["servekit.request_log"].backend.search(Query(model="shadowed", version="2", limit=100))
    records = {r.request_id: r for r in found if r.protocol == "shadow"}
    assert set(records) == set(served)
    for rid, i in served.items():
        response = json.loads(records[rid].response_body)
        assert response["shadow_of"] == rid and response["difference"] == pytest.approx(10.0 * i)
    assert app.extensions["servekit"].shadows.wait_idle(timeout=10)  # nothing new: at once


def test_a_copy_that_cannot_be_pickled_is_dropped_counted_and_said_once(stand_in, caplog):
    runner, _ = stand_in
    request = ({"x": np.ones(2)}, {"parameters": {"callback": lambda: None}})
    before = dropped_total("unpicklable")
    with caplog.at_level(logging.WARNING, logger="servekit.hosts"):
        for i in range(3):
            runner.submit(version(), request, {}, f"served-{i}", "unpicklable", "/shadow/unpicklable")
        runner.flush()  # pickled by the writer thread
    assert runner.dropped == 3 and dropped_total("unpicklable") - before == 3
    assert sum("could not be pickled" in r.getMessage() for r in caplog.records) == 1


def test_the_board_carries_the_worker_s_concurrency_and_a_copy_waits_for_a_pause(monkeypatch):
    """The worker's requests in flight, on memory the shadow process maps: a copy runs once the
    worker has held none for QUIET_S, or once it is DEFER_S old; copies that fill half the pipe
    meanwhile are read out of it (in order), and run at once only when SPILL_BYTES are waiting."""
    from servekit.hosts import shadow
    from servekit.observability import load

    fd, board = shadow_pipe._shared_board()
    r, w = os.pipe()
    monkeypatch.setattr(load._load, "board", None)
    load.share_concurrency(board)
    try:
        idle = shadow.WorkerIdle(fd, shadow_pipe.FrameReader(r))
        load.arrived("m")
        assert load.read_board(idle.board) == 1
        monkeypatch.setattr(shadow, "DEFER_S", 0.3)
        started = time.monotonic()
        idle.wait(started)  # the worker stays busy: the copy runs once it is DEFER_S old
        assert time.monotonic() - started >= 0.3
        started = time.monotonic()
        idle.wait(started - 0.2)  # handed in 0.2 s ago: it waits what is left of DEFER_S
        assert time.monotonic() - started >= 0.1

        # more than half the pipe of frames: read out of the pipe, and the copy still waits
        frame = shadow_pipe.encode(("copy", "x" * 1000))
        count = shadow_pipe.pipe_size(w) // 2 // len(frame) + 2
        for i in range(count):
            os.write(w, shadow_pipe.encode(("copy", i)))
            os.write(w, frame)
        started = time.monotonic()
        idle.wait(started)
        assert time.monotonic() - started >= 0.3 and shadow_pipe.unread(r) == 0
        assert len(idle.spilled) == 2 * count
        # with no room left to read them into, a copy runs at once
        monkeypatch.setattr(shadow, "SPILL_BYTES", 1)
        monkeypatch.setattr(shadow, "DEFER_S", 10.0)
        for _ in range(count):
            os.write(w, frame)
        started = time.monotonic()
        idle.wait(started)
        assert time.monotonic() - started < 5.0  # well before DEFER_S
        # the frames come out in the order the worker wrote them, the pipe's after the read ones
        got = [shadow_pipe.decode(idle.next_frame()) for _ in range(3 * count)]
        assert [m[1] for m in got[: 2 * count : 2]] == list(range(count))
        assert all(m == ("copy", "x" * 1000) for m in got[1 : 2 * count : 2] + got[2 * count :])
        assert idle.spilled_bytes == 0 and shadow_pipe.unread(r) == 0

        load.left("m")
        assert load.read_board(idle.board) == 0
        started = time.monotonic()
        idle.wait(started)  # the worker holds no request: the copy runs after QUIET_S
        assert shadow.QUIET_S <= time.monotonic() - started < 5.0
    finally:
        load._load.board = None
        for each in (fd, r, w):
            os.close(each)
