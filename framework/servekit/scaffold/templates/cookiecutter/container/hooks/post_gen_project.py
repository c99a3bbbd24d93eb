"""Keep the chosen framework's files and give the dot-files their names.

Standard library only: plain ``cookiecutter`` runs this where servekit is not
installed.  The Dockerfile, gunicorn config and manifests are already rendered
(by the ``servekit_files`` extension, from servekit's one template source).
"""

import shutil
from pathlib import Path

FRAMEWORK = {{ cookiecutter.framework|tojson }}

project = Path.cwd()
frameworks = project / "_frameworks"
chosen = frameworks / FRAMEWORK
for source in sorted(chosen.rglob("*")):
    if source.is_file():
        target = project / source.relative_to(chosen)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(source), str(target))
shutil.rmtree(frameworks)
# Shipped without their dot (package data globs skip dot-files); named here.
for name in ("gitignore", "dockerignore"):
    (project / name).rename(project / f".{name}")
