"""Fixtures for this model container.

servekit's pytest plugin (installed with servekit) supplies ``servekit_app`` (an
in-process client, models loaded) and ``servekit_server`` (the real server under
gunicorn on a free local port); these fixtures point them at this folder.
"""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]
MODEL_NAME = {{ cookiecutter.model_name|tojson }}


@pytest.fixture(scope="session")
def model_dir() -> Path:
    """This folder is the model folder; train version 1 first if no version exists yet."""
    if not any(p.is_dir() and p.name.isdigit() for p in PROJECT.iterdir()):
        runpy.run_path(str(PROJECT / "train.py"), run_name="train")["main"](PROJECT / "1")
    return PROJECT


@pytest.fixture
def client(servekit_app, model_dir):
    """A Flask test client speaking HTTP to servekit in this process."""
    return servekit_app(model_dir, model_name=MODEL_NAME)


@pytest.fixture(scope="session")
def server(model_dir):
    """``servekit serve`` under gunicorn on a free 127.0.0.1 port, shared by the session."""
    from servekit.testing import ServerProcess

    with ServerProcess(model_dir, model_name=MODEL_NAME, workers=1) as running:
        yield running
