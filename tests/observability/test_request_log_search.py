"""The request log, usable: search (store, HTTP route, ``servekit logs``), replay, and PostgreSQL as the store."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest
import requests
from postgres_server import start_postgres
from servekit.cli.commands import main
from servekit.cli.logs import _differs, replay
from servekit.observability.log_search import moment, query_from
from servekit.observability.log_store import Query, SqlRequestLog, open_backend
from servekit.types import PredictionLog, RequestLog

MODEL = """
import numpy as np
import servekit
from servekit.types import ModelMetadata, Signature, TensorSpec

FACTOR = {factor}


@servekit.hookimpl
def load(path):
    return "scale"


@servekit.hookimpl
def metadata(model):
    return ModelMetadata(signatures={{"serving_default": Signature(inputs=[TensorSpec("x", "FP32", [-1])])}})


@servekit.hookimpl
def predict(inputs, parameters):
    x = inputs["x"] if isinstance(inputs, dict) else inputs
    return x * FACTOR
"""


def scale_repo(folder: Path, factor: float, version: int = 1) -> Path:
    model = folder / "scale" / str(version)
    model.mkdir(parents=True)
    (model / "model.py").write_text(MODEL.format(factor=factor))
    return folder


def record(i: int, **overrides) -> RequestLog:
    values = dict(
        request_log_id=f"r{i}",
        request_id=f"q{i}",
        created=1_000_000.0 + i,
        method="POST",
        path="/v2/models/scale/infer",
        protocol="v2",
        model="scale",
        status=200,
        duration_ms=float(i),
        request_body="{}",
        response_body="{}",
        predictions=[PredictionLog(f"p{i}", 0, "[1]")],
        version="1",
        trace_id="",
    )
    values.update(overrides)
    return RequestLog(**values)


# -- the query ---------------------------------------------------------------------------------


def test_query_filters_and_their_errors():
    q = query_from({"model": "m", "status": "5xx", "min_ms": "10", "since": "1000", "limit": "5"})
    assert (q.model, q.status_range(), q.min_ms, q.since, q.limit) == ("m", (500, 599), 10.0, 1000.0, 5)
    assert query_from({"status": "404"}).status_range() == (404, 404)
    assert query_from({}).sql("?") == ("", [])
    for bad, message in (
        ({"status": "5x"}, "status must be"),
        ({"min_ms": "fast"}, "min_ms must be a number"),
        ({"limit": "-1"}, "limit must be a whole number"),
        ({"limit": "0"}, "limit must be between"),
        ({"order": "sideways"}, "order must be"),
        ({"since": "yesterday"}, "not a time"),
        ({"colour": "red"}, "unknown filter"),
    ):
        with pytest.raises(ValueError, match=message):
            query_from(bad)


def test_times_as_seconds_iso_or_age():
    assert moment("1700000000") == 1700000000.0
    assert moment("2026-12-01T10:00:00Z") == moment("2026-12-01T10:00:00") == moment("2026-12-01T11:00:00+01:00")
    assert moment("15m", now=10_000.0) == 10_000.0 - 900
    assert moment("2h", now=10_000.0) == 10_000.0 - 7200


@pytest.fixture(params=["sqlite", "sqlalchemy-sqlite"])
def store_url(request, tmp_path) -> str:
    # the stdlib backend, and the SQLAlchemy one (PostgreSQL's path) over SQLite
    return f"sqlite:///{tmp_path / 'logs.db'}" + ("?timeout=30" if request.param == "sqlalchemy-sqlite" else "")


def test_the_store_searches_by_every_field(store_url):
    backend = open_backend(store_url)
    backend.write(
        [
            record(1),
            record(2, status=503, duration_ms=250.0),
            record(3, version="2", status=400),
            record(4, model="other", created=2_000_000.0),
        ]
    )

    def ids(**fields) -> list[str]:
        return [r.request_log_id for r in backend.search(Query(**fields))]

    assert ids() == ["r4", "r3", "r2", "r1"]  # newest first
    assert ids(oldest_first=True, limit=2) == ["r1", "r2"]
    assert ids(model="scale") == ["r3", "r2", "r1"]
    assert ids(version="2") == ["r3"]
    assert ids(status="5xx") == ["r2"] and ids(status="400") == ["r3"] and ids(status="2xx") == ["r4", "r1"]
    assert ids(min_ms=2, max_ms=3) == ["r3"]  # r2 took 250 ms
    assert ids(since=1_000_002.0, until=1_000_003.0) == ["r3", "r2"]
    found = backend.search(Query(model="scale", version="2"))[0]
    assert (found.version, found.status, found.request_id) == ("2", 400, "q3")


def test_a_store_made_before_versions_and_traces_gets_the_columns(tmp_path):
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:  # the first release's table
        db.execute(
            "CREATE TABLE servekit_request_logs (id VARCHAR(64) PRIMARY KEY, request_id VARCHAR(128), "
            "created DOUBLE PRECISION, method VARCHAR(8), path TEXT, protocol VARCHAR(16), model VARCHAR(128), "
            "status INTEGER, duration_ms DOUBLE PRECISION, request_body TEXT, response_body TEXT)"
        )
        db.execute(
            "INSERT INTO servekit_request_logs VALUES ('old', 'q', 1.0, 'POST', '/p', 'v2', 'm', 200, 1.0, '', '')"
        )
    backend = open_backend(f"sqlite:///{path}")
    backend.write([record(1, trace_id="ab" * 16)])
    assert [(r.request_log_id, r.version) for r in backend.search(Query(oldest_first=True))] == [
        ("old", ""),
        ("r1", "1"),
    ]
    assert backend.get("r1").trace_id == "ab" * 16


# -- the HTTP route and the command -------------------------------------------------------------


V2_BODY = {"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1.0, 2.0]}]}


def test_the_route_searches_what_the_server_logged(servekit_app, tmp_path):
    url = f"sqlite:///{tmp_path / 'logs.db'}"
    client = servekit_app(scale_repo(tmp_path / "models", 2.0), request_log_url=url)
    for _ in range(3):
        assert client.post("/v2/models/scale/infer", json=V2_BODY).status_code == 200
    assert client.post("/v2/models/scale/versions/1/infer", json={"inputs": "nope"}).status_code == 400
    found = client.get("/v1/logs/requests?model=scale&status=2xx").get_json()["requests"]
    assert len(found) == 3 and {r["version"] for r in found} == {"1"} and {r["status"] for r in found} == {200}
    assert "predictions" not in found[0] and found[0]["request"] == V2_BODY
    failed = client.get("/v1/logs/requests?status=4xx").get_json()["requests"]
    assert [(r["status"], r["version"]) for r in failed] == [(400, "1")]  # the version its path named
    assert client.get("/v1/logs/requests?limit=1").get_json()["requests"][0]["status"] == 400  # newest first
    bad = client.get("/v1/logs/requests?status=teapot")
    assert bad.status_code == 400 and "status must be" in bad.get_json()["error"]
    assert client.get("/v1/logs/requests?colour=red").status_code == 400


def test_the_route_needs_an_admin_key(servekit_app, tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("infer user-key\nadmin admin-key\n")
    client = servekit_app(
        scale_repo(tmp_path / "models", 2.0), request_log_url=f"sqlite:///{tmp_path / 'l.db'}", api_key_file=str(keys)
    )
    assert client.get("/v1/logs/requests").status_code == 401
    assert client.get("/v1/logs/requests", headers={"Authorization": "Bearer user-key"}).status_code == 403
    assert client.get("/v1/logs/requests", headers={"Authorization": "Bearer admin-key"}).status_code == 200


def test_servekit_logs_prints_a_table_or_json_lines(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'logs.db'}"
    open_backend(url).write([record(1), record(2, status=503, duration_ms=99.5)])
    assert main(["logs", "--store", url, "--status", "5xx", "--format", "json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["requestLogId"] for line in lines] == ["r2"]
    assert main(["logs", "--store", url]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["createdAt", "status", "durationMs"]
    assert "r2" in table[1] and "99.5" in table[1] and "r1" in table[2] and table[-1] == "(2 records)"
    assert main(["logs", "--store", url, "--status", "fine"]) == 2
    assert "status must be" in capsys.readouterr().err
    assert main(["logs"]) == 2  # nowhere to read from


def test_answers_compare_value_by_value():
    assert _differs({"a": [1.0, 2.0]}, {"a": [1.0, 2.0000000001]}, 1e-6, "") is None
    assert _differs({"a": [1.0, 2.0]}, {"a": [1.0, 3.0]}, 1e-6, "") == "/a/1: 2.0 -> 3.0"
    assert _differs({"model_version": "1", "id": "x"}, {"model_version": "2", "id": "y"}, 0, "") is None
    assert _differs({"a": 1}, {"b": 1}, 0, "") == "/a: missing"
    assert _differs([1], [1, 2], 0, "") == "/: 1 items -> 2"
    assert _differs(True, 1, 0, "") is not None  # a boolean is not the number 1


# -- for real: PostgreSQL, two servers, the commands over HTTP -------------------------------------


@pytest.mark.slow
def test_postgresql_store_search_and_replay_against_another_build(tmp_path, capsys):
    from servekit.testing import ServerProcess

    url, stop = start_postgres(tmp_path / "postgres")
    try:
        store = SqlRequestLog(url)  # the tables, as a server makes them
        assert store.backend.search(Query()) == []
        first = scale_repo(tmp_path / "a", 2.0)
        other = scale_repo(tmp_path / "b", 3.0, version=2)  # another build: triples, as version 2
        with ServerProcess(first, workers=2, request_log_url=url) as a, ServerProcess(other, workers=1) as b:
            for i in range(12):
                body = {"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [float(i), 1.0]}]}
                assert requests.post(a.url + "/v2/models/scale/infer", json=body).status_code == 200
            assert requests.post(a.url + "/v2/models/scale/infer", json={"inputs": 1}).status_code == 400
            deadline = time.monotonic() + 20  # each worker writes its batch within 50 ms
            while len(store.backend.search(Query(model="scale"))) < 13 and time.monotonic() < deadline:
                time.sleep(0.1)
            logged = store.backend.search(Query(model="scale", oldest_first=True))
            assert len(logged) == 13 and [r.status for r in logged].count(200) == 12
            assert {r.version for r in logged} == {"1"}

            # servekit logs, from the store and from the server's route
            assert main(["logs", "--store", url, "--status", "4xx", "--format", "json"]) == 0
            assert [json.loads(x)["status"] for x in capsys.readouterr().out.splitlines()] == [400]
            assert main(["logs", "--server", a.url, "--model", "scale", "--version", "1", "--format", "json"]) == 0
            assert len(capsys.readouterr().out.splitlines()) == 13

            # the same build answers the same; the other one differs in every prediction
            # (server a logs the replayed requests too: later commands read the log up to now)
            until = str(time.time())
            same = replay(
                [
                    r.to_json(predictions=False) | {"requestBody": r.request_body, "responseBody": r.response_body}
                    for r in logged
                ],
                a.url,
                rate=50,
            )
            assert (same.sent, same.same, same.differences, same.failed) == (13, 13, [], [])
            assert (
                main(
                    [
                        "replay",
                        "--store",
                        url,
                        "--status",
                        "2xx",
                        "--until",
                        until,
                        "--to",
                        b.url,
                        "--rate",
                        "50",
                        "--json",
                    ]
                )
                == 1
            )
            report = json.loads(capsys.readouterr().out)
            assert (report["sent"], report["same"], report["different"]) == (12, 0, 12)
            assert report["differences"][0]["what"].startswith("/outputs/0/data/")  # 2x -> 3x
            assert report["latency_ms"]["replayed"]["p50"] > 0 and report["latency_ms"]["logged"]["p50"] > 0
            assert (
                main(["replay", "--server", a.url, "--status", "2xx", "--until", until, "--to", a.url, "--rate", "0"])
                == 0
            )
            assert capsys.readouterr().out.startswith("replayed 12 request(s)")
    finally:
        stop()
