"""servekit as a KServe serving runtime: started with the arguments KServe passes, on the folder its storage initializer fills."""

from __future__ import annotations

import argparse
import shutil
import sys

import numpy as np
import pytest
import requests
import yaml
from servekit.scaffold import project as scaffold
from servekit.server.settings import add_arguments, resolve
from servekit.testing import ServerProcess, free_port
from sklearn_models import fit_iris


def runtime_container() -> dict:
    manifests = scaffold.render_manifests(scaffold.BuildOptions(model_name="iris", image="registry.local/servekit:1"))
    runtime = yaml.safe_load(manifests["kserve-runtime.yaml"])
    (container,) = runtime["spec"]["containers"]
    return container


def parse(argv: list[str]):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return resolve(parser.parse_args(argv), environ={})


# -- the arguments ------------------------------------------------------------------------


def test_kserve_spellings_set_the_same_settings_as_servekits_own():
    kserve = parse(["--model_name=iris", "--model_dir=/mnt/models", "--http_port=9080", "--grpc_port=9081"])
    own = parse(["/mnt/models", "--model-name", "iris", "--http-port", "9080", "--grpc-port", "9081"])
    assert kserve == own
    assert (kserve.paths, kserve.model_name, kserve.http_port, kserve.grpc_port) == (
        ["/mnt/models"],
        "iris",
        9080,
        9081,
    )
    assert parse(["--max_threads", "4", "--workers", "3", "m"]).threads == 4


def test_a_model_dir_and_a_path_together_are_refused():
    with pytest.raises(ValueError, match="--model_dir: give the model folder once"):
        parse(["--model_dir=/mnt/models", "/elsewhere"])


def test_the_runtime_passes_exactly_the_arguments_servekit_accepts():
    container = runtime_container()
    assert container["name"] == "kserve-container" and container["command"] == ["servekit", "serve"]
    assert container["args"] == [
        "--model_name={{.Name}}",
        "--model_dir=/mnt/models",
        "--http_port=8080",
        "--grpc_port=8081",
    ]
    settings = parse([a.replace("{{.Name}}", "sklearn-iris") for a in container["args"]])
    assert settings.paths == ["/mnt/models"] and settings.model_name == "sklearn-iris"


# -- started as KServe starts it ------------------------------------------------------------


class StartedByKServe(ServerProcess):
    """The runtime's container command and arguments, with the pod's paths and ports swapped for the test's."""

    def __init__(self, models, container: dict, name: str):
        self.http_port, self.grpc = free_port(), free_port()
        swap = {
            "{{.Name}}": name,
            "/mnt/models": str(models),
            "=8080": f"={self.http_port}",
            "=8081": f"={self.grpc}",
        }
        self.args = []
        for arg in container["args"]:
            for old, new in swap.items():
                arg = arg.replace(old, new)
            self.args.append(arg)
        env = {e["name"]: e["value"] for e in container.get("env", [])}
        env["SERVEKIT_WORKERS"] = "1"  # a test server: one worker is enough
        super().__init__(env=env, http_port=self.http_port)
        self.head = container["command"]

    def command(self) -> list[str]:
        assert self.head[0] == "servekit"
        # bound to loopback in the suite; in a pod servekit listens on every address
        return [sys.executable, "-m", "servekit", *self.head[1:], *self.args, "--host", "127.0.0.1"]


@pytest.mark.slow
def test_servekit_started_as_kserve_starts_it_predicts_on_v1_v2_and_grpc(tmp_path):
    import tritonclient.grpc as grpcclient

    # the storage initializer copies storageUri's files straight into /mnt/models
    fitted = fit_iris(tmp_path / "fit", named=False)
    models = tmp_path / "mnt" / "models"
    models.mkdir(parents=True)
    shutil.copy(fitted, models / "model.joblib")
    with StartedByKServe(models, runtime_container(), "sklearn-iris") as server:
        url = server.url
        assert requests.get(url + "/v2/health/ready").status_code == 200
        assert requests.get(url + "/v1/models/sklearn-iris").json()["model_version_status"][0]["state"] == "AVAILABLE"
        v1 = requests.post(url + "/v1/models/sklearn-iris:predict", json={"instances": [[6.8, 2.8, 4.8, 1.4]]})
        assert v1.status_code == 200 and v1.json()["predictions"] == ["versicolor"]
        v2 = requests.post(
            url + "/v2/models/sklearn-iris/infer",
            json={"inputs": [{"name": "input-0", "shape": [1, 4], "datatype": "FP32", "data": [6.8, 2.8, 4.8, 1.4]}]},
        )
        assert v2.status_code == 200, v2.text
        assert v2.json()["outputs"][0]["data"] == ["versicolor"]
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc}")
        assert client.is_model_ready("sklearn-iris")
        tensor = grpcclient.InferInput("input-0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.array([[6.8, 2.8, 4.8, 1.4]], dtype=np.float32))
        answer = client.infer("sklearn-iris", [tensor]).as_numpy(v2.json()["outputs"][0]["name"])
        assert answer.tolist() == [b"versicolor"]
        client.close()
        unknown = requests.post(url + "/v1/models/iris:predict", json={"instances": [[6.8, 2.8, 4.8, 1.4]]})
        assert unknown.status_code == 404 and "error" in unknown.json()  # served under the InferenceService's name
