"""KServe's own InferenceRESTClient against servekit: V1 liveness (``GET /``), V1 readiness
(``GET /v1/models/NAME``: ``name`` and ``ready``), V1 predict and V2 infer.

KServe's client pins protobuf < 7 while servekit's gRPC stubs need 7, so it runs in a
virtualenv of its own, ``.venv-kserve``, that ``scripts/test.sh`` makes.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from repo_paths import REPO as ROOT
from servekit.testing import ServerProcess

pytestmark = pytest.mark.slow

KSERVE_PYTHON = ROOT / ".venv-kserve" / "bin" / "python"


def test_kserve_rest_client_v1_and_v2(tmp_path):
    if not KSERVE_PYTHON.exists():
        pytest.skip("KServe's client is not installed: scripts/test.sh makes .venv-kserve")
    from sklearn_models import fit_iris

    fit_iris(tmp_path / "iris", named=False)
    with ServerProcess(tmp_path) as server:
        out = subprocess.run(
            [str(KSERVE_PYTHON), str(ROOT / "tests" / "support" / "kserve_client_calls.py"), server.url, "iris"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["v1_live"] is True and found["v1_model_ready"] is True
    assert found["v1_predict"] == {"predictions": ["setosa"]}
    assert found["v2_ready"] is True and found["v2_model_ready"] is True
    assert found["v2_infer"] == {"predict": ["setosa"]}
    assert found["v1_unknown_ready"] != "answered"


def test_kserve_grpc_client_reads_bytes_answers(tmp_path):
    """KServe's gRPC client sends typed contents and reads only typed contents back."""
    if not KSERVE_PYTHON.exists():
        pytest.skip("KServe's client is not installed: scripts/test.sh makes .venv-kserve")
    import shutil

    for name in ("simple", "simple_string"):
        shutil.copytree(ROOT / "tests" / "data" / "triton" / name, tmp_path / name)
    with ServerProcess(tmp_path, grpc_port="auto", workers=2) as server:
        out = subprocess.run(
            [
                str(KSERVE_PYTHON),
                str(ROOT / "tests" / "support" / "kserve_grpc_client_calls.py"),
                f"127.0.0.1:{server.grpc_port}",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["model_ready"] is True
    assert found["strings"]["OUTPUT0"] == [str(i + 1) for i in range(16)]
    assert found["strings"]["OUTPUT1"] == [str(i - 1) for i in range(16)]
    assert found["numbers"]["OUTPUT0"] == [i + 1 for i in range(16)]
