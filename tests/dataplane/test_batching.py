"""Adaptive batching: stacking, splitting, ordering, isolation, closing rules, and a real server.

Batches are made deterministic without timing: a *gate* holds the model busy
until the test has queued the requests it wants batched together, then opens.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from servekit.dataplane import batching
from servekit.dataplane.batching import Batcher, Unsplittable, batch_key, split, stack

WAIT = 30.0  # generous upper bound for a step that should happen at once


@pytest.fixture(scope="module")
def iris_model():
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    X, y = load_iris(return_X_y=True)
    return LogisticRegression(max_iter=1000).fit(X, y), X


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.002)


class GatedModel:
    """Calls a real estimator, records each call's row count; the first call waits for the gate."""

    def __init__(self, estimator: Any):
        self.estimator = estimator
        self.calls: list[int] = []
        self.gate = threading.Event()
        self.inside = threading.Event()

    def __call__(self, X: np.ndarray) -> np.ndarray:
        self.calls.append(len(X))
        if len(self.calls) == 1:
            self.inside.set()
            assert self.gate.wait(WAIT)
        return self.estimator.predict_proba(X)


def run_concurrently(
    batcher: Batcher, model: GatedModel, requests_: list[np.ndarray], runner: Callable | None = None
) -> list[Any]:
    """One request holds the model; the others queue; then the gate opens.  Results in order."""
    results: list[Any] = [None] * len(requests_)

    def call(i: int) -> None:
        try:
            results[i] = batcher.submit(requests_[i], runner or model)
        except Exception as exc:  # the test inspects it
            results[i] = exc

    first = threading.Thread(target=call, args=(0,))
    first.start()
    assert model.inside.wait(WAIT)
    rest = [threading.Thread(target=call, args=(i,)) for i in range(1, len(requests_))]
    for t in rest:
        t.start()
    queued = sum(len(r) for r in requests_[1:])
    # every request is either waiting in an open batch or already ran in a full one
    wait_until(lambda: batcher.queued_rows() + sum(model.calls[1:]) >= queued, "requests to queue")
    model.gate.set()
    for t in [first, *rest]:
        t.join(WAIT)
        assert not t.is_alive()
    return results


# -- stacking and splitting ------------------------------------------------------------


def test_batch_key_matches_on_trailing_shape_and_dtype_only():
    a, rows_a = batch_key(np.zeros((3, 4)))
    b, rows_b = batch_key(np.ones((1, 4)))
    assert a == b and (rows_a, rows_b) == (3, 1)
    assert batch_key(np.zeros((1, 5)))[0] != a
    assert batch_key(np.zeros((1, 4), dtype=np.float32))[0] != a
    assert batch_key(np.float64(1.0)) is None
    named, rows = batch_key({"x": np.zeros((2, 3)), "y": np.zeros(2)})
    assert rows == 2 and named != batch_key({"y": np.zeros(2), "x": np.zeros((2, 3))})[0]
    assert batch_key({"x": np.zeros((2, 3)), "y": np.zeros(5)}) is None  # no common row axis


def test_stack_and_split_round_trip_arrays_dicts_and_lists():
    members = [np.arange(8.0).reshape(2, 4), np.arange(4.0).reshape(1, 4), np.full((3, 4), 7.0)]
    stacked = stack(members)
    assert stacked.shape == (6, 4)
    for original, part in zip(members, split(stacked, [2, 1, 3])):
        np.testing.assert_array_equal(original, part)
    named = stack([{"a": np.array([1, 2]), "b": np.array([[1], [2]])}, {"a": np.array([3]), "b": np.array([[3]])}])
    parts = split({"a": named["a"] * 10, "b": named["b"]}, [2, 1])
    np.testing.assert_array_equal(parts[1]["a"], [30])
    np.testing.assert_array_equal(parts[0]["b"], [[1], [2]])
    assert split(["x", "y", "z"], [1, 2]) == [["x"], ["y", "z"]]


@pytest.mark.parametrize("outputs", [np.float64(3.0), np.zeros(5), [1, 2], {"a": np.zeros(3), "b": "text"}, {}])
def test_split_refuses_outputs_without_matching_rows(outputs):
    with pytest.raises(Unsplittable):
        split(outputs, [1, 3])


# -- the batcher, with a real scikit-learn model ------------------------------------------


def test_concurrent_requests_share_one_call_and_keep_their_order(iris_model):
    estimator, X = iris_model
    model = GatedModel(estimator)
    batcher = Batcher(max_batch_size=32, max_batch_time_ms=60_000)
    rows = [X[i : i + n] for i, n in [(0, 1), (50, 2), (100, 1), (10, 3), (120, 1), (70, 1)]]
    results = run_concurrently(batcher, model, rows)
    assert model.calls == [1, 8]  # the gate holder alone, then everyone queued behind it in one call
    for request, result in zip(rows, results):
        np.testing.assert_allclose(result, estimator.predict_proba(request))
    assert batcher.stats.largest == 5


def test_batches_hold_at_most_max_batch_size_rows(iris_model):
    estimator, X = iris_model
    model = GatedModel(estimator)
    batcher = Batcher(max_batch_size=4, max_batch_time_ms=60_000)
    rows = [X[i : i + 1] for i in range(0, 140, 20)]  # 7 one-row requests
    results = run_concurrently(batcher, model, rows)
    assert model.calls[0] == 1 and sorted(model.calls[1:]) == [2, 4]
    assert max(model.calls) <= 4
    for request, result in zip(rows, results):
        np.testing.assert_allclose(result, estimator.predict_proba(request))


def test_a_request_larger_than_the_batch_runs_alone(iris_model):
    estimator, X = iris_model
    calls: list[int] = []
    batcher = Batcher(max_batch_size=4, max_batch_time_ms=60_000)
    out = batcher.submit(X[:10], lambda x: calls.append(len(x)) or estimator.predict(x))
    assert calls == [10] and len(out) == 10


def test_a_poisoned_member_fails_alone(iris_model):
    estimator, X = iris_model
    model = GatedModel(estimator)
    batcher = Batcher(max_batch_size=16, max_batch_time_ms=60_000)
    bad = X[5:6].copy()
    bad[0, 2] = np.nan  # scikit-learn rejects NaN input
    rows = [X[0:1], X[60:61], bad, X[110:111], X[30:32]]
    results = run_concurrently(batcher, model, rows)
    assert isinstance(results[2], ValueError) and "NaN" in str(results[2])
    for i in (0, 1, 3, 4):
        np.testing.assert_allclose(results[i], estimator.predict_proba(rows[i]))
    assert model.calls[:2] == [1, 5]  # the batch was tried, then each member on its own
    assert sorted(model.calls[2:]) == [1, 1, 1, 2]
    assert batcher.stats.retried == 4


def test_requests_that_arrived_together_run_in_this_thread_by_the_same_rules(iris_model):
    """A model host's loop: what waits is batched now, up to max_batch_size, a broken batch retried."""
    estimator, X = iris_model
    calls: list[int] = []

    def model(x: np.ndarray) -> np.ndarray:
        calls.append(len(x))
        return estimator.predict_proba(x)

    batcher = Batcher(max_batch_size=4, max_batch_time_ms=60_000)
    bad = X[5:6].copy()
    bad[0, 2] = np.nan
    wide = np.hstack([X[0:1], X[0:1]])
    requests_ = [
        (X[0:1], model, ()),
        (X[1:4], model, ()),  # fills the first batch (4 rows)
        (X[4:5], model, ()),
        (X[9:10], model, ("other options",)),  # never shares a call with different options
        (wide, model, ()),  # nor with another trailing shape
        (bad, model, ()),  # breaks its batch: each member is retried alone
        (X[50:55], model, ()),  # more than max_batch_size rows: alone
        (X[7:8], model, None),  # options that cannot be compared: alone
    ]
    members = batcher.run_together(requests_)
    # in order of each batch's first request: [0, 1]; [2, 5] breaks and is retried member by member;
    # [3]; [4] (its own error); [6] and [7] alone
    assert calls == [4, 2, 1, 1, 1, 1, 5, 1]
    assert "features" in str(members[4].error) and "NaN" in str(members[5].error)
    for i in (0, 1, 2, 3, 6, 7):
        assert members[i].error is None
        np.testing.assert_allclose(members[i].result, estimator.predict_proba(requests_[i][0]))
    assert batcher.stats.retried == 2 and batcher.queued_rows() == 0


def test_incompatible_shapes_and_options_never_share_a_batch(iris_model):
    estimator, X = iris_model
    model = GatedModel(estimator)
    batcher = Batcher(max_batch_size=16, max_batch_time_ms=60_000)
    results: dict[str, Any] = {}

    def call(tag: str, x: np.ndarray, options: Any = ()) -> None:
        try:
            results[tag] = batcher.submit(x, model, options)
        except Exception as exc:
            results[tag] = exc

    holder = threading.Thread(target=call, args=("holder", X[:1]))
    holder.start()
    assert model.inside.wait(WAIT)
    threads = [
        threading.Thread(target=call, args=("a", X[1:2])),
        threading.Thread(target=call, args=("b", X[2:4])),
        threading.Thread(target=call, args=("three_features", X[3:4, :3])),
        threading.Thread(target=call, args=("other_options", X[4:5], ("sig", (), b""))),
    ]
    for t in threads:
        t.start()
    wait_until(lambda: batcher.queued_rows() == 5, "requests to queue")
    model.gate.set()
    for t in [holder, *threads]:
        t.join(WAIT)
    assert isinstance(results["three_features"], ValueError)  # sklearn's own message, for this request only
    assert "4 features" in str(results["three_features"])
    for tag, x in [("a", X[1:2]), ("b", X[2:4]), ("other_options", X[4:5])]:
        np.testing.assert_allclose(results[tag], estimator.predict_proba(x))
    assert sorted(model.calls[1:]) == [1, 1, 3]


def test_an_idle_model_never_waits_for_batch_mates(iris_model):
    estimator, X = iris_model
    batcher = Batcher(max_batch_size=32, max_batch_time_ms=10 * 60_000)  # ten minutes
    done = threading.Event()
    threading.Thread(target=lambda: (batcher.submit(X[:1], estimator.predict), done.set()), daemon=True).start()
    assert done.wait(WAIT)  # closed at once because nothing else was running


def test_max_batch_time_closes_a_batch_while_the_model_is_busy(iris_model):
    estimator, X = iris_model
    model = GatedModel(estimator)
    batcher = Batcher(max_batch_size=32, max_batch_time_ms=5)
    holder = threading.Thread(target=batcher.submit, args=(X[:1], model))
    holder.start()
    assert model.inside.wait(WAIT)
    result: list[Any] = []
    waiter = threading.Thread(target=lambda: result.append(batcher.submit(X[1:3], model)))
    waiter.start()
    waiter.join(WAIT)  # its batch closes on the time limit though the model is still busy
    assert not waiter.is_alive() and not model.gate.is_set()
    np.testing.assert_allclose(result[0], estimator.predict_proba(X[1:3]))
    model.gate.set()
    holder.join(WAIT)


def test_unsplittable_outputs_are_recomputed_per_request_and_batching_stops(iris_model):
    estimator, X = iris_model
    model = GatedModel(estimator)
    summed = lambda x: float(model(x).sum())  # one number per call: it has no rows  # noqa: E731
    batcher = Batcher(max_batch_size=16, max_batch_time_ms=60_000)
    rows = [X[0:1], X[1:3], X[3:4], X[4:5]]
    results = run_concurrently(batcher, model, rows, runner=summed)
    assert results == pytest.approx([float(len(r)) for r in rows])  # probabilities sum to 1 per row
    assert batcher.enabled is False
    calls_before = len(model.calls)
    batcher.submit(X[:1], summed)
    assert len(model.calls) == calls_before + 1


# -- through the data plane and a real server --------------------------------------------------

MODEL_PY = '''
"""Doubles its input and reports how many rows each call held; can hold the model busy."""
import time
from pathlib import Path

import numpy as np
import servekit
from servekit.dataplane import batching


@servekit.hookimpl
def load(config):
    return {"marker": Path(config.options["marker_dir"])}


@servekit.hookimpl
def predict(inputs, parameters, model):
    x = np.asarray(inputs, dtype=float)
    wait_for = parameters.get("hold_until_queued")
    if wait_for:
        (model["marker"] / "holding").write_text("1")
        deadline = time.monotonic() + 30
        while batching.queued_rows() < wait_for and time.monotonic() < deadline:
            time.sleep(0.005)
        (model["marker"] / "holding").unlink()
    if (x < 0).any():
        raise ValueError("negative values are not allowed")
    return {"doubled": x * 2, "call_rows": np.full(len(x), len(x))}
'''

STREAMING_MODEL_PY = """
import servekit


@servekit.hookimpl
def load():
    return "streamer"


@servekit.hookimpl
def predict(inputs):
    for row in inputs:
        yield {"row": row.tolist()}
"""


@pytest.fixture(scope="module")
def recorder_dir(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("batching")
    marker = base / "markers"
    marker.mkdir()
    folder = base / "recorder"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(MODEL_PY)
    (folder / "servekit.yaml").write_text(
        f"batching: {{max_batch_size: 32, max_batch_time_ms: 60000}}\noptions: {{marker_dir: '{marker}'}}\n"
    )
    return folder


def test_data_plane_batches_and_skips_streaming_models(servekit_app, recorder_dir, tmp_path):
    dp = servekit_app(recorder_dir).application.extensions["servekit"]
    mv = dp.resolve("recorder")
    assert batching.batcher_for(mv) is not None
    assert dp.predict(mv, np.array([[1.0, 2.0]]))["call_rows"].tolist() == [1]
    with pytest.raises(Exception) as info:
        dp.predict(mv, np.array([[-1.0, 2.0]]))
    assert "negative values" in str(info.value)

    streamer = tmp_path / "streamer"
    streamer.mkdir()
    (streamer / "model.py").write_text(STREAMING_MODEL_PY)
    (streamer / "servekit.yaml").write_text("batching: {max_batch_size: 8}\n")
    sdp = servekit_app(streamer).application.extensions["servekit"]
    smv = sdp.resolve("streamer")
    assert batching.batcher_for(smv) is None
    assert list(sdp.predict(smv, np.array([[1.0], [2.0]]))) == [{"row": [1.0]}, {"row": [2.0]}]


def test_batcher_for_honours_config_and_flags(servekit_app, tmp_path):
    from sklearn_models import fit_iris

    fit_iris(tmp_path / "iris")
    off = servekit_app(tmp_path / "iris").application.extensions["servekit"]
    assert batching.batcher_for(off.resolve("iris")) is None  # off by default
    on = servekit_app(tmp_path / "iris", max_batch_size=16, max_batch_time_ms=3.0).application.extensions["servekit"]
    batcher = batching.batcher_for(on.resolve("iris"))
    assert batcher is not None and batcher.max_batch_size == 16 and batcher.max_wait == pytest.approx(0.003)


def test_a_wrapper_around_predict_does_not_count_as_streaming(servekit_app, tmp_path):
    from sklearn_models import fit_iris

    fit_iris(tmp_path / "iris")
    wrapper = tmp_path / "timing_plugin.py"
    wrapper.write_text(
        "import servekit\n\n\n@servekit.hookimpl(wrapper=True)\ndef predict(inputs):\n"
        "    result = yield\n    return result\n"
    )
    dp = servekit_app(tmp_path / "iris", plugin=[str(wrapper)], max_batch_size=8).application.extensions["servekit"]
    assert batching.batcher_for(dp.resolve("iris")) is not None


@pytest.mark.slow
def test_real_server_batches_concurrent_requests_from_v1_and_generic_routes(servekit_server, recorder_dir):
    server = servekit_server(recorder_dir, threads=16)
    marker = Path(
        next(
            line.split("'")[1]
            for line in (recorder_dir / "servekit.yaml").read_text().splitlines()
            if "marker_dir" in line
        )
    )
    session = requests.Session()
    session.post(server.url + "/v1/models/recorder:predict", json={"instances": [[0.0]]}).raise_for_status()

    def send(rows: list[list[float]], route: str, parameters: dict | None = None) -> requests.Response:
        url = server.url + ("/predict" if route == "generic" else "/v1/models/recorder:predict")
        body: dict[str, Any] = {"instances": rows}
        if parameters:
            body["parameters"] = parameters
        return requests.post(url, json=body, timeout=60)

    def round_trip(payloads: list[list[list[float]]]) -> list[requests.Response]:
        queued = sum(len(p) for p in payloads)
        answers: list[Any] = [None] * len(payloads)
        holder_answer: list[Any] = []
        holder = threading.Thread(
            target=lambda: holder_answer.append(send([[100.0]], "v1", {"hold_until_queued": queued}))
        )
        holder.start()
        wait_until(lambda: (marker / "holding").exists(), "the holder request to reach the model")

        def go(i: int) -> None:
            answers[i] = send(payloads[i], "generic" if i % 2 else "v1")

        threads = [threading.Thread(target=go, args=(i,)) for i in range(len(payloads))]
        for t in threads:
            t.start()
        for t in [holder, *threads]:
            t.join(60)
        assert holder_answer[0].status_code == 200
        return answers

    good = [[[float(i)]] if i % 3 else [[float(i)], [float(i) + 0.5]] for i in range(1, 8)]
    answers = round_trip(good)
    total = sum(len(p) for p in good)
    for payload, answer in zip(good, answers):
        assert answer.status_code == 200, answer.text
        predictions = answer.json()["predictions"]
        assert [p["doubled"] for p in predictions] == [[2 * v[0]] for v in payload]  # its own rows, in order
        assert {p["call_rows"] for p in predictions} == {total}  # all were served by one call

    poisoned = [[[1.0]], [[2.0]], [[-3.0]], [[4.0]]]
    answers = round_trip(poisoned)
    assert answers[2].status_code == 500 and "negative values" in answers[2].json()["error"]
    for i in (0, 1, 3):
        assert answers[i].status_code == 200, answers[i].text
        assert answers[i].json()["predictions"][0]["doubled"] == [2 * poisoned[i][0][0]]
