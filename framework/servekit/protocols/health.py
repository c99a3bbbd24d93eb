"""Liveness and readiness, as orchestrators and test harnesses probe them (V2 health paths).

Liveness is 200 whenever the process can answer: restarting a server whose
model is broken would not mend the model.  Readiness decides whether traffic
comes here, so it is strict by default (Triton's ``--strict-readiness``): a
container whose model failed to load answers 503 and gets no requests.
``--no-strict-readiness`` keeps a multi-model server in rotation while one
model is down.  Each model's own state stays visible on its status and
``.../ready`` either way.
"""

from __future__ import annotations

from flask import Blueprint

from servekit.protocols.http import dataplane, json_response

bp = Blueprint("health", __name__)


@bp.get("/v2/health/live")
def live():
    return json_response({"live": True})


@bp.get("/v2/health/ready")
def ready():
    is_ready, reason = dataplane().readiness()
    if is_ready:
        return json_response({"ready": True})
    return json_response({"ready": False, "reason": reason}, 503)
