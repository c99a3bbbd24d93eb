"""Observability: Prometheus metrics, traces, request ids in logs, and the request/prediction log.

The package imports nothing itself, so a model host, which counts its batches
and loads without serving HTTP, does not load Flask: :mod:`.middleware` wires
all of it into an app made by ``create_app``.
"""
