"""Pages of the server itself, not wire protocols: the status page at ``/`` and the OpenAPI document."""
