"""``options.model_uri: models:/NAME/VERSION`` against a real ``mlflow server`` on loopback.

``mlflow server`` needs the full mlflow package (the ``servekit[mlflow]`` extra
installs mlflow-skinny, the client): the test runs the one ``SERVEKIT_TEST_MLFLOW_SERVER``
names, else the virtualenv ``.venv-mlflow`` that ``scripts/test.sh`` makes, else the
``mlflow`` beside this Python, and skips when none can start a server.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from lazy_modules import lazy_module
from repo_paths import REPO as ROOT

pytestmark = pytest.mark.slow

# looked up at collection, imported by the first test that needs them
mlflow = lazy_module("mlflow")
xgb = lazy_module("xgboost")
from framework_models import data, xgboost_booster
from servekit.testing import free_port

ROWS = data()[0][:5]


MLFLOW_VENV = ROOT / ".venv-mlflow" / "bin" / "mlflow"


def server_command() -> list[str]:
    exe = (
        os.environ.get("SERVEKIT_TEST_MLFLOW_SERVER")
        or (str(MLFLOW_VENV) if MLFLOW_VENV.exists() else None)
        or shutil.which("mlflow", path=str(Path(sys.executable).parent))
    )
    if not exe:
        pytest.skip("no mlflow executable: scripts/test.sh makes .venv-mlflow")
    return [exe, "server"]  # an mlflow-skinny one exits at once, saying a module is missing (tracking() skips)


@pytest.fixture(scope="module")
def tracking(tmp_path_factory):
    """A tracking server and registry on a free loopback port, artifacts served by it."""
    base = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    command = server_command() + [
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
        "--backend-store-uri", f"sqlite:///{base / 'mlflow.db'}", "--artifacts-destination", str(base / "artifacts"),
    ]  # fmt: skip
    log = (base / "server.log").open("wb")
    # no job runner: its seven huey consumers (GenAI scorer jobs, not the registry's) each import
    # mlflow and poll their queue for as long as they live
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=base, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):  # the first start creates the database: up to a minute
            if proc.poll() is not None:
                output = (base / "server.log").read_text()
                if "ModuleNotFoundError" in output:  # mlflow-skinny: the CLI is there, the server's packages not
                    pytest.skip("this mlflow cannot run a server (mlflow-skinny); set SERVEKIT_TEST_MLFLOW_SERVER")
                pytest.fail(f"mlflow server exited: {output[-2000:]}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


@pytest.fixture(scope="module")
def registered(tracking):
    """``churn`` version 1 in the registry, alias ``champion``; the booster it holds."""
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(tracking)
    try:
        booster = xgboost_booster()
        with mlflow.start_run():
            mlflow.xgboost.log_model(booster, name="model", registered_model_name="churn", pip_requirements=["mlflow"])
        mlflow.MlflowClient().set_registered_model_alias("churn", "champion", "1")
    finally:
        mlflow.set_tracking_uri(previous)
    return booster


@pytest.mark.parametrize("uri", ["models:/churn/1", "models:/churn@champion"])
def test_a_registered_version_serves_as_the_booster_answers(tmp_path, servekit_app, tracking, registered, uri):
    folder = tmp_path / "churn"
    folder.mkdir()
    (folder / "servekit.yaml").write_text(f"options: {{model_uri: '{uri}', tracking_uri: '{tracking}'}}\n")
    client = servekit_app(tmp_path)
    r = client.post("/v1/models/churn:predict", json={"instances": ROWS.tolist()})
    assert r.status_code == 200, r.get_json()
    assert np.array_equal(np.asarray(r.get_json()["predictions"], np.float32), registered.predict(xgb.DMatrix(ROWS)))


def test_an_unknown_version_fails_the_load_saying_why(tmp_path, servekit_app, tracking, registered):
    folder = tmp_path / "churn"
    folder.mkdir()
    (folder / "servekit.yaml").write_text(f"options: {{model_uri: 'models:/churn/9', tracking_uri: '{tracking}'}}\n")
    client = servekit_app(tmp_path)
    status = client.get("/v1/models/churn").get_json()["model_version_status"][0]
    assert status["state"] == "END" and "models:/churn/9" in status["status"]["error_message"]
