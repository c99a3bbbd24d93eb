"""Cookiecutter extension: the project's Dockerfile, gunicorn config and manifests.

cookiecutter loads this file itself (``_extensions`` in cookiecutter.json), so
plain ``cookiecutter cookiecutter/container`` renders those files where servekit
is not installed.  They come from the same template text and the same renderer
``servekit build`` uses: ``servekit/scaffold/render.py``, loaded here by its path
in this package tree (it imports only Jinja and the standard library).
"""

import importlib.util
import sys
from pathlib import Path

from jinja2.ext import Extension

# servekit/scaffold/templates/cookiecutter/container/ -> servekit/scaffold/ (through the repository's links too)
RENDERER = Path(__file__).resolve().parents[3] / "render.py"
_MODULE = "_servekit_scaffold_render"


def _renderer():
    module = sys.modules.get(_MODULE)
    if module is None:
        spec = importlib.util.spec_from_file_location(_MODULE, RENDERER)
        module = importlib.util.module_from_spec(spec)
        sys.modules[_MODULE] = module  # dataclasses look their module up while it runs
        spec.loader.exec_module(module)
    return module


def servekit_file(path, answers):
    """The text of one build file (``Dockerfile``, ``deploy/kubernetes.yaml``...) for these answers."""
    return _renderer().project_file(path, dict(answers))


class ServekitFiles(Extension):
    """Adds the ``servekit_file(path, cookiecutter)`` global to cookiecutter's Jinja environment."""

    def __init__(self, environment):
        super().__init__(environment)
        environment.globals["servekit_file"] = servekit_file
