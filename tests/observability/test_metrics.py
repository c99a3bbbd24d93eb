"""Observability: metrics over 2 workers add up, request ids in JSON logs, the request/prediction log."""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import servekit
from hardening_models import hardening_repo
from servekit.testing import ServerProcess
from servekit.types import RequestLog

LINEAR = {"instances": [[1, 2]]}
_SAMPLE = re.compile(r"^(?P<name>[a-z_]+)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")


def settled(server, done, attempts: int = 50) -> str:
    """``/metrics`` once ``done(text)`` holds: each worker flushes its counts every half second (at most ~5 s)."""
    text = ""
    for _ in range(attempts):
        text = requests.get(server.url + "/metrics").text
        if done(text):
            break
        time.sleep(0.1)
    return text


def samples(text: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or m["name"] != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', m["labels"] or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(m["value"])
    return total


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return hardening_repo(tmp_path_factory.mktemp("metrics"))


@pytest.fixture(scope="module")
def server(repo):
    with ServerProcess(repo, workers=2, threads=4, log_format="json", access_log=True, request_log_url="sqlite") as s:
        yield s


@pytest.mark.slow
def test_metrics_scraped_during_a_load_run_add_up_to_the_requests_sent(server):
    good, bad = 600, 150
    jobs = [LINEAR] * good + [{"instances": [[1, 2, 3]]}] * bad  # the bad ones are 400s
    scrapes: list[tuple[float, float]] = []
    done = threading.Event()

    def scrape():
        with requests.Session() as http:
            while not done.is_set():
                text = http.get(server.url + "/metrics").text
                scrapes.append(
                    (
                        samples(text, "servekit_requests_total", model="linear", protocol="v1"),
                        samples(text, "servekit_requests_in_flight"),
                    )
                )
                time.sleep(0.05)

    def send(chunk):
        statuses = Counter()
        with requests.Session() as http:
            for body in chunk:
                statuses[http.post(server.url + "/v1/models/linear:predict", json=body).status_code] += 1
        return statuses

    with ThreadPoolExecutor(5) as pool:
        scraper = pool.submit(scrape)
        sent = sum((f.result() for f in [pool.submit(send, jobs[i::4]) for i in range(4)]), Counter())
        done.set()
        scraper.result()

    # each worker flushes its tally into the shared values every half second (and before its own
    # scrapes); a scrape that reads another worker's files while it flushes may see its counter
    # written and its histogram not yet, so both are waited for
    text = settled(
        server,
        lambda t: (
            samples(t, "servekit_requests_total", model="linear", protocol="v1") == good + bad
            and samples(t, "servekit_request_duration_seconds_count", model="linear", protocol="v1") == good + bad
            and samples(t, "servekit_requests_in_flight") == 1
        ),
    )
    counted_ok = samples(text, "servekit_requests_total", model="linear", protocol="v1", status="200")
    counted_bad = samples(text, "servekit_requests_total", model="linear", protocol="v1", status="400")
    histogram = samples(text, "servekit_request_duration_seconds_count", model="linear", protocol="v1")
    batches = samples(text, "servekit_batch_size_count", model="linear")
    in_flight = samples(text, "servekit_requests_in_flight")
    print(
        f"\nload run: sent {dict(sent)}; counted 200: {counted_ok:.0f}, 400: {counted_bad:.0f}, "
        f"latency observations {histogram:.0f}, model calls {batches:.0f}; {len(scrapes)} scrapes during the "
        f"run, in flight at the end {in_flight:.0f}"
    )
    assert sent == {200: good, 400: bad}
    assert counted_ok == good and counted_bad == bad
    assert histogram == good + bad
    assert batches == good  # the 400s never reached the model
    assert in_flight == 1  # the scrape itself
    totals = [t for t, _ in scrapes]
    assert totals == sorted(totals) and totals[-1] <= good + bad  # never ahead, never backwards
    assert samples(text, "servekit_model_state", model="linear", version="1", state="AVAILABLE") == 1
    assert samples(text, "servekit_model_load_seconds", model="linear", version="1") > 0


@pytest.mark.slow
def test_unknown_model_names_do_not_become_label_values(server):
    for i in range(5):
        assert requests.get(f"{server.url}/v1/models/nope-{i}").status_code == 404
    text = settled(server, lambda t: samples(t, "servekit_requests_total", model="", protocol="v1", status="404") >= 5)
    assert "nope-" not in text
    assert samples(text, "servekit_requests_total", model="", protocol="v1", status="404") >= 5


def test_new_request_ids_are_uuid4_hex_and_differ_between_forked_workers():
    import os
    import uuid

    from servekit.observability.logging import new_request_id

    ids = {new_request_id() for _ in range(10_000)}
    assert len(ids) == 10_000
    assert all(uuid.UUID(hex=i).version == 4 and uuid.UUID(hex=i).variant == uuid.RFC_4122 for i in list(ids)[:500])
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # a worker forked from the same parent must not repeat the parent's ids
        os.write(write, new_request_id().encode())
        os._exit(0)
    os.waitpid(child, 0)
    from_child = os.read(read, 64).decode()
    os.close(read)
    os.close(write)
    assert from_child not in ids and from_child != new_request_id()


@pytest.mark.slow
def test_request_id_is_honoured_and_in_the_json_logs(server):
    r = requests.post(server.url + "/v1/models/linear:predict", json=LINEAR, headers={"X-Request-Id": "trace-4711"})
    assert r.headers["X-Request-Id"] == "trace-4711"
    made = requests.get(server.url + "/v2/health/live").headers["X-Request-Id"]
    assert re.fullmatch(r"[0-9a-f]{32}", made)
    junk = requests.get(server.url + "/v2/health/live", headers={"X-Request-Id": "a b\tc"}).headers["X-Request-Id"]
    assert junk != "a b\tc"

    def logged():
        for line in server.output().splitlines():
            if line.startswith("{") and '"trace-4711"' in line:
                entry = json.loads(line)
                if entry.get("logger") == "servekit.access":
                    return entry
        return None

    deadline = time.monotonic() + 10
    while (entry := logged()) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert entry is not None, server.output()[-2000:]
    assert entry["request_id"] == "trace-4711" and entry["status"] == 200 and entry["model"] == "linear"
    assert entry["level"] == "info" and entry["path"] == "/v1/models/linear:predict"


def _get_log(server, path: str) -> requests.Response:
    deadline = time.monotonic() + 10
    while True:  # another worker may still be writing it
        r = requests.get(server.url + path)
        if r.status_code != 404 or time.monotonic() > deadline:
            return r
        time.sleep(0.1)


@pytest.mark.slow
def test_request_and_prediction_logs_are_retrievable_by_id_across_workers(server):
    body = {"inputs": [{"name": "x", "shape": [3, 2], "datatype": "FP64", "data": [1, 2, 0, 0, 1, 1]}]}
    r = requests.post(server.url + "/v2/models/linear/infer", json=body)
    assert r.status_code == 200, r.text
    request_log_id = r.headers["X-Request-Log-Id"]
    prediction_ids = r.headers["X-Prediction-Log-Ids"].split(",")
    assert len(prediction_ids) == 3  # one per batch row
    record = _get_log(server, f"/v1/logs/requests/{request_log_id}")
    assert record.status_code == 200, record.text
    doc = record.json()
    assert doc["requestLogId"] == request_log_id and doc["model"] == "linear" and doc["protocol"] == "v2"
    assert doc["request"] == body and doc["status"] == 200
    assert doc["predictionLogIds"] == prediction_ids
    one = _get_log(server, f"/v1/logs/predictions/{prediction_ids[1]}").json()
    assert one["requestLogId"] == request_log_id and one["index"] == 1
    assert list(one["output"].values())[0] == pytest.approx([1.0])  # 2*0 + 3*0 + 1
    missing = requests.get(server.url + "/v1/logs/requests/no-such-id")
    assert missing.status_code == 404 and "no-such-id" in missing.json()["error"]


@pytest.mark.slow
def test_a_stream_is_logged_under_the_ids_of_its_closing_comment(server):
    r = requests.post(server.url + "/v1/models/ticker:predict?stream=true", json={"instances": [[3, 0.01]]})
    assert r.status_code == 200
    trailer = next(line for line in r.text.splitlines() if line.startswith(": servekit-metadata"))
    meta = json.loads(trailer.split(" ", 2)[2])
    doc = _get_log(server, f"/v1/logs/requests/{meta['requestLogId']}").json()
    assert doc["predictionLogIds"] == meta["predictionLogIds"]
    assert [p["output"] for p in doc["predictions"]] == [
        {"predictions": [0]},
        {"predictions": [1]},
        {"predictions": [2]},
    ]


@pytest.mark.parametrize("url_kind", ["sqlite3", "sqlalchemy"])
def test_the_log_store_backends(servekit_app, repo, tmp_path, url_kind):
    if url_kind == "sqlalchemy":
        pytest.importorskip("sqlalchemy")
        url = f"sqlite+pysqlite:///{tmp_path / 'logs.db'}"
    else:
        url = f"sqlite:///{tmp_path / 'logs.db'}"
    client = servekit_app(repo, request_log_url=url)
    r = client.post("/v1/models/linear:predict", json={"instances": [[1, 2], [0, 0]]})
    assert r.status_code == 200
    doc = client.get(f"/v1/logs/requests/{r.headers['X-Request-Log-Id']}").get_json()
    assert doc["response"]["predictions"] == pytest.approx([9.0, 1.0])
    assert doc["predictionLogIds"] == r.headers["X-Prediction-Log-Ids"].split(",")
    assert (tmp_path / "logs.db").exists()


def test_request_logging_can_be_turned_off(servekit_app, repo):
    client = servekit_app(repo, request_log_url="off")
    r = client.post("/v1/models/linear:predict", json=LINEAR)
    assert r.status_code == 200
    gone = client.get(f"/v1/logs/requests/{r.headers['X-Request-Log-Id']}")
    assert gone.status_code == 404 and "off" in gone.get_json()["error"]


def test_a_plugin_receives_every_request_through_log_request(servekit_app, repo, tmp_path):
    plugin = tmp_path / "audit.py"
    plugin.write_text(
        "import servekit\n\nRECORDS = []\n\n\n@servekit.hookimpl\ndef log_request(record):\n"
        "    RECORDS.append(record)\n"
    )
    client = servekit_app(repo, plugin=[str(plugin)], request_log_url="off")
    r = client.post("/v1/models/linear:predict", json=LINEAR, headers={"X-Request-Id": "audit-1"})
    pm = client.application.extensions["servekit"].repository.pm
    records = pm.get_plugin("audit").RECORDS
    assert len(records) == 1
    record = records[0]
    assert isinstance(record, RequestLog)
    assert record.request_log_id == r.headers["X-Request-Log-Id"] and record.request_id == "audit-1"
    assert record.model == "linear" and record.status == 200 and record.protocol == "v1"
    assert [p.prediction_log_id for p in record.predictions] == r.headers["X-Prediction-Log-Ids"].split(",")


class Recorder:
    def __init__(self):
        self.records = []

    @servekit.hookimpl
    def log_request(self, record):
        self.records.append(record)


def test_a_failing_log_request_hook_fails_neither_the_request_nor_the_other_stores(servekit_app, repo):
    class Broken:
        @servekit.hookimpl
        def log_request(self, record):
            raise RuntimeError("the audit database is down")

    client = servekit_app(repo, request_log_url="off")
    pm = client.application.extensions["servekit"].repository.pm
    recorder = Recorder()
    pm.register(recorder, name="recorder")
    pm.register(Broken(), name="broken-audit")  # registered last: called first
    ids = []
    for _ in range(2):
        r = client.post("/v1/models/linear:predict", json=LINEAR)
        assert r.status_code == 200
        assert r.get_json()["predictions"] == pytest.approx([9.0])
        ids.append(r.headers["X-Request-Log-Id"])
    assert [record.request_log_id for record in recorder.records] == ids
