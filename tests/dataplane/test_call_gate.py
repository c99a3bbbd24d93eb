"""How many calls of a model run at once in a process, first come first served (servekit.dataplane.call_gate)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import requests
from servekit.dataplane import call_gate
from servekit.folders.servekit_yaml import ConfigError, parse_model_config
from servekit.testing import ServerProcess
from servekit.types import ModelConfig
from sklearn_models import fit_iris

#: a model.py that sleeps in predict and answers the most calls it saw inside at once
BUSY_MODEL = """
import threading
import time

import numpy as np
import servekit

lock = threading.Lock()
inside = [0, 0]  # now, most


@servekit.hookimpl
def load(path):
    return "busy"


@servekit.hookimpl
def predict(inputs, parameters):
    with lock:
        inside[0] += 1
        inside[1] = max(inside[1], inside[0])
    time.sleep(0.2)
    with lock:
        inside[0] -= 1
        return np.array([inside[1]])
"""


@pytest.mark.parametrize("places", [1, 2])
def test_a_gate_lets_in_its_places_then_each_waiting_call_in_arrival_order(places):
    gate = call_gate.Gate(places)
    inside, order, most = [0], [], [0]
    lock = threading.Lock()
    hold = threading.Event()

    def call(i: int) -> None:
        with gate:
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
                order.append(i)
            hold.wait(5)
            with lock:
                inside[0] -= 1

    threads = []
    for i in range(6):
        thread = threading.Thread(target=call, args=(i,))
        thread.start()
        threads.append(thread)
        deadline = time.monotonic() + 5  # each arrives after the one before is in or waiting
        while len(order) + len(gate.waiting) < i + 1 and time.monotonic() < deadline:
            time.sleep(0.001)
    assert order == list(range(places)) and len(gate.waiting) == 6 - places
    hold.set()
    for thread in threads:
        thread.join(5)
    # one place: each waiting call comes in only when the one before has left, so in arrival order
    assert (order if places == 1 else sorted(order)) == [0, 1, 2, 3, 4, 5]
    assert most[0] == places and gate.free == places and not gate.waiting


def test_a_failing_call_gives_its_place_to_the_next():
    gate = call_gate.Gate(1)
    with pytest.raises(RuntimeError), gate:
        raise RuntimeError("the model failed")
    assert gate.free == 1


def version(loaded_by: str, concurrency: int | None = None) -> SimpleNamespace:
    return SimpleNamespace(config=ModelConfig(concurrency=concurrency), loaded_by=loaded_by, gate=None)


def test_framework_models_get_the_default_places_and_model_py_and_pipelines_none():
    assert call_gate.places_of(version("sklearn")) == call_gate.DEFAULT
    assert call_gate.places_of(version("model.py:/models/echo/model.py")) == 0
    assert call_gate.places_of(version("pipeline")) == 0
    assert call_gate.places_of(version("sklearn", concurrency=0)) == 0
    assert call_gate.places_of(version("model.py:/m/model.py", concurrency=3)) == 3
    mv = version("sklearn")
    assert isinstance(call_gate.turn(mv), call_gate.Gate) and call_gate.turn(mv) is mv.gate
    assert not isinstance(call_gate.turn(version("pipeline")), call_gate.Gate)


def test_concurrency_is_read_from_servekit_yaml(tmp_path):
    assert parse_model_config({"concurrency": 1}, tmp_path).concurrency == 1
    assert parse_model_config({}, tmp_path).concurrency is None
    for wrong in (-1, "two", True, 2000):
        with pytest.raises(ConfigError, match="'concurrency'"):
            parse_model_config({"concurrency": wrong}, tmp_path)


def most_inside(url: str, calls: int = 4) -> int:
    body = {"instances": [[1.0]]}

    def one(_: int) -> int:
        r = requests.post(url, json=body, timeout=30)
        assert r.status_code == 200, r.text
        return int(r.json()["predictions"][0])

    with ThreadPoolExecutor(calls) as pool:
        return max(pool.map(one, range(calls)))


@pytest.mark.slow
def test_a_model_runs_at_most_its_concurrency_at_once_in_a_worker(tmp_path):
    for name, settings in (("gated", "concurrency: 1\n"), ("free", "")):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "model.py").write_text(BUSY_MODEL)
        (folder / "servekit.yaml").write_text(settings or "{}\n")
    fit_iris(tmp_path / "iris", 1)
    with ServerProcess(tmp_path, workers=1, threads=8) as server:
        assert most_inside(server.url + "/v1/models/gated:predict") == 1
        assert most_inside(server.url + "/v1/models/free:predict") > 1  # a model.py runs unbounded
        r = requests.post(
            server.url + "/v1/models/iris:predict", json={"instances": [[5.1, 3.5, 1.4, 0.2]]}, timeout=30
        )
        assert r.status_code == 200, r.text
