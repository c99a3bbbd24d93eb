"""The app factory: ``create_app``'s routes."""

from __future__ import annotations

from flask import url_for
from servekit.server.app import LazyBuilderRule
from sklearn_models import ECHO_MODEL
from werkzeug.routing import Rule


def test_a_route_makes_its_url_builder_on_first_use_and_builds_what_werkzeug_builds(tmp_path, servekit_app):
    (tmp_path / "echo").mkdir()
    (tmp_path / "echo" / "model.py").write_text(ECHO_MODEL)
    app = servekit_app(tmp_path).application
    rules = [rule for rule in app.url_map.iter_rules() if rule.endpoint != "static"]  # Flask's own, made with the app
    assert rules and all(isinstance(rule, LazyBuilderRule) for rule in rules)
    # werkzeug still makes its builders in the method the rule defers (else every app makes them all again)
    assert LazyBuilderRule._compile_builder is not Rule._compile_builder
    assert callable(getattr(Rule, "_compile_builder", None))
    with app.test_request_context():
        assert url_for("v2.infer", name="echo") == "/v2/models/echo/infer"
        assert url_for("v2.infer", name="echo", extra="1") == "/v2/models/echo/infer?extra=1"
        assert url_for("health.live") == "/v2/health/live"
