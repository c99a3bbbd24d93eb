"""Canary splits and shadow traffic on a real server: weights, sticky clients, the request log, reloads."""

from __future__ import annotations

import time

import pytest
import requests
from servekit.testing import ServerProcess

pytestmark = pytest.mark.slow

#: answers its input times FACTOR (each version folder writes its own)
SCALING_MODEL = """
import servekit


@servekit.hookimpl
def load(path):
    return FACTOR


@servekit.hookimpl
def predict(model, inputs):
    return inputs * model
"""

SPLIT = "version_policy: all\ntraffic:\n  weights: {1: 50, 2: 50}\n  sticky: x-user\n"
SHADOWED = (
    "version_policy: all\nlabels: {stable: 1}\ntraffic:\n  weights: {1: 1}\nshadow:\n  target: 2\n  fraction: 1.0\n"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("models")
    for name, settings in (("split", SPLIT), ("shadowed", SHADOWED)):
        for version in (1, 2):
            folder = base / name / str(version)
            folder.mkdir(parents=True)
            (folder / "model.py").write_text(SCALING_MODEL.replace("FACTOR", str(version * 10)))
        (base / name / "servekit.yaml").write_text(settings)
    with ServerProcess(base, workers=1, threads=8, request_log_url="sqlite") as running:
        running.base = base
        yield running


def infer(server: ServerProcess, model: str, value: float = 1.0, **headers: str) -> requests.Response:
    body = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [value]}]}
    r = requests.post(f"{server.url}/v2/models/{model}/infer", json=body, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    return r


def wait_until(condition) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, "the server never got there"
        time.sleep(0.1)


def test_a_split_sends_a_sticky_client_to_one_version_and_counts_each_version_on_metrics(server):
    for user in ("ada", "grace", "edsger", "barbara"):
        versions = {infer(server, "split", **{"X-User": user}).json()["model_version"] for _ in range(5)}
        assert len(versions) == 1, f"{user} moved between versions {versions}"
    seen = {infer(server, "split", **{"X-User": f"user-{i}"}).json()["model_version"] for i in range(40)}
    assert seen == {"1", "2"}
    answered = infer(server, "split", **{"X-User": "ada"}).json()
    assert answered["outputs"][0]["data"] == [10.0 * int(answered["model_version"])]
    text = requests.get(server.url + "/metrics", timeout=30).text
    counts = {
        target: sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("servekit_traffic_requests_total{")
            and f'target="{target}"' in line
            and 'model="split"' in line
        )
        for target in ("1", "2")
    }
    assert counts["1"] + counts["2"] == 4 * 5 + 40 + 1 and min(counts.values()) > 0
    assert 'servekit_traffic_duration_seconds_count{model="split",target="2"}' in text
    # a request that names its version is not split
    assert (
        requests.post(
            f"{server.url}/v2/models/split/versions/1/infer",
            json={"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]},
            timeout=30,
        ).json()["model_version"]
        == "1"
    )


def test_with_shadow_at_100_percent_every_shadow_answer_is_in_the_request_log_beside_the_served_one(server):
    served = []
    for i in range(20):
        r = infer(server, "shadowed", value=float(i))
        assert r.json()["model_version"] == "1" and r.json()["outputs"][0]["data"] == [10.0 * i]  # never the shadow's
        served.append(r.headers["X-Request-Log-Id"])

    def shadows() -> list[dict]:
        r = requests.get(
            f"{server.url}/v1/logs/requests", params={"model": "shadowed", "version": "2", "limit": 100}, timeout=30
        )
        return [record for record in r.json()["requests"] if record["protocol"] == "shadow"]

    wait_until(lambda: len(shadows()) >= 20)
    found = {record["requestId"]: record["response"] for record in shadows()}
    assert set(served) <= set(found)
    for i, rid in enumerate(served):
        logged = found[rid]
        assert logged["shadow_of"] == rid
        assert logged["served"]["output_0"] == [[10.0 * i]] and logged["shadow"]["output_0"] == [[20.0 * i]]
        assert logged["difference"] == pytest.approx(10.0 * i)


def test_a_changed_split_takes_effect_without_a_restart_and_a_bad_one_is_named_while_serving_goes_on(server):
    settings = server.base / "split" / "servekit.yaml"
    settings.write_text("version_policy: all\ntraffic:\n  weights: {2: 1}\n")
    wait_until(lambda: all(infer(server, "split").json()["model_version"] == "2" for _ in range(10)))
    settings.write_text("version_policy: all\ntraffic:\n  weights: {2: -5}\n")

    def named() -> bool:  # the reload fails, in the server's log, and the loaded version keeps serving
        with open(server.log.name, encoding="utf-8", errors="replace") as log:
            return "'traffic.weights.2' must be a number from 0, found -5" in log.read()

    wait_until(named)
    assert infer(server, "split").status_code == 200
