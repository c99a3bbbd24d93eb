"""A scale-out rehearsal on one machine: three replicas behind HAProxy, one shared model folder, one PostgreSQL.

Under 64 connections, a rolling restart (SIGTERM one replica at a time, wait for
it to be ready again, then the next) loses no request; ``kill -9`` of one loses
at most the requests it held, and HAProxy stops sending to it; every answered
request's log row is in PostgreSQL once.  The figures are printed (``-s``) and
quoted in docs/scaling.md.
"""

from __future__ import annotations

import csv
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests
from postgres_server import start_postgres
from processes import kill_tree
from servekit.testing import ServerProcess, free_port
from sklearn_models import fit_iris

pytestmark = pytest.mark.slow

CONNECTIONS = 64
REPLICAS = 3
MAXCONN = 24  # requests HAProxy has at one replica at once, at most (more wait in its queue)
ROW = {"instances": [[5.1, 3.5, 1.4, 0.2]]}

HAPROXY = """\
global
    maxconn 1024
    stats socket {folder}/haproxy.sock mode 600 level admin
    log stderr format raw local0
defaults
    mode http
    log global
    option httplog
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    # a request that met a closed or refused connection goes to another replica; each on a
    # connection of its own to the replica: one that failed on a reused connection would be
    # answered by closing the client's, for a client to retry (which it may not, for a POST)
    option http-server-close
    retries 3
    option redispatch 1
    retry-on conn-failure empty-response response-timeout
frontend servekit
    bind 127.0.0.1:{port}
    capture request header X-Request-ID len 32
    default_backend replicas
backend replicas
    balance leastconn
    option httpchk GET /v2/health/ready
    http-check expect status 200
    # each replica takes 24 at a time, fewer than its 32 threads: a health check always finds a
    # free thread; more wait in HAProxy's queue (timeout queue), not in a replica.  A check may
    # take seconds on a busy machine (timeout check 5s): three failures take a replica out, or
    # one refused connection of real traffic (observe layer4), as a killed replica's are.
    default-server inter 500ms fastinter 250ms downinter 1s fall 3 rise 2 maxconn {maxconn} observe layer4 error-limit 1 on-error mark-down
    timeout check 5s
    timeout queue 30s
    http-response set-header X-Replica %s
{servers}
"""


@dataclass
class Tally:
    """What the load generator saw."""

    sent: int = 0
    phase: str = "start"
    answered: list[tuple[str, str, str]] = field(default_factory=list)  # (request id, replica, request log id)
    failed: list[tuple[str, str, str]] = field(default_factory=list)  # (request id, phase, what went wrong)
    sent_after_down: Counter = field(default_factory=Counter)  # replica: answers to requests sent once one was DOWN
    lock: threading.Lock = field(default_factory=threading.Lock)

    def replicas_since(self, mark: int) -> Counter:
        with self.lock:
            return Counter(replica for _, replica, _ in self.answered[mark:])

    def lost_in(self, phase: str) -> list[tuple[str, str, str]]:
        with self.lock:
            return [f for f in self.failed if f[1] == phase]


def load(url: str, stop: threading.Event, tally: Tally) -> None:
    with requests.Session() as http:
        while not stop.is_set():
            rid = uuid.uuid4().hex
            with tally.lock:
                tally.sent += 1
                phase = tally.phase  # the phase it was sent in
            try:
                r = http.post(url, json=ROW, headers={"X-Request-ID": rid}, timeout=30)
                ok = r.status_code == 200 and r.json()["predictions"] == ["setosa"]
                outcome = r.headers.get("X-Replica", "") if ok else f"{r.status_code} {r.text[:200]}"
            except requests.RequestException as exc:
                ok, outcome = False, f"{type(exc).__name__}: {exc}"
            with tally.lock:
                if ok:
                    tally.answered.append((rid, outcome, r.headers["X-Request-Log-Id"]))
                    if phase == "down":
                        tally.sent_after_down[outcome] += 1
                else:
                    tally.failed.append((rid, phase, outcome))


class HAProxy:
    """Debian's HAProxy in front of the replicas, and its stats socket."""

    def __init__(self, folder: Path, ports: list[int]):
        binary = shutil.which("haproxy") or "/usr/sbin/haproxy"
        if not Path(binary).exists():
            pytest.skip("HAProxy is not installed (Debian: apt-get install -y haproxy; scripts/test.sh does as root)")
        self.port, self.socket = free_port(), folder / "haproxy.sock"
        servers = "\n".join(f"    server r{i} 127.0.0.1:{p} check" for i, p in enumerate(ports))
        config = folder / "haproxy.cfg"
        config.write_text(HAPROXY.format(port=self.port, folder=folder, servers=servers, maxconn=MAXCONN))
        check = subprocess.run([binary, "-c", "-f", str(config)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        self.log = folder / "haproxy.log"  # a line per request: where it went, how it ended
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen([binary, "-db", "-f", str(config)], stdout=subprocess.DEVNULL, stderr=log)
        self.url = f"http://127.0.0.1:{self.port}"

    def stats(self) -> dict[str, dict[str, str]]:
        """``show stat`` of the backend's servers, by name (``scur``: requests at it now, ``stot``:
        all it was sent, ``status``: UP / DOWN / NOLB...)."""
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(str(self.socket))
            s.sendall(b"show stat\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        header, *lines = data.decode().strip().splitlines()
        table = csv.DictReader(lines, fieldnames=header.lstrip("# ").split(","))
        return {row["svname"]: row for row in table if row["pxname"] == "replicas"}

    def status(self, name: str) -> str:
        return self.stats()[name]["status"]

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def wait_until(condition, timeout: float = 60.0, what: str = "") -> float:
    """Seconds it took ``condition`` to hold."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, f"timed out waiting for {what}"
        time.sleep(0.05)
    return time.monotonic() - started


def ready(url: str) -> bool:
    try:
        return requests.get(url + "/v2/health/ready", timeout=5).status_code == 200
    except requests.ConnectionError:  # HAProxy not listening yet
        return False


def rows(url: str) -> list[tuple[str, str]]:
    """(request log id, request id) of every row in the store."""
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as db:
        return list(db.execute("SELECT id, request_id FROM servekit_request_logs"))


def owners_left(spool: Path, pids: list[int]) -> list[str]:
    """Spool files of these processes that nobody has shipped yet (``HOST-PID-TOKEN.lock``)."""
    return [p.name for p in spool.glob("*.lock") if int(p.name.rsplit("-", 2)[1]) in pids]


def test_three_replicas_behind_haproxy_restart_and_lose_one_without_losing_requests(tmp_path):
    models = tmp_path / "models"  # the shared store: every replica reads the same folder
    fit_iris(models / "iris")
    spool = tmp_path / "spool"  # the request log's spool, shared as a node's folder would be
    db_url, stop_db = start_postgres(tmp_path / "pg")
    settings = dict(
        workers=1,
        threads=32,
        max_queue=64,
        request_log_url=db_url,
        request_log_spool=spool,
        shutdown_delay=3,  # readiness 503 first: HAProxy's checks (3 failures, 0.25-0.5 s apart) take it out
        drain_seconds=10,
        poll_interval=0,
    )
    replicas = [ServerProcess(models, **settings) for _ in range(REPLICAS)]
    names = [f"r{i}" for i in range(REPLICAS)]
    figures: dict[str, object] = {}
    lb = None
    try:
        for replica in replicas:
            replica.start(timeout=180)
        lb = HAProxy(tmp_path, [r.http_port for r in replicas])
        wait_until(lambda: ready(lb.url), what="HAProxy")
        all_up = lambda: all(lb.status(n) == "UP" for n in names)  # noqa: E731
        wait_until(all_up, what="every replica UP in HAProxy")
        tally, stop = Tally(), threading.Event()
        threads = [
            threading.Thread(target=load, args=(lb.url + "/v1/models/iris:predict", stop, tally), daemon=True)
            for _ in range(CONNECTIONS)
        ]
        for t in threads:
            t.start()
        try:
            time.sleep(3)
            assert len(tally.replicas_since(0)) == REPLICAS  # HAProxy spreads the load over all three

            # -- a rolling restart: SIGTERM, wait for the exit, a new ready process and HAProxy
            # marking it UP, then the next
            tally.phase, started = "restart", time.monotonic()
            for replica, name in zip(replicas, names):
                assert replica.stop(signal.SIGTERM, timeout=60) == 0, replica.output()
                replica.start(timeout=180)
                wait_until(lambda name=name: lb.status(name) == "UP", what=f"{name} UP again")
            figures["restart_seconds"] = round(time.monotonic() - started, 1)
            figures["restart_sent"] = tally.sent

            # -- kill -9 of one: what it held at that moment is the most that may be lost
            time.sleep(2)  # its load back to its share
            victim = replicas[0]
            assert victim.proc is not None
            tally.phase = "kill"
            # what HAProxy had at it, sampled for the half second up to the kill (the count moves
            # by a few from one millisecond to the next)
            until, in_flight = time.monotonic() + 0.5, 0
            while time.monotonic() < until:
                in_flight = max(in_flight, int(lb.stats()["r0"]["scur"]))
            killed = kill_tree(victim.proc.pid)
            victim.proc.wait(10)

            # and until HAProxy marks it DOWN: what it had sent before the kill and not yet seen
            # fail is still counted at it (walking the process tree to kill it takes a while, and
            # requests keep going to it meanwhile)
            def down() -> bool:
                nonlocal in_flight
                r0 = lb.stats()["r0"]
                in_flight = max(in_flight, int(r0["scur"]))
                return r0["status"].startswith("DOWN")

            figures["seconds_to_down"] = round(wait_until(down, 30), 2)
            figures["in_flight_at_kill"] = in_flight
            sent_to_it = int(lb.stats()["r0"]["stot"])
            # what is sent from now on: an answer to a request sent before may still be on its way
            # (read by its thread later), so only these say where HAProxy sends once r0 is DOWN
            tally.phase = "down"
            time.sleep(3)
            with tally.lock:
                after_kill = Counter(tally.sent_after_down)
            sent_after_down = int(lb.stats()["r0"]["stot"]) - sent_to_it
            # a survivor ships what the killed one spooled (its lock went with it)
            figures["seconds_to_ship_its_spool"] = round(wait_until(lambda: not owners_left(spool, killed), 30), 1)
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        for replica in replicas[1:]:  # the survivors ship their own last records as they exit
            assert replica.stop(signal.SIGTERM, timeout=60) == 0
        left_in_spool = sorted(p.name for p in spool.iterdir())
        logged = rows(db_url)
        # what survivors shipped for processes that were gone: the killed one's, and any a
        # SIGTERM left (its exit ships its own for at most 5 s)
        taken_over = Counter()
        for replica in replicas[1:]:
            for count, pid in re.findall(r"shipped (\d+) request log\(s\) left by \S+-(\d+)-\w+", replica.output()):
                taken_over["killed" if int(pid) in killed else "stopped"] += int(count)
    finally:
        for replica in replicas:
            replica.stop()
        if lb is not None:
            lb.close()
        stop_db()

    by_log_id = Counter(log_id for log_id, _ in logged)
    by_request = Counter(rid for _, rid in logged)
    answered = {rid for rid, _, _ in tally.answered}
    lost_restart, lost_kill = tally.lost_in("restart"), tally.lost_in("kill")
    missing = [rid for rid, _, log_id in tally.answered if by_log_id[log_id] != 1]
    figures.update(
        sent=tally.sent,
        answered=len(tally.answered),
        lost=len(tally.failed),
        lost_in_restart=len(lost_restart),
        lost_to_kill=len(lost_kill),
        sent_to_killed_after_down=sent_after_down,
        rows=len(logged),
        rows_of_answered=sum(by_log_id[log_id] for _, _, log_id in tally.answered),
        answered_without_row=len(missing),
        rows_shipped_for_the_killed=taken_over["killed"],
        rows_shipped_for_stopped_ones=taken_over["stopped"],
        answered_with_a_second_row=sum(1 for rid in answered if by_request[rid] > 1),
        rows_of_lost=sum(by_request[rid] for rid, _, _ in tally.failed),
        answered_per_replica=dict(Counter(replica for _, replica, _ in tally.answered)),
        failures=dict(Counter(what.split("\n")[0][:60] for _, _, what in tally.failed)),
    )
    print("\nscale-out rehearsal:", figures)
    if lb is not None and tally.failed:  # HAProxy's word on each lost request: where it went, how it ended
        lost_ids = {rid for rid, _, _ in tally.failed}
        print("".join(line for line in lb.log.read_text().splitlines(True) if any(r in line for r in lost_ids)))
    assert lost_restart == [], lost_restart[:5]  # the rolling restart lost nothing
    # at most what the killed one held: HAProxy never has more than MAXCONN at a replica.  The
    # sampled count (in_flight_at_kill) runs below what is lost in some runs (3 sampled, 5
    # lost; HAProxy's count moves between two samples and the kill takes a while), so it is a
    # figure, not the bound
    assert len(lost_kill) <= MAXCONN, lost_kill[:5]
    assert tally.failed == lost_restart + lost_kill  # nothing lost before the restart
    assert sent_after_down == 0 and "r0" not in after_kill and sum(after_kill.values()) > 0, after_kill
    assert tally.sent == len(tally.answered) + len(tally.failed)
    # every answered request is in PostgreSQL, once: its answer's request log id is a row
    assert missing == [], missing[:5]
    assert left_in_spool == [], left_in_spool  # everything spooled was shipped
    # a second row of one request id: the killed replica had logged it, then died before its
    # answer left and HAProxy retried it on another; at most what it held
    assert figures["answered_with_a_second_row"] <= MAXCONN
    assert max(by_request[rid] for rid in answered) <= 2
    assert len(logged) == sum(by_request[rid] for rid in answered) + figures["rows_of_lost"]  # no stray row
