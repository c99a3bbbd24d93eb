#!/usr/bin/env bash
# Quickstart 1: serve the bundled example model(s) on http://127.0.0.1:8080 and gRPC on :8081.
# The grpc extra is what turns gRPC on: without grpcio, servekit serves HTTP only.
. "$(dirname "$0")/bootstrap.sh" sklearn,grpc
[ -f examples/models/iris/1/model.joblib ] || python examples/train_iris.py
exec servekit serve examples/models "$@"
