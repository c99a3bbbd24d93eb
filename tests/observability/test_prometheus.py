"""Prometheus for real: the alert rules through promtool, and a Prometheus scraping a two-worker servekit.

Debian's ``prometheus`` package brings both binaries (scripts/test.sh installs it when
missing and run as root); without them these tests skip with the reason.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests
from prometheus_server import Prometheus, binary
from repo_paths import REPO as ROOT
from servekit.testing import ServerProcess

TEMPLATES = ROOT / "framework" / "servekit" / "scaffold" / "templates" / "templates"
ALERTS = TEMPLATES / "prometheus-alerts.yaml"
DASHBOARD = TEMPLATES / "grafana-dashboard.json"


def test_alert_rules_pass_promtool_check():
    result = subprocess.run([binary("promtool"), "check", "rules", str(ALERTS)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 4 rules found" in result.stdout


def _series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def test_alert_rules_fire_when_they_should_and_only_then(tmp_path):
    job = {"job": "servekit", "instance": "a:8080"}
    bad, good = {**job, "model": "bad"}, {**job, "model": "good"}
    series = [
        # 'bad': 20% of its answers are 500s, its p99 is 2 s, it has no AVAILABLE version
        _series("servekit_requests_total", {**bad, "protocol": "v2", "status": "200"}, "0+80x30"),
        _series("servekit_requests_total", {**bad, "protocol": "v2", "status": "500"}, "0+20x30"),
        *[
            _series("servekit_request_duration_seconds_bucket", {**bad, "protocol": "v2", "status": "200", "le": le}, v)
            for le, v in (("0.5", "0x30"), ("1.0", "0x30"), ("2.5", "0+80x30"), ("+Inf", "0+80x30"))
        ],
        _series("servekit_model_state", {**bad, "version": "1", "state": "AVAILABLE"}, "0x30"),
        _series("servekit_model_state", {**bad, "version": "1", "state": "END"}, "1x30"),
        # 'good': all 200s within 10 ms, AVAILABLE
        _series("servekit_requests_total", {**good, "protocol": "v1", "status": "200"}, "0+100x30"),
        *[
            _series(
                "servekit_request_duration_seconds_bucket", {**good, "protocol": "v1", "status": "200", "le": le}, v
            )
            for le, v in (("0.01", "0+100x30"), ("2.5", "0+100x30"), ("+Inf", "0+100x30"))
        ],
        _series("servekit_model_state", {**good, "version": "1", "state": "AVAILABLE"}, "1x30"),
        _series("servekit_requests_in_flight", job, "100x30"),  # deep: 100 waiting
        _series("servekit_host_queue_depth", {**good, "version": "1", "replica": "0"}, "3x30"),  # shallow
    ]
    alert = {"severity": "page"}
    tests = {
        "rule_files": [str(ALERTS)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {
                        "eval_time": "20m",
                        "alertname": "ServekitHigh5xxRatio",
                        "exp_alerts": [
                            {
                                "exp_labels": {**alert, "job": "servekit", "model": "bad"},
                                "exp_annotations": ANNOTATIONS["5xx"],
                            }
                        ],
                    },
                    {
                        "eval_time": "20m",
                        "alertname": "ServekitHighP99Latency",
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "warn", "job": "servekit", "model": "bad"},
                                "exp_annotations": ANNOTATIONS["p99"],
                            }
                        ],
                    },
                    {
                        "eval_time": "20m",
                        "alertname": "ServekitQueueDeep",
                        "exp_alerts": [
                            {"exp_labels": {"severity": "warn", **job}, "exp_annotations": ANNOTATIONS["queue"]}
                        ],
                    },
                    {
                        "eval_time": "20m",
                        "alertname": "ServekitModelNotReady",
                        "exp_alerts": [{"exp_labels": {**alert, **bad}, "exp_annotations": ANNOTATIONS["ready"]}],
                    },
                    # before `for:` has passed, nothing fires
                    {"eval_time": "3m", "alertname": "ServekitHigh5xxRatio", "exp_alerts": []},
                    {"eval_time": "3m", "alertname": "ServekitModelNotReady", "exp_alerts": []},
                ],
            }
        ],
    }
    spec = tmp_path / "alerts_test.yaml"
    spec.write_text(json.dumps(tests))  # JSON is YAML
    result = subprocess.run([binary("promtool"), "test", "rules", str(spec)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


ANNOTATIONS = {
    "5xx": {
        "summary": "servekit servekit: 20% of requests to model 'bad' fail with 5xx",
        "description": "More than 5% of the answers over 5 minutes were server errors (model failures, timeouts, 503 while loading).",
    },
    "p99": {
        "summary": "servekit servekit: p99 latency of model 'bad' is 2.485s",
        "description": "The 99th percentile of inference requests stayed above 1 s for 10 minutes.",
    },
    "queue": {
        "summary": "servekit servekit: 100 requests waiting",
        "description": "Requests pile up faster than the server answers them: add replicas or workers, or enable batching.",
    },
    "ready": {
        "summary": "servekit a:8080: model 'bad' has no AVAILABLE version",
        "description": "No version of the model is serving (a failed load, or unloaded). Read its state on the status page or /v2/repository/index.",
    },
}


SLOW_MODEL = """
import time

import numpy as np
import servekit


@servekit.hookimpl
def load(path):
    return "sleeper"


@servekit.hookimpl
def predict(inputs, parameters):
    time.sleep(0.02)  # every answer takes 20 ms: the latency quantiles have a known place
    return np.asarray(inputs) * 2
"""


def test_grafana_dashboard_queries_only_servekit_series():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "servekit"
    names = {v["name"] for v in dashboard["templating"]["list"]}
    assert names == {"datasource", "job", "model"}
    titles = [p["title"] for p in dashboard["panels"]]
    assert len(titles) == len(set(titles)) >= 6
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
        for target in panel["targets"]:
            assert "servekit_" in target["expr"], (panel["title"], target["expr"])


def _prometheus_config(folder: Path, target: str, interval: str = "1s") -> Path:
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [{"job_name": "servekit", "static_configs": [{"targets": [target]}]}],
    }
    path = folder / "prometheus.yml"
    path.write_text(json.dumps(config))
    return path


def _paced_load(url: str, rate: float, seconds: float, latencies: list[float]) -> None:
    """``rate`` requests a second for ``seconds``, each on time (a request late in the schedule is sent at once)."""
    body = {"instances": [[1.0, 2.0]]}
    start = time.monotonic()
    n = 0
    with requests.Session() as session:
        while (due := start + n / rate) < start + seconds:
            time.sleep(max(0.0, due - time.monotonic()))
            began = time.perf_counter()
            r = session.post(url + "/v1/models/sleeper:predict", json=body, timeout=10)
            latencies.append(time.perf_counter() - began)
            assert r.status_code == 200, r.text
            n += 1


@pytest.mark.slow
def test_prometheus_scrapes_a_two_worker_server_and_sees_the_load_sent(tmp_path):
    binary("prometheus")
    repo = tmp_path / "models"
    (repo / "sleeper").mkdir(parents=True)
    (repo / "sleeper" / "model.py").write_text(SLOW_MODEL)
    with ServerProcess(repo, workers=2, threads=8) as server:
        prometheus = Prometheus(tmp_path, _prometheus_config(tmp_path, f"127.0.0.1:{server.http_port}"))
        try:
            rate, seconds, clients = 15.0, 20.0, 2  # 30 req/s in all, each answer 20 ms
            latencies: list[float] = []
            load = [
                threading.Thread(target=_paced_load, args=(server.url, rate, seconds, latencies))
                for _ in range(clients)
            ]
            for t in load:
                t.start()
            time.sleep(seconds - 3)
            at = time.time()  # 10 s windows well inside the load
            for t in load:
                t.join()
            time.sleep(2)  # a scrape after the window
            sent = rate * clients
            got = prometheus.query('sum(rate(servekit_requests_total{model="sleeper",protocol="v1"}[10s]))', at)
            measured = float(got[0]["value"][1])
            quantiles = {
                q: float(
                    prometheus.query(
                        f"histogram_quantile({q}, sum by (le) "
                        f'(rate(servekit_request_duration_seconds_bucket{{model="sleeper"}}[10s])))',
                        at,
                    )[0]["value"][1]
                )
                for q in (0.5, 0.99)
            }
            latencies.sort()
            client_p50 = latencies[len(latencies) // 2]
            print(
                f"\nsent {sent:.0f} req/s, Prometheus rate() {measured:.1f}; p50 {quantiles[0.5] * 1000:.1f} ms "
                f"(the client saw {client_p50 * 1000:.1f} ms), p99 {quantiles[0.99] * 1000:.1f} ms"
            )
            assert 0.7 * sent < measured < 1.3 * sent
            # every answer sleeps 20 ms: the median lies in the (10, 25] ms bucket, under what the client saw
            assert 0.010 < quantiles[0.5] <= 0.025 and quantiles[0.5] <= client_p50 + 0.005
            assert quantiles[0.5] <= quantiles[0.99] < 1.0
            # the memory of the whole server (two workers and the master), not of the answering worker alone
            resident = float(prometheus.query("servekit_resident_bytes", at)[0]["value"][1])
            assert resident > 3 * 30e6
            assert (
                float(prometheus.query('sum(servekit_model_state{model="sleeper",state="AVAILABLE"})')[0]["value"][1])
                == 1
            )
            # every query the dashboard makes is valid PromQL on the live data
            for panel in json.loads(DASHBOARD.read_text())["panels"]:
                for target in panel["targets"]:
                    expr = (
                        target["expr"]
                        .replace("$__rate_interval", "10s")
                        .replace('=~"$job"', '=~".*"')
                        .replace('=~"$model"', '=~".*"')
                    )
                    prometheus.query(expr, at)
            # the alert rules loaded and evaluate cleanly, none firing on a healthy server
            groups = requests.get(prometheus.url + "/api/v1/rules", timeout=10).json()["data"]["groups"]
            rules = {r["name"]: r for g in groups for r in g["rules"]}
            assert set(rules) == {
                "ServekitHigh5xxRatio",
                "ServekitHighP99Latency",
                "ServekitQueueDeep",
                "ServekitModelNotReady",
            }
            assert all(r["health"] == "ok" and r["state"] == "inactive" for r in rules.values()), rules
        finally:
            prometheus.stop()
