"""One error tree: each class carries its HTTP status and gRPC code.

Raise these anywhere (codecs, data plane, plugins); one handler per protocol
turns them into that protocol's error shape.  Messages say what was expected and
what was found; they never carry stack traces or file paths.
"""

from __future__ import annotations


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


class Timeout(ServekitError):
    status = 504
    grpc_code = "DEADLINE_EXCEEDED"
