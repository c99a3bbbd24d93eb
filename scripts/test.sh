#!/usr/bin/env bash
# Quickstart 2: install everything the suite needs and run the whole test suite.
. "$(dirname "$0")/bootstrap.sh" "all,test"
# TF Serving's client package depends on the full `tensorflow`; we run it beside
# tensorflow-cpu, so it goes in without its dependencies.
python -c "import tensorflow_serving" 2>/dev/null || python -m pip install --quiet --no-deps "tensorflow-serving-api>=2.15"
exec python -m pytest "$@"
