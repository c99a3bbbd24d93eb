"""The request log's spool: what a process answered is in the store once, even after ``kill -9``.

A real child process spools records while its shipping is held up (as by a slow
database), is killed with SIGKILL, and another process sharing the spool folder
ships them: every record once, with SQLite and with PostgreSQL, after a partial
ship too.  A server killed right after its answers has every answered row in
the store once its replacement starts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest
import requests
from generative_models import STREAM_MODEL_PY, write_model
from postgres_server import start_postgres
from processes import kill_tree
from servekit.observability import log_spool
from servekit.observability.log_spool import Spool
from servekit.observability.log_store import Query, SqlRequestLog, open_backend
from servekit.testing import ServerProcess
from servekit.types import RequestLog

#: a process that spools ``count`` records, ships the first ``ship_first`` of them, and then
#: never gets through to the store again (its shipper blocks), until it is killed
CHILD = textwrap.dedent(
    """
    import sys, threading, time
    from servekit.observability.log_store import SqlRequestLog
    from servekit.types import PredictionLog, RequestLog

    url, spool, count, ship_first = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    store = SqlRequestLog(url, spool=spool)

    def log(i):
        store.log_request(RequestLog(
            f"r{i}", f"q{i}", 1e6 + i, "POST", "/v2/models/m/infer", "v2", "m", 200, 1.0, "{}", "{}",
            [PredictionLog(f"p{i}-{k}", k, "[1]") for k in range(2)],
        ))

    for i in range(ship_first):
        log(i)
    assert store.flush(60)
    store.spool.ship = lambda records: threading.Event().wait()  # the store is away from now on
    for i in range(ship_first, count):
        log(i)
    print("spooled", flush=True)
    time.sleep(600)
    """
)


def spool_and_kill(url: str, spool: Path, count: int, ship_first: int = 0) -> None:
    """Run CHILD until it has spooled ``count`` records (shipped ``ship_first``), then SIGKILL it."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, url, str(spool), str(count), str(ship_first)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "spooled\n"
        assert len(list(spool.glob("*.lock"))) == 1  # alive: its lock is held, nobody takes its files
        assert Spool(spool, open_backend(url).write).adopt() == 0
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)


def ids(url: str) -> tuple[Counter, Counter]:
    """How many times each request log id and each prediction log id is in the store."""
    backend = open_backend(url)
    found = backend.search(Query(limit=100_000))
    predictions = Counter(p.prediction_log_id for r in found for p in backend.get(r.request_log_id).predictions)
    return Counter(r.request_log_id for r in found), predictions


@pytest.fixture(scope="module")
def postgres(tmp_path_factory):
    url, stop = start_postgres(tmp_path_factory.mktemp("postgres"))
    yield url
    stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'logs.db'}"
    url = request.getfixturevalue("postgres")
    open_backend(url)  # the tables
    import sqlalchemy as sa

    with sa.create_engine(url).begin() as db:  # a clean store for each test
        db.execute(sa.text("TRUNCATE servekit_request_logs, servekit_prediction_logs"))
    return url


@pytest.mark.slow  # a child process: seconds
def test_kill_9_with_records_in_the_spool_ships_them_all_once(store_url, tmp_path):
    spool = tmp_path / "spool"
    spool_and_kill(store_url, spool, count=1200)
    assert ids(store_url)[0] == Counter()  # nothing reached the store before the kill

    # another process sharing the folder takes the dead one's files over
    taker = SqlRequestLog(store_url, spool=spool)
    assert taker.spool.adopt() == 1200
    requests_, predictions = ids(store_url)
    assert requests_ == Counter({f"r{i}": 1 for i in range(1200)})
    assert predictions == Counter({f"p{i}-{k}": 1 for i in range(1200) for k in range(2)})
    assert sorted(p.name for p in spool.iterdir()) == []  # shipped: the files are gone
    assert taker.spool.adopt() == 0


@pytest.mark.slow
@pytest.mark.parametrize("position", ["kept", "lost"])
def test_a_partial_ship_is_taken_up_where_it_stood_and_a_replay_writes_no_row_twice(store_url, tmp_path, position):
    spool = tmp_path / "spool"
    spool_and_kill(store_url, spool, count=700, ship_first=300)  # the first batch reached the store
    before = open_backend(store_url).get("r10")
    assert before is not None and len(ids(store_url)[0]) == 300
    if position == "lost":  # killed after its batch was committed, before it noted so: all replayed
        (lock,) = spool.glob("*.lock")
        lock.write_bytes(b"")

    # a line cut by the kill (the process died inside write(2)) is left out, the rest shipped
    (segment,) = spool.glob("*.log")
    with open(segment, "ab") as f:
        f.write(b'{"request_log_id":"cut')
    assert SqlRequestLog(store_url, spool=spool).spool.adopt() == (400 if position == "kept" else 700)
    requests_, predictions = ids(store_url)
    assert requests_ == Counter({f"r{i}": 1 for i in range(700)})
    assert max(predictions.values()) == 1 and len(predictions) == 1400
    assert open_backend(store_url).get("r10") == before  # the row written first is left as it was
    assert list(spool.iterdir()) == []


#: a process whose spool file may grow to 4,000 bytes only (RLIMIT_FSIZE): past it write(2) is
#: short, then fails (EFBIG), as on a full disk; after the 30th record the limit goes
TORN = textwrap.dedent(
    """
    import json, resource, signal, sys
    from servekit.observability.log_store import SqlRequestLog
    from servekit.types import RequestLog

    store = SqlRequestLog(sys.argv[1], spool=sys.argv[2])
    store.start()
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4000, hard))
    kept = []
    for i in range(40):
        try:
            if store.spool.append(RequestLog(f"r{i}", "", 1e6, "POST", "/p", "v1", "m", 200, 1.0, "{}", "y" * 150)):
                kept.append(i)
        except OSError:
            pass  # the caller counts it as dropped
        if i == 30:
            resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
    assert store.flush(30)
    print(json.dumps(kept))
    """
)


@pytest.mark.slow
def test_a_write_cut_short_leaves_the_next_record_whole(tmp_path):
    """A full disk (here a file size limit) cuts a write halfway: that record is lost, the next is whole."""
    url, spool = f"sqlite:///{tmp_path / 'logs.db'}", tmp_path / "spool"
    out = subprocess.run(
        [sys.executable, "-c", TORN, url, str(spool)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    kept = json.loads(out.stdout.splitlines()[-1])
    assert 0 < len(kept) < 40 and kept[-9:] == list(range(31, 40))  # some did not fit; room again, all did
    assert "a line that is not a record was skipped" in out.stderr  # the one cut short
    assert sorted(ids(url)[0]) == sorted(f"r{i}" for i in kept)


@pytest.mark.slow
def test_a_record_the_store_refuses_is_dropped_alone(postgres, tmp_path):
    open_backend(postgres)
    store = SqlRequestLog(postgres, spool=tmp_path / "spool")
    for i in range(5):  # the third names a model longer than the column holds: PostgreSQL refuses it
        model = "m" * 200 if i == 2 else "m"
        store.log_request(RequestLog(f"refuse-{i}", "", 1e6, "POST", "/p", "v1", model, 200, 1.0, "{}", "{}"))
    assert store.flush()
    assert [store.backend.get(f"refuse-{i}") is not None for i in range(5)] == [True, True, False, True, True]


def test_segments_rotate_and_each_is_deleted_once_shipped(tmp_path, monkeypatch):
    monkeypatch.setattr(log_spool, "SEGMENT_BYTES", 4096)
    url = f"sqlite:///{tmp_path / 'logs.db'}"
    store = SqlRequestLog(url, spool=tmp_path / "spool")
    for i in range(300):
        store.log_request(RequestLog(f"r{i}", "", 1e6 + i, "POST", "/p", "v1", "m", 200, 1.0, "{}", "x" * 100))
    assert store.flush()
    assert store.spool._seq > 5  # it rotated
    # the one being written is left, and the lock; every shipped segment is gone
    assert sorted(p.suffix for p in (tmp_path / "spool").iterdir()) == [".lock", ".log"]
    assert len(ids(url)[0]) == 300
    store.spool.close()
    assert list((tmp_path / "spool").iterdir()) == []


def test_the_default_spool_folder():
    assert log_spool.default_folder("sqlite:////var/log/s/requests.db?timeout=3") == Path(
        "/var/log/s/requests.db-spool"
    )
    one = log_spool.default_folder("postgresql+psycopg://u@db/servekit")
    assert one == log_spool.default_folder("postgresql+psycopg://u@db/servekit")  # servers of one store share it
    assert one != log_spool.default_folder("postgresql+psycopg://u@db/other")
    assert "u@db" not in str(one)


@pytest.mark.slow
def test_a_server_killed_after_its_answers_loses_no_row(tmp_path):
    """Two workers answer (whole answers and a stream), every process of the server is killed
    at once (no time to ship), and the server started in its place ships what they spooled."""
    url, spool = f"sqlite:///{tmp_path / 'logs.db'}", tmp_path / "spool"
    model = write_model(tmp_path / "streamer", STREAM_MODEL_PY)
    answered = []
    server = ServerProcess(model, workers=2, request_log_url=url, request_log_spool=spool)
    server.start()
    try:
        predict = server.url + "/v1/models/streamer:predict"
        with requests.Session() as http:
            for _ in range(60):
                r = http.post(predict, json={"instances": [1.0], "parameters": {"mode": "plain"}})
                assert r.status_code == 200
                answered.append(r.headers["X-Request-Log-Id"])
            # a stream's record is kept before its closing comment goes out
            r = http.post(predict + "?stream=true", json={"instances": [1.0], "parameters": {"mode": "count", "n": 3}})
            last = r.text.rstrip("\n").splitlines()[-1]
            assert last.startswith(": servekit-metadata "), r.text
            trailer = json.loads(last[len(": servekit-metadata ") :])
        answered.append(trailer["requestLogId"])
        assert server.proc is not None
        kill_tree(server.proc.pid)
    finally:
        server.stop()
    assert len(list(spool.glob("*.lock"))) >= 2  # the workers' files, left behind

    with ServerProcess(model, request_log_url=url, request_log_spool=spool):
        deadline = time.monotonic() + 30
        while len(ids(url)[0]) < len(answered) and time.monotonic() < deadline:
            time.sleep(0.2)
    logged = ids(url)[0]
    assert all(logged[rid] == 1 for rid in answered), [rid for rid in answered if logged[rid] != 1]
    assert len(logged) == len(answered)
    stream = open_backend(url).get(trailer["requestLogId"])
    assert stream is not None and [p.prediction_log_id for p in stream.predictions] == trailer["predictionLogIds"]
