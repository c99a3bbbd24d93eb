#!/usr/bin/env bash
# Quickstart 2: install everything the suite needs and run the whole test suite.
. "$(dirname "$0")/bootstrap.sh" "all,test"
# TF Serving's client package depends on the full `tensorflow`; we run it beside
# tensorflow-cpu, so it goes in without its dependencies.
python -c "import tensorflow_serving" 2>/dev/null || python -m pip install --quiet --no-deps "tensorflow-serving-api>=2.15"
# KServe's own client pins protobuf < 7 (servekit's gRPC stubs need 7), so it lives in a
# virtualenv of its own; tests/test_kserve_client.py drives servekit with it.
if [ ! -x .venv-kserve/bin/python ]; then
    (python -m venv .venv-kserve && .venv-kserve/bin/python -m pip install --quiet "kserve==0.21.0") \
        || echo "could not install KServe's client; its test will skip"
fi
# The status-page test drives headless Chromium; as root on Debian, install it when missing
# (without it that test skips with the reason).
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || echo "could not install chromium; its test will skip"
fi
# The Prometheus test (and promtool's checks of the alert rules) and the PostgreSQL request-log
# test use Debian's packages; as root, install them when missing (else those tests skip).
if ! command -v promtool >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && apt-get install -y -qq prometheus >/dev/null) || echo "could not install prometheus; its tests will skip"
fi
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && apt-get install -y -qq postgresql >/dev/null) || echo "could not install postgresql; its test will skip"
fi
exec python -m pytest "$@"
