"""The suite's test servers forked from a warm process (tests/support/server_forks.py) answer as fresh ones.

``ServerProcess.launcher`` is the fork server's ``launch`` in this suite (conftest.py):
a forked server gets the command's arguments, environment, working folder and
output, exits with the status a fresh process would give, and a command it cannot
reproduce runs through ``subprocess.Popen``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import requests
import server_forks
from processes import parent_of
from servekit.testing import ServerProcess
from sklearn_models import ECHO_MODEL

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get(server_forks.ENV) == "0", reason=f"{server_forks.ENV}=0: servers start fresh"),
]


@pytest.fixture(scope="module")
def echo_model(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("forks") / "echo"
    folder.mkdir()
    (folder / "model.py").write_text(ECHO_MODEL)
    return folder


def test_a_forked_server_has_the_command_s_environment_folder_and_output(echo_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert ServerProcess.launcher is server_forks.launch
    reaped = server_forks.reaped_cpu()
    with ServerProcess(echo_model, env={"SERVEKIT_MAX_REQUEST_SIZE": "1000"}) as server:
        assert isinstance(server.proc, server_forks.ForkedServer)
        assert parent_of(server.proc.pid) != os.getpid()  # the fork server's child, not this process's
        assert os.readlink(f"/proc/{server.proc.pid}/cwd") == str(tmp_path)
        answer = requests.get(server.url + "/v2/models/echo", timeout=30)
        assert answer.status_code == 200 and answer.json()["name"] == "echo"
        # a setting only the environment gave: the server read the command's environment, not the fork server's
        too_large = requests.post(server.url + "/v2/models/echo/infer", data=b"x" * 2000, timeout=30)
        assert too_large.status_code == 413, too_large.text
        assert server.proc.poll() is None
        assert server.stop() == 0  # SIGTERM drains and exits cleanly, as a fresh gunicorn master does
    assert "Booting worker" in server.output()  # its log reached the file the command was given
    assert server_forks.reaped_cpu() > reaped  # its CPU, and its worker's, reach the CPU report


def test_a_forked_server_exits_with_the_status_a_fresh_one_gives(tmp_path):
    command = [sys.executable, "-m", "servekit", "serve", str(tmp_path / "missing"), "--http-port", "0"]
    answers = []
    for launcher in (server_forks.launch, subprocess.Popen):
        with tempfile.TemporaryFile() as log:
            proc = launcher(command, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
            code = proc.wait(120)
            log.seek(0)
            answers.append((type(proc), code, log.read().decode().strip().splitlines()[-1:]))
    (forked_type, forked_code, forked_said), (_, fresh_code, fresh_said) = answers
    assert forked_type is server_forks.ForkedServer
    assert forked_code == fresh_code != 0
    assert forked_said == fresh_said  # the same one-line refusal


def test_a_killed_server_reports_the_signal_as_popen_does(echo_model):
    with ServerProcess(echo_model) as server:
        with pytest.raises(subprocess.TimeoutExpired):
            server.proc.wait(0.01)
        server.proc.kill()
        assert server.proc.wait(30) == -signal.SIGKILL
        assert server.proc.poll() == -signal.SIGKILL
        assert server.stop() == -signal.SIGKILL  # stopping a server that has exited says how it ended


def test_a_command_it_cannot_reproduce_starts_fresh(echo_model):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(echo_model), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryFile() as log:
        proc = server_forks.launch([sys.executable, "-c", "pass"], stdout=log, stderr=subprocess.STDOUT, env=env)
        assert isinstance(proc, subprocess.Popen) and proc.wait(60) == 0
        # read at the interpreter's start: a fork of a process started without it would not have it
        proc = server_forks.launch(
            [sys.executable, "-m", "servekit", "--version"], stdout=log, stderr=subprocess.STDOUT, env=env
        )
        assert isinstance(proc, subprocess.Popen) and proc.wait(60) == 0
