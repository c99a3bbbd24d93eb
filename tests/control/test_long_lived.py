"""What a serving process loaded is frozen out of the garbage collector's passes (servekit.control.long_lived)."""

from __future__ import annotations

import gc
import re
import time
import weakref

import pytest
import requests
from servekit.control import long_lived
from servekit.dataplane.repository import ModelRepository, discover
from servekit.hooks import manager as plugins
from servekit.testing import ServerProcess
from sklearn_models import ECHO_MODEL, fit_iris
from test_control_plane import worker_pids

SETTLED = re.compile(r"process (\d+): (\d+) long-lived objects left out of the garbage collector's passes")


class Node:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def unfrozen():
    yield
    gc.unfreeze()  # the rest of the suite runs with an ordinary collector


def test_settle_freezes_what_is_alive_and_frees_a_cycle_released_since(unfrozen):
    node = Node()
    ref = weakref.ref(node)
    assert long_lived.settle() > 0 and gc.get_freeze_count() > 0
    del node
    gc.collect()
    assert ref() is not None  # frozen: a full collection passes it by
    long_lived.settle()
    assert ref() is None  # an unloaded model's cycles go at the next settle


def test_the_repository_settles_after_each_plan_that_changes_what_it_serves(tmp_path):
    fit_iris(tmp_path / "iris", 1)
    repo = ModelRepository(discover([tmp_path]), plugins.build_manager(), poll_interval=0)
    changes: list[list[int]] = []
    repo.after_change = lambda: changes.append(sorted(v.version for v in repo.get_model("iris").available()))
    repo.load_now()
    assert changes == [[1]]  # after the load: the model is there to be frozen
    repo.sync()
    assert changes == [[1]]  # the same plan: nothing to collect
    fit_iris(tmp_path / "iris", 2)
    repo.sync()
    assert changes == [[1], [2]]


def settled(server: ServerProcess) -> list[int]:
    """The pids of the processes that settled, once per settle, from the server's log."""
    return [int(m.group(1)) for m in SETTLED.finditer(server.output())]


def wait_for(check, server: ServerProcess, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not settled as expected: {settled(server)}\n{server.output()[-3000:]}")
        time.sleep(0.1)


@pytest.mark.slow
def test_each_worker_settles_after_its_load_and_after_an_unload(tmp_path):
    fit_iris(tmp_path / "iris", 1)
    echo = tmp_path / "echo"
    echo.mkdir()
    (echo / "model.py").write_text(ECHO_MODEL)  # a model.py loads in each worker: no --preload
    with ServerProcess(tmp_path, workers=2, model_control_mode="explicit") as server:
        workers = sorted(worker_pids(server))
        wait_for(lambda: sorted(settled(server)) == workers, server)
        r = requests.post(server.url + "/v2/repository/models/echo/unload", timeout=60)
        assert r.status_code == 200, r.text
        wait_for(lambda: sorted(settled(server)) == sorted(workers * 2), server)


@pytest.mark.slow
def test_preloaded_models_settle_once_in_the_master_before_the_fork(tmp_path):
    fit_iris(tmp_path / "iris", 1)  # scikit-learn only: loaded once, before the fork
    with ServerProcess(tmp_path, workers=2) as server:
        assert settled(server) == [server.proc.pid]
        assert requests.post(
            server.url + "/v1/models/iris:predict", json={"instances": [[5.1, 3.5, 1.4, 0.2]]}, timeout=30
        ).ok


@pytest.mark.slow
def test_a_model_host_settles_after_its_load(tmp_path):
    fit_iris(tmp_path / "iris", 1)
    with ServerProcess(tmp_path, workers=2, placement="process") as server:
        own = {server.proc.pid, *worker_pids(server)}
        wait_for(lambda: any(pid not in own for pid in settled(server)), server)
        r = requests.post(
            server.url + "/v1/models/iris:predict", json={"instances": [[5.1, 3.5, 1.4, 0.2]]}, timeout=30
        )
        assert r.status_code == 200, r.text
