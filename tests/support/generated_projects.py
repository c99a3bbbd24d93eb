"""The projects ``servekit new`` generates, one per framework, baked and tested once per run.

``tests/scaffold/test_scaffold.py`` checks each generated project (its files, its
Dockerfile, its own tests, the image's start command) and
``tests/e2e/test_generated_container_inputs.py`` serves all of them to send them bad
values.  Baking a project and running its own tests (which train version 1 into
``1/``) takes from seconds to most of a minute per framework, and in a parallel run
the two modules run in different workers: the first to need a project makes it,
under a file lock, and every other reads it.  A test that changes a project works
on a copy.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

#: every framework ``servekit new`` offers, and the libraries its train.py and model need
NEEDS = {
    "sklearn": ["sklearn", "joblib"],
    "torch": ["torch"],
    "tensorflow": ["tensorflow"],
    "huggingface": ["transformers", "torch"],
    "xgboost": ["xgboost", "sklearn"],
    "lightgbm": ["lightgbm", "sklearn"],
    "onnx": ["onnxruntime", "skl2onnx"],
    "custom": [],
}


@dataclass
class Generated:
    """A baked project, as its own tests left it (version 1 trained)."""

    folder: Path
    #: the files right after baking, before its tests ran
    files: set[str]
    #: its own tests' exit status and output (``pytest -q tests`` in the project)
    tests_status: int
    tests_stdout: str
    tests_stderr: str


def bake(out: Path, *answers: str, plugin: bool = False) -> Path:
    """``servekit new --no-input`` with these ``--set`` answers; the created folder."""
    args = [sys.executable, "-m", "servekit", "new", "--no-input", "--output-dir", str(out)]
    if plugin:
        args.append("--plugin")
    for answer in answers:
        args += ["--set", answer]
    result = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return Path(result.stdout.strip().rsplit("created ", 1)[1])


def files_in(folder: Path) -> set[str]:
    return {
        str(p.relative_to(folder))
        for p in folder.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and ".pytest_cache" not in p.parts
    }


def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every worker of this run shares (one per run: xdist names the run)."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    root = tmp_path_factory.getbasetemp().parent / f"generated-{run}" if run else tmp_path_factory.getbasetemp()
    folder = root / "generated-projects"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def generated(tmp_path_factory: pytest.TempPathFactory, framework: str) -> Generated:
    """The project ``servekit new`` makes for ``framework`` ("Demo FRAMEWORK"), its own tests run."""
    root = shared_root(tmp_path_factory)
    record = root / f"{framework}.json"
    with (root / f"{framework}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not record.exists():
            project = bake(root, f"project_name=Demo {framework}", f"framework={framework}")
            files = files_in(project)
            tests = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                cwd=project,
                capture_output=True,
                text=True,
                timeout=600,
            )
            made = {
                "folder": str(project),
                "files": sorted(files),
                "status": tests.returncode,
                "stdout": tests.stdout[-5000:],
                "stderr": tests.stderr[-2000:],
            }
            record.write_text(json.dumps(made))
    made = json.loads(record.read_text())
    return Generated(Path(made["folder"]), set(made["files"]), made["status"], made["stdout"], made["stderr"])


def assert_tests_passed(project: Generated) -> None:
    """The project's own tests passed, and trained version 1 first."""
    assert project.tests_status == 0, project.tests_stdout + project.tests_stderr
    assert re.search(r"\d+ passed", project.tests_stdout) and " failed" not in project.tests_stdout
    assert (project.folder / "1").is_dir()
