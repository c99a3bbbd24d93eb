"""The one error storage raises: a message naming the URI, shown as one line (startup) or a 4xx."""

from __future__ import annotations

from servekit.folders.servekit_yaml import ConfigError


class StorageError(ConfigError):
    """A model URI cannot be read: no such bucket, no credentials, a missing extra, a broken download."""
