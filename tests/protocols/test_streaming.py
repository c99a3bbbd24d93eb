"""Streaming predict over SSE against a real server: framing (parsed with
``sseclient-py``), ``?stream=`` over body ``"stream"``, the metadata trailer and
log-id headers, errors before and after the first byte, a client disconnect
stopping the model's generator, and concurrent streams beside ordinary calls.

The model is ``STREAM_MODEL_PY`` (a ``model.py`` whose ``predict`` returns a
generator), served alone so the generic ``/predict`` route reaches it too.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import sseclient
from generative_models import STREAM_MODEL_PY, write_model

pytestmark = pytest.mark.slow  # starts real servers or subprocesses

TRAILER = ": servekit-metadata "


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("stream") / "streamer", STREAM_MODEL_PY)


@pytest.fixture(scope="module")
def server(model_dir):
    from servekit.testing import ServerProcess

    with ServerProcess(model_dir) as srv:  # default workers and threads
        yield srv


def predict_url(server, generic: bool = False) -> str:
    return server.url + ("/predict" if generic else "/v1/models/streamer:predict")


def body(mode: str = "count", stream: bool | None = None, **parameters) -> dict:
    out: dict = {"instances": [1.0, 2.0], "parameters": {"mode": mode, **parameters}}
    if stream is not None:
        out["stream"] = stream
    return out


def read_sse(response: requests.Response) -> tuple[list[sseclient.Event], str]:
    """The events (through sseclient-py's parser) and the raw text (for the comment trailer)."""
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("text/event-stream")
    raw = response.content
    return list(sseclient.SSEClient([raw]).events()), raw.decode()


def trailer_of(raw: str) -> dict:
    last = raw.rstrip("\n").splitlines()[-1]
    assert last.startswith(TRAILER), raw[-300:]
    return json.loads(last[len(TRAILER) :])


@pytest.mark.parametrize("generic", [False, True], ids=["v1", "generic"])
def test_stream_events_and_metadata_trailer(server, generic):
    r = requests.post(predict_url(server, generic) + "?stream=true", json=body("count", n=3), timeout=60)
    events, raw = read_sse(r)
    assert [json.loads(e.data) for e in events] == [{"predictions": [0]}, {"predictions": [1]}, {"predictions": [2]}]
    assert all(e.event == "message" for e in events)
    meta = trailer_of(raw)
    assert meta["requestLogId"] == r.headers["X-Request-Log-Id"]
    assert len(meta["predictionLogIds"]) == 3 and len(set(meta["predictionLogIds"])) == 3


@pytest.mark.parametrize(
    ("query", "in_body", "streams"),
    [
        ("", True, True),
        ("", False, False),
        ("?stream=true", False, True),
        ("?stream=false", True, False),
        ("", None, False),
    ],
)
def test_query_parameter_wins_over_body(server, query, in_body, streams):
    r = requests.post(predict_url(server) + query, json=body("count", stream=in_body, n=2), timeout=60)
    assert r.status_code == 200
    if streams:
        events, _ = read_sse(r)
        assert len(events) == 2
    else:
        assert r.headers["Content-Type"] == "application/json"
        assert r.json() == {"predictions": [[0], [1]]}  # the generator collected into one answer


def test_plain_predict_carries_log_ids_in_headers(server):
    r = requests.post(predict_url(server), json=body("plain"), timeout=60)
    assert r.json() == {"predictions": [2.0, 4.0]}
    assert r.headers["X-Request-Log-Id"]
    assert len(r.headers["X-Prediction-Log-Ids"].split(",")) == 1


def test_failure_before_first_byte_is_a_json_error(server):
    r = requests.post(predict_url(server) + "?stream=true", json=body("fail-first"), timeout=60)
    assert r.status_code == 500
    assert "failed before the first item" in r.json()["error"]


def test_failure_after_first_byte_is_an_error_event(server):
    r = requests.post(predict_url(server) + "?stream=true", json=body("explode"), timeout=60)
    events, raw = read_sse(r)
    assert json.loads(events[0].data) == {"predictions": [0]}
    assert events[1].event == "error"
    assert "exploded on purpose" in json.loads(events[1].data)["error"]
    assert len(trailer_of(raw)["predictionLogIds"]) == 1


def test_disconnect_stops_the_generation(server, model_dir):
    progress = model_dir / "progress.txt"
    with requests.post(predict_url(server) + "?stream=true", json=body("forever"), stream=True, timeout=60) as r:
        seen = 0
        for line in r.iter_lines():
            if line.startswith(b"data:"):
                seen += 1
                if seen == 3:
                    break
    # the connection is closed; the server's next write fails and the generator is closed
    state = ""
    for _ in range(600):  # bounded wait for the worker to notice, not a timing assertion
        state = progress.read_text() if progress.exists() else ""
        if state.startswith("closed"):
            break
        time.sleep(0.1)
    assert state.startswith("closed"), state
    stopped_at = int(state.split()[1])
    assert 3 <= stopped_at < 1_000_000
    # and the worker is free for the next request
    assert requests.post(predict_url(server), json=body("plain"), timeout=60).status_code == 200


def test_eight_streams_progress_at_once_with_default_settings(server):
    """Each stream waits at a barrier for all eight: serialised streams would break it."""

    def one(_):
        r = requests.post(predict_url(server) + "?stream=true", json=body("barrier", parties=8), timeout=120)
        events, _ = read_sse(r)
        return [json.loads(e.data) for e in events]

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(8)))
    assert results == [[{"predictions": ["started"]}, {"predictions": ["all started"]}]] * 8
    assert requests.post(predict_url(server), json=body("plain"), timeout=60).status_code == 200


def test_ordinary_calls_complete_while_eight_streams_are_open(model_dir, tmp_path):
    """Eight streams held open (they end only once the test opens the gate, after the
    predict calls returned) while ordinary calls go through, with the default worker
    settings (16 threads per worker: more threads than streams)."""
    from servekit.testing import ServerProcess

    gate = model_dir / "gate"
    gate.unlink(missing_ok=True)
    with ServerProcess(model_dir, poll_interval=0) as srv:  # default workers and threads
        streams = [
            requests.post(predict_url(srv) + "?stream=true", json=body("gate"), stream=True, timeout=120)
            for _ in range(8)
        ]
        data_lines = [(line for line in r.iter_lines() if line.startswith(b"data:")) for r in streams]
        try:
            for lines in data_lines:  # every stream has started and is now waiting at the gate
                assert json.loads(next(lines)[5:]) == {"predictions": ["started"]}
            answers = [requests.post(predict_url(srv), json=body("plain"), timeout=60) for _ in range(4)]
            assert [a.json() for a in answers] == [{"predictions": [2.0, 4.0]}] * 4
            gate.write_text("open")
            for lines in data_lines:
                assert [json.loads(line[5:]) for line in lines] == [{"predictions": ["gate open"]}]
        finally:
            gate.unlink(missing_ok=True)
            for r in streams:
                r.close()
