"""``GET /openapi.json`` (OpenAPI 3.0) and ``GET /docs``, describing every HTTP route the app has.

The document is built from the app's own URL map the first time it is asked
for, so routes that protocols and plugins add (``register_routes``) appear
without anyone listing them.  What a URL map cannot know (request and response
schemas, V1's ``NAME:verb`` paths that one ``<path:target>`` rule answers)
comes from the hand-written ``openapi.yaml`` beside this module; a
hand-written operation whose rule the app does not have is left out, so the
document never promises a route that does not exist.
"""

from __future__ import annotations

import copy
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from flask import Blueprint, Flask, Response, current_app

from servekit.codecs import json as jsonc
from servekit.version import __version__

bp = Blueprint("openapi", __name__)

_DATA = Path(__file__).with_name("openapi.yaml")
_PARAM = re.compile(r"<(?:[^:<>]+:)?([^<>]+)>")
_TEMPLATE_PARAM = re.compile(r"\{(\w+)\}")
#: ``v1.malformed`` answers GETs no V1 route has (a 404): not an operation to document
_SKIPPED_ENDPOINTS = {"static", "v1.malformed"}
_ERROR = {"$ref": "#/components/schemas/Error"}


@lru_cache(maxsize=1)
def _hand_written() -> dict[str, Any]:
    return yaml.safe_load(_DATA.read_text())


def template_of(rule: str) -> str:
    """Flask's ``/v2/models/<name>`` as OpenAPI's ``/v2/models/{name}``."""
    return _PARAM.sub(lambda m: "{" + m.group(1) + "}", rule)


def routes(app: Flask) -> dict[str, set[str]]:
    """Rule -> methods, without HEAD/OPTIONS and without ``/x/`` twins of ``/x``."""
    found: dict[str, set[str]] = {}
    for rule in app.url_map.iter_rules():
        if rule.endpoint in _SKIPPED_ENDPOINTS:
            continue
        methods = set(rule.methods or ()) - {"HEAD", "OPTIONS"}
        found.setdefault(rule.rule, set()).update(methods)
    for path in [r for r in found if r.endswith("/") and r != "/"]:
        if path.rstrip("/") in found:
            found.pop(path)
    return found


def build(app: Flask) -> dict[str, Any]:
    data = _hand_written()
    served = sorted(app.extensions["servekit"].models)
    settings = app.extensions.get("servekit.settings")
    rules = routes(app)
    paths: dict[str, dict[str, Any]] = {}
    covered: set[tuple[str, str]] = set()

    for key, entry in data["operations"].items():
        method, path = key.split(" ", 1)
        entry = dict(entry)
        rule = entry.pop("rule", None)
        op = copy.deepcopy(data["pieces"][entry.pop("use")]) if "use" in entry else {}
        op.update(copy.deepcopy(entry))
        rule = rule or _rule_for(path, rules)
        if rule is None or method not in rules.get(rule, ()):
            continue
        covered.add((rule, method))
        paths.setdefault(path, {})[method.lower()] = op

    for rule, methods in sorted(rules.items()):
        for method in sorted(methods):
            if (rule, method) in covered:
                continue
            view = current_app.view_functions.get(_endpoint(app, rule, method))
            summary = (view.__doc__ or "").strip().splitlines()[0] if view and view.__doc__ else rule
            paths.setdefault(template_of(rule), {})[method.lower()] = {
                "summary": summary,
                "responses": {"200": {"description": "success", "content": {"application/json": {"schema": {}}}}},
            }

    secured = "servekit.api_key" in app.extensions
    for path, ops in paths.items():
        for op in ops.values():
            _finish(op, path, served, secured and not _is_open(path, settings))
    doc: dict[str, Any] = {
        "openapi": "3.0.3",
        "info": {**data["info"], "version": __version__},
        "tags": data["tags"],
        "paths": dict(sorted(paths.items())),
        "components": copy.deepcopy(data["components"]),
    }
    doc["components"]["schemas"]["ModelName"]["enum"] = served or ["none"]
    if secured:
        doc["components"]["securitySchemes"] = {"apiKey": {"type": "http", "scheme": "bearer"}}
    return doc


def _rule_for(path: str, rules: dict[str, set[str]]) -> str | None:
    for rule in rules:
        if template_of(rule) == path:
            return rule
    return None


def _endpoint(app: Flask, rule: str, method: str) -> str:
    for r in app.url_map.iter_rules():
        if r.rule == rule and method in (r.methods or ()):
            return r.endpoint
    return ""


def _is_open(path: str, settings: Any) -> bool:
    from servekit.routes import is_open_path

    return is_open_path(path, settings.open_paths)


def _finish(op: dict[str, Any], path: str, served: list[str], secured: bool) -> None:
    """Path parameters, the error response, and security for one operation."""
    params = []
    for name in _TEMPLATE_PARAM.findall(path):
        if name == "name":
            schema: dict[str, Any] = {
                "anyOf": [{"$ref": "#/components/schemas/ModelName"}, {"type": "string", "minLength": 1}]
            }
        else:
            schema = {"type": "string", "minLength": 1}
        params.append({"name": name, "in": "path", "required": True, "schema": schema})
    if params:
        op["parameters"] = params + [p for p in op.get("parameters", []) if p.get("in") != "path"]
    responses = op.setdefault("responses", {})
    responses.setdefault("default", {"description": "error", "content": {"application/json": {"schema": _ERROR}}})
    if secured:
        op["security"] = [{"apiKey": []}]
        responses.setdefault(
            "401", {"description": "missing or wrong API key", "content": {"application/json": {"schema": _ERROR}}}
        )


def document(app: Flask) -> dict[str, Any]:
    """The document, built once per app (its routes are fixed once it serves)."""
    cached = app.extensions.get("servekit.openapi")
    if cached is None:
        cached = app.extensions["servekit.openapi"] = build(app)
    return cached


@bp.get("/openapi.json")
def openapi_json():
    """This server's OpenAPI document."""
    return Response(jsonc.dumps(document(current_app._get_current_object())), mimetype="application/json")


@bp.get("/docs")
def docs_page():
    """The OpenAPI document as a self-contained HTML page (no CDN: it works offline)."""
    return Response(_docs_html(), mimetype="text/html")


@lru_cache(maxsize=1)
def _docs_html() -> str:
    return _DATA.with_name("openapi_docs.html").read_text()
