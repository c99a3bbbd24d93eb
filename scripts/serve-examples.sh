#!/usr/bin/env bash
# Quickstart 1: serve the bundled example model(s) on http://127.0.0.1:8080 (gRPC 8081).
. "$(dirname "$0")/bootstrap.sh" sklearn
[ -f examples/models/iris/1/model.joblib ] || python examples/train_iris.py
exec servekit serve examples/models "$@"
