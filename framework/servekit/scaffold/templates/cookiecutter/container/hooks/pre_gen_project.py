"""Reject names servekit, Docker or Kubernetes would refuse, before any file is written."""

import re
import sys

SLUG = {{ cookiecutter.project_slug|tojson }}
MODEL_NAME = {{ cookiecutter.model_name|tojson }}
PYTHON = {{ cookiecutter.python_version|tojson }}

problems = []
if not re.fullmatch(r"[a-z][a-z0-9-]{0,62}", SLUG) or SLUG.endswith("-"):
    problems.append(
        f"folder name {SLUG!r} is not valid: use lower-case letters, digits and '-', "
        "starting with a letter (it also names the image and the Kubernetes objects)"
    )
# the model name defaults to the folder name: one mistake, one line
if MODEL_NAME != SLUG and (not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", MODEL_NAME) or ".." in MODEL_NAME):
    problems.append(
        f"model name {MODEL_NAME!r} is not valid: use letters, digits, '.', '_' and '-', "
        "starting with a letter or digit (it appears in /v1/models/NAME)"
    )
if not re.fullmatch(r"3\.\d{1,2}", PYTHON):
    problems.append(f"python version {PYTHON!r} is not valid: expected e.g. 3.12")
if problems:
    for problem in problems:
        print(f"servekit new: {problem}", file=sys.stderr)
    sys.exit(1)
