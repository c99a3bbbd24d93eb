"""servekit's version, in one place: the package metadata (pyproject.toml) and every page that shows it read it here."""

__version__ = "0.2.0"
