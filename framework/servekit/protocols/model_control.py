"""Model control: whether clients may load and unload models (Triton's ``--model-control-mode``).

The V2 repository API's load and unload change what a server serves.  Without
``--api-key`` anyone who reaches the port could unload a production model, so
the default, ``none``, refuses them (as Triton's default does) and the server
serves what its folders hold, polling them for new versions.  ``explicit``
allows them.  The index stays readable in both modes.  HTTP and gRPC ask the
same function, so both refuse with the same message.
"""

from __future__ import annotations

from servekit.errors import Forbidden

NONE = "none"
EXPLICIT = "explicit"


def require_model_control(mode: str | None) -> None:
    """Refuse a load or unload unless the server runs with ``--model-control-mode explicit``.

    :param mode: the server's ``model_control_mode`` setting (``None``: the default, ``none``).
    :raises Forbidden: 403 over HTTP, ``PERMISSION_DENIED`` over gRPC, with Triton's
        message followed by the flag that allows it.
    """
    if mode == EXPLICIT:
        return
    raise Forbidden(
        "explicit model load / unload is not allowed: the server runs with "
        f"--model-control-mode {mode or NONE}; start it with --model-control-mode explicit to allow them"
    )
