"""The API key: ``--api-key KEY`` makes every route but the open ones need ``Authorization: Bearer KEY``.

One check for every HTTP path (Flask's ``before_request`` and the fast lane);
gRPC has its own interceptor over the same key.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable

from .errors import Unauthorized
from .routes import OPEN_PATHS, is_open_path


class ApiKey:
    def __init__(self, key: str, open_paths: Iterable[str] = OPEN_PATHS):
        self._expected = f"Bearer {key}".encode()
        self.open_paths = tuple(open_paths)

    def check(self, path: str, authorization: str | None) -> None:
        """Raise :class:`Unauthorized` unless ``path`` is open or the header carries the key."""
        if is_open_path(path, self.open_paths):
            return
        if not hmac.compare_digest((authorization or "").encode(), self._expected):
            raise Unauthorized("missing or wrong API key; send 'Authorization: Bearer <key>'")
