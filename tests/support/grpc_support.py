"""One real ``servekit serve`` with gRPC on, shared by every ``test_grpc_*`` module.

Each module declares a session fixture that calls :func:`shared_server`; the
first call starts the server and the process ends with the session, so the
models (sklearn, small ``model.py`` models and, once the TensorFlow plugin is
installed, TF Serving's test SavedModels) load once.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from repo_paths import TF_DATA
from servekit.testing import ServerProcess
from sklearn_models import fit_iris, fit_regressor

#: Returns its inputs unchanged: every dtype round-trips through the wire formats.
#: It declares an input, so a single tensor reaches it by name (as a dict), not as one array.
ECHO_MODEL = """
import servekit
from servekit.types import ModelMetadata, Signature, TensorSpec

@servekit.hookimpl
def load(path):
    return "echo"

@servekit.hookimpl
def metadata(model):
    return ModelMetadata(signatures={"serving_default": Signature(inputs=[TensorSpec("x", "", None)])})

@servekit.hookimpl
def predict(inputs):
    return dict(inputs) if isinstance(inputs, dict) else {"output_0": inputs}
"""

#: A streaming model: yields ``{"y": 2 * x[i:i+1]}`` for each row i of input ``x``.
CHUNKS_MODEL = """
import servekit

@servekit.hookimpl
def load(path):
    return "chunks"

@servekit.hookimpl
def predict(inputs):
    x = inputs["x"] if isinstance(inputs, dict) else inputs  # one tensor arrives as one array
    return ({"y": x[i:i + 1] * 2} for i in range(len(x)))
"""

TF_MODELS = ("saved_model_half_plus_two_2_versions", "saved_model_half_plus_three")
HALF_PLUS_TWO = TF_MODELS[0]

_state: dict[str, ServerProcess] = {}


def tf_plugin_installed() -> bool:
    return importlib.util.find_spec("servekit_tensorflow") is not None


def build_repo(base: Path) -> Path:
    fit_iris(base / "iris", 1)
    fit_iris(base / "iris", 2)
    (base / "iris" / "servekit.yaml").write_text("version_policy: all\nlabels: {stable: 1, canary: 2}\n")
    fit_regressor(base / "linear")
    for name, source in (("echo", ECHO_MODEL), ("chunks", CHUNKS_MODEL)):
        (base / name / "1").mkdir(parents=True)
        (base / name / "1" / "model.py").write_text(source)
    broken = base / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "model.joblib").write_bytes(b"not a pickle")
    if tf_plugin_installed():
        for name in TF_MODELS:
            shutil.copytree(TF_DATA / name, base / name)
        (base / "saved_model_half_plus_two_2_versions" / "servekit.yaml").write_text(
            "version_policy: all\nlabels: {stable: 123, canary: 124}\n"
        )
    return base


def shared_server(request, tmp_path_factory) -> ServerProcess:
    """The session's gRPC server, started on first use and stopped when the session ends."""
    if "server" not in _state:
        repo = build_repo(tmp_path_factory.mktemp("grpc_repo"))
        server = ServerProcess(
            repo, grpc_port="auto", workers=1, threads=8, strict_readiness=False, model_control_mode="explicit"
        ).start(timeout=300)
        _state["server"] = server
        request.session.config.add_cleanup(server.stop)
    return _state["server"]
