"""The status page's live charts: /metrics/summary, and the page in headless Chromium under load."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import requests
from chromium_cdp import Browser
from repo_paths import REPO as ROOT
from sklearn_models import fit_iris

ARTIFACTS = Path(os.environ.get("SERVEKIT_TEST_ARTIFACTS", ROOT / "test-artifacts"))
ROW = {"instances": [[5.1, 3.5, 1.4, 0.2]]}


@pytest.fixture(scope="module")
def iris_repo(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("live")
    fit_iris(base / "iris")
    return base


def test_summary_counts_requests_statuses_and_latency_per_model(servekit_app, iris_repo):
    client = servekit_app(iris_repo)
    before = client.get("/metrics/summary").get_json()
    for _ in range(3):
        assert client.post("/v1/models/iris:predict", json=ROW).status_code == 200
    assert client.post("/v1/models/iris:predict", data=b"{not json").status_code == 400
    after = client.get("/metrics/summary").get_json()
    iris, was = after["models"]["iris"], before["models"]["iris"]
    assert iris["ready"] is True
    assert iris["requests"] - was["requests"] == 4
    assert iris["statuses"]["200"] - was["statuses"].get("200", 0) == 3
    assert iris["statuses"]["400"] - was["statuses"].get("400", 0) == 1
    # cumulative buckets, the last one +Inf counting every request
    assert after["latency_bounds"][-1] == "+Inf" and len(iris["latency"]) == len(after["latency_bounds"])
    assert iris["latency"][-1] - was["latency"][-1] == 4
    assert iris["latency"] == sorted(iris["latency"])
    assert iris["batch"][1] - was["batch"][1] == 3  # three calls of predict, one row each
    assert after["server"]["requests"] - before["server"]["requests"] >= 5  # the first summary too
    assert after["server"]["resident_bytes"] > 10_000_000
    assert after["time"] > before["time"]


def test_the_page_has_the_charts_and_no_outside_address(servekit_app, iris_repo):
    client = servekit_app(iris_repo)
    page = client.get("/", headers={"Accept": "text/html"}).get_data(as_text=True)
    for chart in ("rps", "latency", "errors", "queue", "batch", "memory"):
        assert f'data-chart="{chart}"' in page
    assert 'fetch("metrics/summary"' in page
    assert "http://" not in page and "https://" not in page  # nothing from a CDN: works air-gapped


def _load(url: str, stop: threading.Event, sent: list[float]) -> None:
    """Requests until ``stop``; ``sent`` gets the time each answer came."""
    with requests.Session() as session:
        while not stop.is_set():
            r = session.post(url + "/v1/models/iris:predict", json=ROW, timeout=10)
            sent.append(time.time())
            assert r.status_code == 200
            if len(sent) % 10 == 0:  # a client error now and then: the errors chart
                session.post(url + "/v1/models/iris:predict", data=b"{not json", timeout=10)
                sent.append(time.time())
            time.sleep(0.005)


@pytest.mark.slow
def test_status_page_charts_live_numbers_in_headless_chromium(iris_repo, tmp_path):
    from servekit.testing import ServerProcess

    with ServerProcess(iris_repo, workers=2, threads=4) as server:
        errors_seen: dict = {}
        stop, sent = threading.Event(), []
        loaders = [threading.Thread(target=_load, args=(server.url, stop, sent)) for _ in range(2)]
        for t in loaders:
            t.start()
        try:
            with Browser(tmp_path / "profile", server.url + "/?every=0.5") as browser:
                deadline = time.monotonic() + 60
                points = 0
                while time.monotonic() < deadline and points < 8:
                    time.sleep(0.5)
                    points = browser.evaluate("(window.servekitLive?.points.server || []).length") or 0
                assert points >= 8, "the page did not chart the server's readings"
                latest = browser.evaluate("window.servekitLive.latest")
                charted = browser.evaluate("window.servekitLive.points.server.map(p => [p.t, p.rps])")
                shown = browser.evaluate(
                    "Object.fromEntries([...document.querySelectorAll('output[data-metric]')]"
                    ".map(o => [o.dataset.metric, o.textContent]))"
                )
                row = browser.evaluate(
                    "Object.fromEntries([...document.querySelectorAll('#live tr[data-scope=\"iris\"] td.num')]"
                    ".map(td => [td.classList[1], td.textContent]))"
                )
                errors_seen = browser.evaluate(
                    "Object.assign({}, ...window.servekitLive.points.server.map(p => p.errors))"
                )
                ARTIFACTS.mkdir(parents=True, exist_ok=True)
                shot = browser.screenshot(ARTIFACTS / "status_page_live.png")
        finally:
            stop.set()
            for t in loaders:
                t.join()
    # the page's readings against the answers the load got over the same seconds (the server and
    # this test share the clock); the server also counts the page's own polls
    first, last = charted[1][0], charted[-1][0]
    sent_rate = sum(first <= t <= last for t in sent) / (last - first)
    page_rate = sum(rps for _, rps in charted[2:]) / len(charted[2:])
    server, iris = latest["server"], latest["iris"]
    print(f"\nsent {sent_rate:.0f} req/s; the page charted {page_rate:.0f} req/s; shown {shown}, iris {row}")
    assert 0.6 * sent_rate < page_rate < 1.6 * sent_rate + 5
    assert iris["rps"] > 0 and server["rps"] >= iris["rps"]
    assert 0 < iris["p50"] <= iris["p99"] < 5000
    assert "400" in errors_seen  # the bad bodies, charted by status
    assert float(shown["rps"]) > 0 and float(row["rps"]) > 0 and float(row["p99"]) > 0
    assert server["memory"] > 50  # MB: two workers and the master
    assert iris["batch"] == pytest.approx(1.0)  # one row per call, no batching
    assert shot.startswith(b"\x89PNG") and len(shot) > 20_000
