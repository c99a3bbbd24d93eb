"""Shared fixtures for every test of the repository, the core's (``tests/``) and the plugins' (``plugins/*/tests/``).

Tiny real models fitted once per session, and shared servers.  The servekit
pytest plugin (``servekit.testing``) supplies ``servekit_app`` and
``servekit_server``; these fixtures add the models the suite serves.  The
helpers they build with live in ``tests/support/`` (on ``sys.path`` through
``pythonpath`` in pyproject.toml).  The hooks here keep the lanes
(``tests/support/lanes.py``): the quick lane light, a parallel run without the
tests that need the machine alone, and its longest modules first.
"""

from __future__ import annotations

import gc
import shutil
import sys
from pathlib import Path

import cpu_report
import pytest
import server_forks
from lanes import long_poles_first, marks_alone, quick_lane, wholly_slow
from repo_paths import TF_DATA
from servekit.hosts import client as host_client
from servekit.testing import ServerProcess
from sklearn_models import ECHO_MODEL, fit_iris, fit_regressor


def pytest_configure(config: pytest.Config) -> None:
    cpu_report.register(config)  # SERVEKIT_TEST_CPU_REPORT=FILE: CPU seconds per test (tests/support/cpu_report.py)
    # servers fork from a warm process rather than import servekit and scikit-learn afresh (tests/support/server_forks.py)
    ServerProcess.launcher = server_forks.launch
    host_client.launcher = server_forks.launch_host  # and the model hosts the tests start in-process


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--alone",
        action="store_true",
        help="run only the tests marked alone, which a parallel run leaves out (scripts/test.sh runs them after it)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A parallel run (an xdist worker) leaves out the tests that need the machine alone; ``--alone`` runs only them."""
    if config.getoption("alone"):
        keep = [item for item in items if item.get_closest_marker("alone")]
    elif hasattr(config, "workerinput"):
        keep = [item for item in items if not item.get_closest_marker("alone")]
        # the longest modules first, so that none of them is the parallel run's tail
        order = long_poles_first([item.nodeid.split("::")[0] for item in keep])
        keep = [keep[i] for i in order]
    else:
        return
    if len(keep) != len(items):
        kept = set(map(id, keep))
        config.hook.pytest_deselected(items=[item for item in items if id(item) not in kept])
    items[:] = keep


#: How many objects the cyclic garbage collector may track before they are frozen out of its walks.
FREEZE_ABOVE = 100_000


def freeze_what_lives() -> None:
    """What is alive, when it is many, is frozen out of the cyclic garbage collector's walks: each full
    collection would walk all of it again, and none of it is garbage. Refcounting still frees frozen
    objects; only their cycles stay."""
    if len(gc.get_objects(generation=2)) > FREEZE_ABOVE:
        gc.collect()
        gc.freeze()


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection imported: TensorFlow, torch, transformers and the test modules, about 880,000
    objects in the whole suite (a full collection over them: 0.47 s)."""
    freeze_what_lives()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """At the end of each module (its fixtures torn down): a framework one of its tests imported."""
    yield
    if nextitem is None or nextitem.path != item.path:
        freeze_what_lives()


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The quick lane leaves out the modules whose tests are all slow, and ``--alone`` those with no
    test marked alone, without importing them."""
    module = collection_path.suffix == ".py" and collection_path.name.startswith("test_")
    if module and quick_lane(config.option.markexpr) and wholly_slow(collection_path):
        return True
    if module and config.getoption("alone") and not marks_alone(collection_path):
        return True
    return None


#: What the quick lane never imports: seconds each, and absent where the quick lane runs on other Pythons.
HEAVY = ("torch", "tensorflow")


@pytest.fixture(autouse=True)
def quick_lane_stays_light(request: pytest.FixtureRequest):
    """In the quick lane, a test that imports torch or TensorFlow fails, naming what it imported."""
    if not quick_lane(request.config.option.markexpr):
        yield
        return
    before = {name for name in HEAVY if name in sys.modules}
    yield
    imported = sorted(name for name in HEAVY if name in sys.modules and name not in before)
    if imported:
        pytest.fail(f"the quick lane imported {', '.join(imported)}: mark this test slow", pytrace=False)


@pytest.fixture(scope="session")
def tiny_gpt2(tmp_path_factory) -> Path:
    """The tiny random-weight GPT-2 folder of :mod:`generative_models`."""
    from generative_models import build_tiny_gpt2

    return build_tiny_gpt2(tmp_path_factory.mktemp("gpt") / "gpt")


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """The tiny random-weight Llama-style folder of :mod:`generative_models`."""
    from generative_models import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("llama") / "llama")


@pytest.fixture(scope="session")
def sklearn_repo(tmp_path_factory) -> Path:
    """A repository: iris (versions 1 and 2, labels), a regressor, a model.py echo model, a broken model."""
    base = tmp_path_factory.mktemp("repo")
    fit_iris(base / "iris", 1)
    fit_iris(base / "iris", 2)
    (base / "iris" / "servekit.yaml").write_text("version_policy: all\nlabels: {stable: 1, canary: 2}\n")
    fit_regressor(base / "linear")
    echo = base / "echo"
    echo.mkdir()
    (echo / "model.py").write_text(ECHO_MODEL)
    broken = base / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "model.joblib").write_bytes(b"not a pickle")
    return base


@pytest.fixture(scope="session")
def sklearn_server(sklearn_repo):
    """One real gunicorn server over ``sklearn_repo`` shared by the session's tests."""
    from servekit.testing import ServerProcess

    # 'broken' fails on purpose: readiness must not wait for it
    with ServerProcess(sklearn_repo, workers=1, threads=8, strict_readiness=False) as server:
        yield server


@pytest.fixture(scope="session")
def tf_models(tmp_path_factory) -> Path:
    """A writable copy of TF Serving's test SavedModels."""
    base = tmp_path_factory.mktemp("tf")
    for name in ("saved_model_half_plus_three", "saved_model_half_plus_two_2_versions"):
        shutil.copytree(TF_DATA / name, base / name)
    return base
