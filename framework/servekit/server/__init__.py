"""The HTTP server: the Flask app factory and the gunicorn application."""

from servekit.server.app import create_app

__all__ = ["create_app"]
