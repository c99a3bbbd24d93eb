"""The response cache through a real two-worker server: shared by the workers, read by tritonclient.

The model answers with the process id of the worker that computed it, so an answer
served from the cache by the other worker still names the first one.
"""

from __future__ import annotations

import http.client
import json
import time
from pathlib import Path

import pytest
import requests
from servekit.testing import ServerProcess

httpclient = pytest.importorskip("tritonclient.http")

pytestmark = pytest.mark.slow

PID_MODEL = """
import os
import numpy as np
import servekit


@servekit.hookimpl
def load(path):
    return "pid"


@servekit.hookimpl
def predict(inputs, parameters):
    x = inputs["x"] if isinstance(inputs, dict) else inputs
    return {"pid": np.array([os.getpid()], dtype=np.int64), "doubled": np.asarray(x, dtype=np.float64) * 2}
"""

TRITON_CONFIG = """
name: "triton_pid"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP64 dims: [ 3 ] } ]
output [ { name: "pid" data_type: TYPE_INT64 dims: [ 1 ] }, { name: "doubled" data_type: TYPE_FP64 dims: [ 3 ] } ]
response_cache { enable: true }
"""


def _folder(base: Path, name: str, yaml_text: str | None = None, pbtxt: str | None = None) -> None:
    (base / name / "1").mkdir(parents=True)
    (base / name / "1" / "model.py").write_text(PID_MODEL)
    if yaml_text is not None:
        (base / name / "servekit.yaml").write_text(yaml_text)
    if pbtxt is not None:
        (base / name / "config.pbtxt").write_text(pbtxt)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("cache")
    _folder(base, "cached", "cache: true\n")
    _folder(base, "uncached")
    _folder(base, "triton_pid", pbtxt=TRITON_CONFIG)
    with ServerProcess(base, workers=2) as server:
        yield server


def _body(values: list[float]) -> str:
    return json.dumps({"inputs": [{"name": "x", "shape": [3], "datatype": "FP64", "data": values}]})


def _post(conn: http.client.HTTPConnection, model: str, values: list[float]) -> bytes:
    conn.request("POST", f"/v2/models/{model}/infer", _body(values), {"Content-Type": "application/json"})
    answer = conn.getresponse()
    raw = answer.read()
    assert answer.status == 200, raw
    return raw


def _pid(raw: bytes) -> int:
    (out,) = [o for o in json.loads(raw)["outputs"] if o["name"] == "pid"]
    return int(out["data"][0])


def _two_workers(server: ServerProcess) -> tuple[http.client.HTTPConnection, http.client.HTTPConnection]:
    """Two kept-alive connections answered by different workers (each sticks to the worker that accepted it)."""
    seen: dict[int, http.client.HTTPConnection] = {}
    for _ in range(64):
        conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
        seen.setdefault(_pid(_post(conn, "uncached", [0.0, 0.0, 0.0])), conn)
        if len(seen) == 2:
            first, second = seen.values()
            return first, second
    pytest.fail("every connection went to one worker")


def _cache_counts(client, model: str) -> tuple[int, int]:
    (entry,) = client.get_inference_statistics(model_name=model)["model_stats"]
    stats = entry["inference_stats"]
    return int(stats["cache_hit"].get("count", 0)), int(stats["cache_miss"].get("count", 0))


def _settled(read, wanted, attempts: int = 60):
    """What ``read()`` gives once it equals ``wanted`` (each worker flushes its counts every half second)."""
    got = read()
    for _ in range(attempts):
        if got == wanted:
            break
        time.sleep(0.1)
        got = read()
    return got


def _entries(server) -> int:
    """The answers the server's response cache holds (its ``/metrics`` gauge)."""
    text = requests.get(server.url + "/metrics", timeout=10).text
    (line,) = [x for x in text.splitlines() if x.startswith("servekit_response_cache_entries ")]
    return int(float(line.split()[1]))


def test_an_answer_computed_by_one_worker_is_a_hit_on_the_other(server):
    first, second = _two_workers(server)
    held = _entries(server)
    computed = _post(first, "cached", [1.0, 2.0, 3.0])
    # the worker's writer thread puts the answer in the shared file just after it answers
    assert _settled(lambda: _entries(server), held + 1) == held + 1
    from_cache = _post(second, "cached", [1.0, 2.0, 3.0])
    assert from_cache == computed  # byte for byte, and named by the worker that computed it
    assert _pid(from_cache) == _pid(computed) != _pid(_post(second, "uncached", [1.0, 2.0, 3.0]))
    other = _post(second, "cached", [1.0, 2.0, 4.0])  # other inputs: computed, by this worker
    assert _pid(other) != _pid(computed)
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    assert _settled(lambda: _cache_counts(client, "cached"), (1, 2)) == (1, 2)
    (entry,) = client.get_inference_statistics(model_name="cached")["model_stats"]
    assert int(entry["execution_count"]) == 2  # a hit runs no model (as Triton counts)
    assert int(entry["inference_stats"]["cache_hit"]["ns"]) > 0
    assert _cache_counts(client, "uncached") == (0, 0)


def test_triton_response_cache_setting_and_tritonclient_statistics(server):
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    x = httpclient.InferInput("x", [3], "FP64")
    import numpy as np

    x.set_data_from_numpy(np.array([5.0, 6.0, 7.0]))
    held = _entries(server)
    answers = [client.infer("triton_pid", [x])]
    assert _settled(lambda: _entries(server), held + 1) == held + 1  # written: a hit on either worker
    answers += [client.infer("triton_pid", [x]) for _ in range(2)]
    assert len({a.as_numpy("pid")[0] for a in answers}) == 1
    assert all((a.as_numpy("doubled") == [10.0, 12.0, 14.0]).all() for a in answers)
    assert _settled(lambda: _cache_counts(client, "triton_pid"), (2, 1)) == (2, 1)
    metrics = requests.get(server.url + "/metrics", timeout=10).text
    assert 'servekit_inference_phase_count_total{kind="cache_hit",model="triton_pid",version="1"} 2.0' in metrics
