"""The suite's test servers forked from a warm process (tests/support/server_forks.py) answer as fresh ones.

``ServerProcess.launcher`` is the fork server's ``launch`` in this suite (conftest.py):
a forked server gets the command's arguments, environment, working folder and
output, exits with the status a fresh process would give, and a command it cannot
reproduce runs through ``subprocess.Popen``. A server of a model that needs torch forks
from a warm process that has imported torch, and so do its model hosts
(``servekit.hosts.client.launcher``).
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


#: a model that needs torch: it answers whether its process had imported torch before it loaded, and which process it is
TORCH_MODEL = """
import os
import sys

import numpy as np
import servekit

WARM = "torch" in sys.modules
import torch  # noqa: E402


@servekit.hookimpl
def load(path):
    return "needs-torch"


@servekit.hookimpl
def predict(inputs, parameters):
    return {"warm": np.array([WARM]), "pid": np.array([os.getpid()]), "ppid": np.array([os.getppid()])}
"""


def test_kind_of_reads_what_the_model_folders_need(tmp_path):
    def folder(name: str, files: dict[str, str]) -> str:
        for relative, text in files.items():
            (tmp_path / name / relative).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name / relative).write_text(text)
        return str(tmp_path / name)

    saved_model = folder("tf", {"1/saved_model.pb": "", "1/variables/variables.index": ""})
    safetensors = folder("hf", {"1/model.safetensors": "", "1/config.json": "{}"})
    torch_source = folder("custom", {"model.py": "import torch\n"})
    sklearn = folder("iris", {"1/model.joblib": ""})
    assert server_forks.kind_of([saved_model]) == "tensorflow"
    assert server_forks.kind_of([safetensors]) == "torch"
    assert server_forks.kind_of([torch_source]) == "torch"
    assert server_forks.kind_of([sklearn]) == "base"
    assert server_forks.kind_of([sklearn, safetensors]) == "torch"
    assert server_forks.kind_of([saved_model, safetensors]) == "base"  # both: neither is imported ahead
    assert server_forks.kind_of(["s3://bucket/models", str(tmp_path / "missing")]) == "base"


def test_a_torch_model_s_server_and_model_host_fork_from_a_process_that_imported_torch(tmp_path):
    (tmp_path / "needs-torch").mkdir()
    (tmp_path / "needs-torch" / "model.py").write_text(TORCH_MODEL)
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}
    with ServerProcess(tmp_path / "needs-torch", placement="process", env={"HF_HUB_OFFLINE": "1"}) as server:
        assert isinstance(server.proc, server_forks.ForkedServer)
        answer = requests.post(server.url + "/v2/models/needs-torch/infer", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        outputs = {o["name"]: o["data"] for o in answer.json()["outputs"]}
        assert outputs["warm"] == [True]  # torch was in the process before model.py imported it
        # the model host is no worker's child: it forked from the same warm process as the server
        warm_process = parent_of(server.proc.pid)
        assert outputs["ppid"] == [warm_process] and outputs["pid"] != [server.proc.pid]
        assert b"server_forks.py" in Path(f"/proc/{warm_process}/cmdline").read_bytes()
        assert server.stop() == 0
