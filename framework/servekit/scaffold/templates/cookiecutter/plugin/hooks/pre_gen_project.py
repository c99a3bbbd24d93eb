"""Reject names pip, Python or servekit would refuse, before any file is written."""

import keyword
import re
import sys

SLUG = {{ cookiecutter.project_slug|tojson }}
PACKAGE = {{ cookiecutter.package_name|tojson }}
ENTRY_POINT = {{ cookiecutter.entry_point|tojson }}

problems = []
if not re.fullmatch(r"[a-z0-9]([a-z0-9._-]*[a-z0-9])?", SLUG):
    problems.append(f"distribution name {SLUG!r} is not valid: use lower-case letters, digits, '.', '_' and '-'")
if not PACKAGE.isidentifier() or keyword.iskeyword(PACKAGE) or PACKAGE != PACKAGE.lower():
    problems.append(f"package name {PACKAGE!r} is not a valid lower-case Python identifier")
if not re.fullmatch(r"[a-z][a-z0-9_]*", ENTRY_POINT):
    problems.append(f"plugin name {ENTRY_POINT!r} is not valid: use lower-case letters, digits and '_'")
if problems:
    for problem in problems:
        print(f"servekit new --plugin: {problem}", file=sys.stderr)
    sys.exit(1)
