"""One error tree: each class carries its HTTP status and gRPC code.

Raise these anywhere (codecs, data plane, plugins); one handler per protocol
turns them into that protocol's error shape.  Messages say what was expected and
what was found; they never carry stack traces or file paths.
"""

from __future__ import annotations

from typing import Any

from servekit.routes import is_openai_path


class ServekitError(Exception):
    """Base of every error servekit reports to a client."""

    status = 500
    grpc_code = "INTERNAL"
    openai_type = "server_error"

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param


class BadRequest(ServekitError):
    status = 400
    grpc_code = "INVALID_ARGUMENT"
    openai_type = "invalid_request_error"


class Unauthorized(ServekitError):
    status = 401
    grpc_code = "UNAUTHENTICATED"
    openai_type = "authentication_error"


class NotFound(ServekitError):
    status = 404
    grpc_code = "NOT_FOUND"
    openai_type = "not_found_error"


class MethodNotAllowed(ServekitError):
    status = 405
    grpc_code = "UNIMPLEMENTED"
    openai_type = "invalid_request_error"


class PayloadTooLarge(ServekitError):
    status = 413
    grpc_code = "RESOURCE_EXHAUSTED"
    openai_type = "invalid_request_error"


class UnsupportedMediaType(ServekitError):
    status = 415
    grpc_code = "INVALID_ARGUMENT"
    openai_type = "invalid_request_error"


class TooManyRequests(ServekitError):
    status = 429
    grpc_code = "RESOURCE_EXHAUSTED"
    openai_type = "rate_limit_error"


class ModelFailure(ServekitError):
    """The model's own code raised while serving a request."""

    status = 500
    grpc_code = "INTERNAL"


class NotImplementedByModel(ServekitError):
    """The model has no implementation of the hook this endpoint needs."""

    status = 501
    grpc_code = "UNIMPLEMENTED"
    openai_type = "invalid_request_error"


class NotReady(ServekitError):
    """The model (or server) exists but cannot serve yet, or failed to load."""

    status = 503
    grpc_code = "UNAVAILABLE"


class NotResident(NotReady):
    """A model the memory budget unloaded could not be loaded again in time: retry shortly."""

    retry_after = 1


def retry_headers(exc: ServekitError) -> dict[str, str]:
    """``Retry-After`` for an error that a client should retry (``{}`` otherwise)."""
    seconds = getattr(exc, "retry_after", None)
    return {"Retry-After": str(seconds)} if seconds else {}


class Timeout(ServekitError):
    status = 504
    grpc_code = "DEADLINE_EXCEEDED"


class RequestTimeout(ServekitError):
    """The client sent its request too slowly (``--body-timeout``)."""

    status = 408
    grpc_code = "DEADLINE_EXCEEDED"
    openai_type = "invalid_request_error"


class Forbidden(ServekitError):
    """The server is configured to refuse this operation (e.g. model control is off)."""

    status = 403
    grpc_code = "PERMISSION_DENIED"
    openai_type = "permission_error"


class UnknownModel(NotFound):
    """A request named a model this server does not serve; the message lists those it does.

    ``message`` keeps TF Serving's wording (V1 and TF Serving gRPC clients know
    it); ``v2_message`` is Triton's, for the V2 protocol on HTTP and gRPC.
    """

    def __init__(self, name: str, served: list[str]):
        self.name = name
        self.served = served
        super().__init__(f"Servable not found for request: Latest({name}){served_models(served)}")

    @property
    def v2_message(self) -> str:
        return f"Request for unknown model: '{self.name}' is not found{served_models(self.served)}"


def served_models(names: list[str], limit: int = 20) -> str:
    """The tail of a not-found message: which models a client could have asked for."""
    if not names:
        return "; this server serves no models"
    shown = ", ".join(sorted(names)[:limit])
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return f"; models served here: {shown}{more}"


# -- the one renderer -----------------------------------------------------------------------


def openai_error(exc: ServekitError) -> dict[str, Any]:
    """OpenAI's error object for ``exc``."""
    return openai_error_object(exc.message, exc.status, kind=exc.openai_type, param=exc.param)


def openai_error_object(
    message: str, status: int, *, kind: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """OpenAI's error object, ``{"error": {"message", "type", "param", "code"}}``, the one place it is built.

    ``code`` is the HTTP status (a stream reports it after its 200 went out); ``type``,
    when not given, is OpenAI's for the status: a client's error below 500, the server's from it.
    """
    if kind is None:
        kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def render(exc: ServekitError, path: str) -> dict[str, Any]:
    """The error body for ``exc`` in the shape of the route ``path`` belongs to.

    OpenAI routes get OpenAI's error object; V2 routes Triton's wording where the
    error has one; everything else TF Serving's and KServe's ``{"error": message}``.
    Every HTTP layer (Flask's handlers, the fast lane, the limits) renders through here.
    """
    if is_openai_path(path):
        return openai_error(exc)
    v2_message = getattr(exc, "v2_message", None)
    if v2_message is not None and path.startswith("/v2/"):
        return {"error": v2_message}
    return {"error": exc.message}


def malformed_version(version: str) -> str:
    """A version that is no positive integer, in Triton's wording (its own examples check it)."""
    return (
        f"failed to get model version from specified version string '{version}': "
        "expected a positive integer, or none for the latest"
    )
