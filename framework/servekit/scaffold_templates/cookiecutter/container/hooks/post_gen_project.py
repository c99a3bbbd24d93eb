"""Keep the chosen framework's files, then write the Docker files from servekit's one template."""

import shutil
import sys
from pathlib import Path

FRAMEWORK = {{ cookiecutter.framework|tojson }}
MODEL_NAME = {{ cookiecutter.model_name|tojson }}
GPU = "{{ cookiecutter.gpu }}".strip().lower() in ("true", "yes", "y", "1", "on")
PYTHON = {{ cookiecutter.python_version|tojson }}

project = Path.cwd()
frameworks = project / "_frameworks"
chosen = frameworks / FRAMEWORK
for source in sorted(chosen.rglob("*")):
    if source.is_file():
        target = project / source.relative_to(chosen)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(source), str(target))
shutil.rmtree(frameworks)
(project / "gitignore").rename(project / ".gitignore")

try:
    from servekit.scaffold import finish_container_project
except ImportError:
    print(
        "servekit is not importable here, so no Dockerfile was written; "
        "install servekit and run `servekit build .` in the new folder",
        file=sys.stderr,
    )
else:
    finish_container_project(project, MODEL_NAME, GPU, PYTHON)
