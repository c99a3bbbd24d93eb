"""gRPC at start-up: which faults turn it off, which stop the server, and the protobufs it runs on.

Only a missing grpcio means "HTTP only"; a gRPC server that cannot start for
any other reason stops the server with the real error.  A model.py imports its
sibling modules without touching ``sys.path``, which raced with every other
import (gRPC's too).  The generated ``*_pb2`` modules carry no protoc
runtime-version guard, so the protobuf a Triton client pulls in (6.x) works.
"""

from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from repo_paths import REPO
from servekit.hooks import manager as plugins
from servekit.testing import ServerProcess
from sklearn_models import ECHO_MODEL

PROTOS = REPO / "framework" / "servekit" / "protocols" / "grpc" / "protos"
#: Older protobuf releases, installed by scripts/test.sh with ``pip install --target``:
#: the grpc extra's floor, and the 6.x that ``pip install "tritonclient[grpc]"`` moves to.
OLD_PROTOBUFS = ("5.26.1", "6.33.5")

#: Imports every generated module and round-trips a TF Serving and a V2 message.
CHECK_PROTOS = """
import importlib, pkgutil
import google.protobuf
import servekit.protocols.grpc.protos as protos
from servekit.protocols.grpc.protos.inference import grpc_service_pb2 as v2
from servekit.protocols.grpc.protos.tensorflow_serving.apis import predict_pb2

for m in pkgutil.walk_packages(protos.__path__, protos.__name__ + "."):
    if m.name.endswith(("_pb2", "_pb2_grpc")):
        importlib.import_module(m.name)
r = predict_pb2.PredictRequest()
r.model_spec.name = "m"
r.model_spec.version.value = 3
r.inputs["x"].float_val.extend([1.0, 2.0])
assert predict_pb2.PredictRequest.FromString(r.SerializeToString()) == r
q = v2.ModelInferRequest(model_name="m")
q.inputs.add(name="x", datatype="FP32", shape=[2]).contents.fp32_contents.extend([1.0, 2.0])
assert list(v2.ModelInferRequest.FromString(q.SerializeToString()).inputs[0].contents.fp32_contents) == [1.0, 2.0]
print(google.protobuf.__version__)
"""


def _old_protobuf(version: str) -> Path:
    target = REPO / ".cache" / f"protobuf-{version}"
    if not (target / "google" / "protobuf").is_dir():
        pytest.skip(f"protobuf {version} is not under {target} (scripts/test.sh installs it)")
    return target


def _pythonpath(*first: Path) -> str:
    return os.pathsep.join([*map(str, first), str(REPO / "framework"), str(REPO / "plugins"), *sys.path[1:]])


def test_generated_modules_carry_no_runtime_version_guard():
    generated = sorted(PROTOS.rglob("*_pb2.py"))
    assert generated
    guarded = [p.name for p in generated if "ValidateProtobufRuntimeVersion" in p.read_text()]
    assert guarded == []


@pytest.mark.slow  # a Python of its own per protobuf
@pytest.mark.parametrize("version", OLD_PROTOBUFS)
def test_generated_modules_work_on_an_older_protobuf(version):
    target = _old_protobuf(version)
    env = {**os.environ, "PYTHONPATH": _pythonpath(target)}
    done = subprocess.run([sys.executable, "-c", CHECK_PROTOS], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == version


def _echo_repo(base: Path) -> Path:
    (base / "echo" / "1").mkdir(parents=True)
    (base / "echo" / "1" / "model.py").write_text(ECHO_MODEL)
    return base


@pytest.mark.slow
def test_grpc_serves_on_protobuf_6(tmp_path):
    grpc = pytest.importorskip("grpc")
    from servekit.protocols.grpc.protos.inference import grpc_service_pb2 as v2
    from servekit.protocols.grpc.protos.inference import grpc_service_pb2_grpc as v2_grpc

    target = _old_protobuf("6.33.5")
    server = ServerProcess(_echo_repo(tmp_path), grpc_port="auto", env={"PYTHONPATH": _pythonpath(target)})
    try:
        server.start()
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            request = v2.ModelInferRequest(model_name="echo")
            request.inputs.add(name="x", datatype="FP32", shape=[2]).contents.fp32_contents.extend([1.5, 2.5])
            answer = v2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
        assert list(answer.outputs[0].contents.fp32_contents) == [3.0, 5.0]
    finally:
        server.stop()
    assert "VersionError" not in server.output()


@pytest.mark.slow
def test_a_broken_grpc_stops_the_server_with_the_real_error(tmp_path):
    """grpcio present but failing to import: no "HTTP only", the server exits naming the fault."""
    broken = tmp_path / "site" / "grpc"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text(
        'raise ImportError("cannot import name cygrpc (a grpcio built for another Python)", name="grpc._cython")\n'
    )
    server = ServerProcess(
        _echo_repo(tmp_path / "models"), grpc_port="auto", workers=2, env={"PYTHONPATH": _pythonpath(broken.parent)}
    )
    server.start(wait=False)
    try:
        code = server.proc.wait(60)
    finally:
        server.stop()
    output = server.output()
    assert code == 3, output
    assert "cannot import name cygrpc" in output
    assert "gRPC is off" not in output


def test_model_py_imports_its_siblings_without_touching_sys_path(tmp_path):
    (tmp_path / "helper.py").write_text("import os, sys\nFOLDER_ON_PATH = os.path.dirname(__file__) in sys.path\n")
    (tmp_path / "model.py").write_text("import helper\nSEEN = helper.FOLDER_ON_PATH\n")
    other = tmp_path / "other"  # another model's helper.py, imported first
    other.mkdir()
    (other / "helper.py").write_text("FOLDER_ON_PATH = None\n")
    (other / "model.py").write_text("import helper\n")
    plugins.import_file(other / "model.py", fresh=True)
    folder = tmp_path
    before = list(sys.path)
    module = plugins.import_file(folder / "model.py", fresh=True)
    assert module.SEEN is False
    assert sys.path == before
    assert sys.modules["helper"].__file__ == str(folder / "helper.py")


@pytest.mark.slow  # 5,000 lookups against a thread that loads all the while: seconds, not milliseconds
def test_loading_model_py_never_hides_site_packages_from_another_thread(tmp_path):
    """The import system walks sys.path itself; a model.py loading beside it must not shift that list."""
    (tmp_path / "helper.py").write_text("VALUE = 1\n")
    (tmp_path / "model.py").write_text("import helper\n")
    stop = threading.Event()

    def load_again_and_again():
        while not stop.is_set():
            plugins.import_file(tmp_path / "model.py", fresh=True)

    loader = threading.Thread(target=load_again_and_again)
    loader.start()
    try:
        misses = sum(importlib.machinery.PathFinder.find_spec("pluggy") is None for _ in range(5000))
    finally:
        stop.set()
        loader.join()
    assert misses == 0


def test_a_version_s_model_py_runs_afresh_each_time_it_loads(tmp_path):
    (tmp_path / "helper.py").write_text("ANSWER = 1\n")
    (tmp_path / "model.py").write_text("import helper\nANSWER = helper.ANSWER\n")
    first = plugins.import_file(tmp_path / "model.py", fresh=True)
    (tmp_path / "helper.py").write_text("ANSWER = 2\n")
    (tmp_path / "model.py").write_text("import helper\nANSWER = helper.ANSWER * 10\n")
    second = plugins.import_file(tmp_path / "model.py", fresh=True)
    assert (first.ANSWER, second.ANSWER) == (1, 20)
