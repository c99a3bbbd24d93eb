"""Liveness and readiness, as orchestrators and test harnesses probe them (V2 health paths)."""

from __future__ import annotations

from flask import Blueprint

from .http import dataplane, json_response

bp = Blueprint("health", __name__)


@bp.get("/v2/health/live")
def live():
    return json_response({"live": True})


@bp.get("/v2/health/ready")
def ready():
    is_ready = dataplane().ready
    return json_response({"ready": is_ready}, 200 if is_ready else 503)
