"""The load signal: requests waiting for and running in each model, summed over workers and model hosts."""

from __future__ import annotations

import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
from servekit.dataplane.batching import Batcher
from servekit.observability import load
from servekit.testing import ServerProcess
from test_metrics import samples

#: A model whose every call takes 0.2 s, however many rows: requests queue behind a call.
SLOW_BATCHED = """
import time

import numpy as np

import servekit


@servekit.hookimpl
def load(path):
    return "slow"


@servekit.hookimpl
def predict(inputs):
    time.sleep(0.2)
    return np.asarray(inputs, dtype=float) * 2
"""

CLIENTS = 24
BATCH = 4
THREADS = 8  # per worker; gunicorn holds the other 8 clients' requests
INFLIGHT = 4  # per worker (--max-inflight): the other 4 wait for a slot


def slow_repo(folder, placement: str):
    version = folder / "slow" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(SLOW_BATCHED)
    (folder / "slow" / "servekit.yaml").write_text(
        textwrap.dedent(
            f"""\
            placement: {placement}
            batching: {{max_batch_size: 32, max_batch_time_ms: 100}}
            """
        )
    )
    return folder


# -- in one process ------------------------------------------------------------------


def test_a_batch_moves_its_requests_from_waiting_to_running_and_back():
    name = "unit-batched"
    calls = []
    started = threading.Event()
    release = threading.Event()

    def run(batch):
        calls.append(len(batch))
        started.set()
        release.wait(10)
        return batch * 2

    batcher = Batcher(8, 20_000, name=name)  # the five fit in one batch, which waits for the call

    def client(i):
        load.arrived(name)
        try:
            return batcher.submit(np.array([[float(i)]]), run)
        finally:
            load.left(name)

    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(client, 0)]
        assert started.wait(10)
        futures += [pool.submit(client, i) for i in range(1, 6)]
        deadline = time.monotonic() + 10
        while load.counts()[name] != (5, 1) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert load.counts()[name] == (5, 1)  # one call runs one request; five wait for it
        release.set()
        answers = [f.result(10) for f in futures]
    assert [a.tolist() for a in answers] == [[[2.0 * i]] for i in range(6)]
    assert load.counts()[name] == (0, 0)
    assert calls == [1, 5]  # the five that waited went in together


def test_a_model_call_that_raises_still_gives_its_requests_back():
    name = "unit-raises"
    batcher = Batcher(BATCH, 1, name=name)

    def run(batch):
        raise ValueError("broken")

    load.arrived(name)
    with pytest.raises(ValueError):
        batcher.submit(np.array([[1.0]]), run)
    load.left(name)
    assert load.counts()[name] == (0, 0)


def test_queue_time_is_observed_from_arrival_to_the_call():
    name = "unit-queue"
    arrival = time.monotonic() - 0.3
    with load.running(name, [arrival, arrival]):
        assert load.counts()[name] == (-2, 2)  # a host's view: the worker holds the +2 waiting
    load.flush()
    from prometheus_client import REGISTRY

    count = REGISTRY.get_sample_value(load.QUEUE + "_count", {"model": name})
    total = REGISTRY.get_sample_value(load.QUEUE + "_sum", {"model": name})
    assert count == 2 and total is not None and 0.6 <= total < 2.0
    fast = REGISTRY.get_sample_value(load.QUEUE + "_bucket", {"model": name, "le": "0.25"})
    assert fast == 0


# -- a real server ------------------------------------------------------------------------


def _scrape(url: str) -> tuple[float, float, float]:
    text = requests.get(url + "/metrics", timeout=10).text
    return (
        samples(text, load.WAITING, model="slow"),
        samples(text, load.RUNNING, model="slow"),
        samples(text, load.CONCURRENCY),
    )


def _queue_under_load(server: ServerProcess) -> tuple[list[tuple[float, float, float]], list[int]]:
    """Scrapes taken while CLIENTS clients keep the slow model busy, and every answer's status."""
    stop = threading.Event()
    statuses: list[int] = []

    def client():
        with requests.Session() as http:
            while not stop.is_set():
                r = http.post(server.url + "/v1/models/slow:predict", json={"instances": [[1.0]]}, timeout=60)
                statuses.append(r.status_code)

    scrapes = []
    with ThreadPoolExecutor(CLIENTS) as pool:
        for _ in range(CLIENTS):
            pool.submit(client)
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            scrapes.append(_scrape(server.url))
            time.sleep(0.1)
        stop.set()
    return scrapes, statuses


def _settled(server: ServerProcess) -> tuple[float, float, float]:
    """The gauges once every process has flushed (each does so every half second)."""
    last = _scrape(server.url)
    for _ in range(50):
        if last == (0, 0, 0):
            break
        time.sleep(0.1)
        last = _scrape(server.url)
    return last


@pytest.mark.slow
# each process flushes its gauges every half second: on a loaded machine the flushes lag, and a
# scrape can see a request both waiting (one process's old flush) and running (another's new one)
@pytest.mark.alone
@pytest.mark.parametrize("placement", ["worker", "process"])
def test_the_gauges_rise_under_a_load_that_queues_and_fall_back_to_zero(tmp_path, placement):
    with ServerProcess(
        slow_repo(tmp_path, placement), workers=2, threads=THREADS, max_inflight=INFLIGHT, max_queue=64
    ) as server:
        assert _scrape(server.url) == (0, 0, 0)
        scrapes, statuses = _queue_under_load(server)
        assert statuses and set(statuses) == {200}
        busy = scrapes[len(scrapes) // 3 :]  # once every client is in
        assert max(w for w, _, _ in busy) >= 2, scrapes  # requests wait behind the model's calls
        assert max(r for _, r, _ in busy) >= 2, scrapes  # and run together in a batch
        slots = 2 * INFLIGHT
        assert all(w >= 0 and r >= 0 and w + r <= slots for w, r, _ in busy), scrapes  # nothing counted twice
        assert all(c <= 2 * THREADS for _, _, c in scrapes), scrapes
        assert max(c for _, _, c in busy) > slots, scrapes  # requests waiting for a slot count too
        assert _settled(server) == (0, 0, 0)
        for _ in range(50):
            text = requests.get(server.url + "/metrics", timeout=10).text
            answered = samples(text, "servekit_requests_total", model="slow", status="200")
            queued = samples(text, load.QUEUE + "_count", model="slow")
            if queued == answered == len(statuses):
                break
            time.sleep(0.1)
        assert queued == answered == len(statuses)  # every request's queue time, in a worker or its host
        assert samples(text, load.QUEUE + "_bucket", model="slow", le="0.05") < queued  # some waited a call out
