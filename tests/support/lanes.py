"""The suite's two lanes: the quick one (``-m "not slow"``) and the whole suite.

A module whose tests are all slow says so once, ``pytestmark = pytest.mark.slow``
at its top level; the quick lane then does not even import it (``conftest.py``),
so the frameworks such modules import (torch, TensorFlow) stay out of it.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path


@cache
def wholly_slow(path: Path) -> bool:
    """Whether every test of the module is slow (``pytestmark = pytest.mark.slow`` at module level)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            return "slow" in ast.unparse(node.value)
    return False


def marks_alone(path: Path) -> bool:
    """Whether the module may hold a test that needs the machine alone (it names the ``alone`` mark)."""
    return "mark.alone" in path.read_text()


def quick_lane(markexpr: str) -> bool:
    """Whether a run selects the quick lane: ``-m "not slow"``, however it is spaced."""
    return " ".join(markexpr.split()) == "not slow"


#: The modules that take longest (seconds of their own, measured with ``--durations=0`` on 2 CPUs),
#: longest first.  A parallel run hands them out first, so no worker starts one of them while the
#: others are finishing: a module's tests run in one worker, and one started last is the run's tail.
LONG_POLES = (
    "tests/scaffold/test_scaffold.py",  # 300 s: every container template baked and its tests run
    "tests/scaffold/test_docker_image.py",  # 250 s: real image builds, offline ones included
    "tests/server/test_engines.py",  # 160 s: the protocol suites under each engine
    "tests/e2e/test_security_fuzz.py",  # 125 s: schemathesis over every operation
    "tests/control/test_control_plane.py",  # 120 s: load/unload cycles under load, per engine
    "tests/e2e/test_generated_container_inputs.py",  # 90 s: every framework's container baked and trained
    "tests/e2e/test_scaleout_rehearsal.py",  # 70 s
    "tests/e2e/test_frameworks_serving.py",  # 65 s
    "tests/observability/test_generation_signals.py",  # 60 s: a real Prometheus over two placements
    "tests/storage/test_storage.py",  # 56 s
    "tests/scaffold/test_fresh_install.py",  # 55 s: fresh virtualenvs run the docs' commands
    # then the middle-sized ones (30-60 s), so that the run's last minutes hold only short modules
    "tests/test_docs_examples.py",  # a server with TensorFlow, torch and the RAG stack; a program per example
    "tests/scaffold/test_templates.py",
    "tests/scaffold/test_scaffold_plugin.py",
    "tests/scaffold/test_build_options.py",
    "tests/e2e/test_openai_client.py",
    "plugins/servekit_mlflow/tests/test_mlflow_registry.py",
    "tests/e2e/test_faults.py",
    "plugins/servekit_tensorflow/tests/test_tflite.py",
    "tests/test_typecheck.py",  # mypy, cold in a fresh clone
    # then the quick lane's longest (3-8 CPU-s each there), so that its last seconds hold only short ones
    "tests/hosts/test_hosts.py",
    "plugins/servekit_onnx/tests/test_onnx.py",
    "plugins/servekit_mlflow/tests/test_mlflow.py",
    "plugins/servekit_sklearn/tests/test_sklearn_plugin.py",
    "tests/scaffold/test_manifests.py",
    "tests/dataplane/test_repository.py",
    "tests/server/test_limits.py",
    "plugins/servekit_xgboost/tests/test_xgboost.py",
    "tests/scaffold/test_cpu_install.py",
)


def long_poles_first(paths: list[str]) -> list[int]:
    """The order to run modules in: the long poles first (in their order), then the rest as collected."""
    rank = {path: index for index, path in enumerate(LONG_POLES)}
    return sorted(range(len(paths)), key=lambda i: (rank.get(paths[i], len(rank)), i))
