"""The HTTP server: the Flask app factory and the gunicorn application."""

from .app import create_app

__all__ = ["create_app"]
