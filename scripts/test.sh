#!/usr/bin/env bash
# Quickstart 2: install everything the suite needs and run the whole test suite.
# Debian's packages for the end-to-end tests of the outside world, as root on Debian, when missing:
# Chromium (the status-page test), Prometheus (and promtool's checks of the alert rules), HAProxy in
# front of the scale-out rehearsal, PostgreSQL for the request log, and a Docker daemon with
# debootstrap for the real-image test (tests/scaffold/test_docker_image.py). Without them those
# tests skip with the reason. One `apt-get update` for all, in the background while the Python
# packages install.
debian_packages() {
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 || return 0
    local missing=() tool
    for tool in chromium:chromium prometheus:/usr/bin/promtool haproxy:/usr/sbin/haproxy \
        postgresql:/usr/lib/postgresql docker.io:dockerd debootstrap:debootstrap; do
        if [[ "${tool#*:}" == /* ]]; then
            [ -e "${tool#*:}" ] && continue
        else
            command -v "${tool#*:}" >/dev/null 2>&1 || [ -x "/usr/sbin/${tool#*:}" ] && continue
        fi
        missing+=("${tool%%:*}")
    done
    [ ${#missing[@]} -gt 0 ] || return 0
    apt-get update -qq || { echo "apt-get update failed; the tests that need ${missing[*]} will skip"; return 0; }
    apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 && return 0
    # one at a time, so a package this system lacks leaves the others in
    for tool in "${missing[@]}"; do
        apt-get install -y -qq "$tool" >/dev/null || echo "could not install $tool; the tests that need it will skip"
    done
}
debian_packages &
debian_packages=$!
. "$(dirname "$0")/bootstrap.sh" "all,test"
# TF Serving's client package depends on the full `tensorflow`; we run it beside
# tensorflow-cpu, so it goes in without its dependencies.
python -c "import tensorflow_serving" 2>/dev/null || install_into .venv/bin/python --no-deps "tensorflow-serving-api>=2.15"
# Structured outputs' grammar engine and the clients tested through it, without their pins: xgrammar
# requires triton (286 MB, never imported on CPU), instructor jiter<0.15 and rich<15 (a resolver would take
# openai back to 3.3 to fit), LiteLLM importlib-metadata<9. What they need that nothing else brings
# is named (tests/e2e/test_structured_outputs.py).
python -c "import xgrammar, instructor, litellm" 2>/dev/null || install_into .venv/bin/python --no-deps \
    "xgrammar>=0.2.9" apache-tvm-ffi "instructor>=1.17" docstring-parser "litellm>=1.110" fastuuid h2 hpack hyperframe
# LangChain's HuggingFaceEndpointEmbeddings (tests/e2e/test_retrieval_clients.py) pins huggingface-hub<2, which
# transformers 5 refuses; it runs on hub 2, so it goes in without its pins too.
python -c "import langchain_huggingface" 2>/dev/null || install_into .venv/bin/python --no-deps "langchain-huggingface>=1.2"
# KServe's own client pins protobuf < 7 and much else, so it lives in a virtualenv of its own;
# tests/e2e/test_kserve_client.py drives servekit with it.
if [ ! -x .venv-kserve/bin/python ]; then
    (python -m venv .venv-kserve && install_into .venv-kserve/bin/python "kserve==0.21.0") \
        || echo "could not install KServe's client; its test will skip"
fi
# `mlflow server` needs the full mlflow (the test extra has mlflow-skinny, the client only), so
# the server lives in a virtualenv of its own, at the client's version; plugins/servekit_mlflow/tests/test_mlflow_registry.py
# starts it with a SQLite backend.
if [ ! -x .venv-mlflow/bin/mlflow ]; then
    mlflow_version="$(python -c 'from importlib.metadata import version; print(version("mlflow-skinny"))' 2>/dev/null)"
    # at the client's version, else the newest full mlflow before it (a release of mlflow-skinny can
    # reach the index before the packages the full mlflow of that release pins)
    # the resolution errors of the first try go to a log, not to the screen: the fallback is expected
    (python -m venv .venv-mlflow \
        && { install_into .venv-mlflow/bin/python "mlflow${mlflow_version:+==$mlflow_version}" \
                >.venv-mlflow/first-try.log 2>&1 \
            || { [ -n "$mlflow_version" ] \
                && echo "mlflow $mlflow_version cannot be installed yet (.venv-mlflow/first-try.log); taking the newest mlflow before it" \
                && install_into .venv-mlflow/bin/python "mlflow<=$mlflow_version"; }; }) \
        || echo "could not install mlflow's server; the registry test will skip"
fi
# servekit's gRPC stubs read with protobuf 5.26.1 and up: tests/server/test_grpc_startup.py runs them on the
# grpc extra's floor and on the 6.x a Triton client moves protobuf to, from these folders
for pb in 5.26.1 6.33.5; do
    [ -d ".cache/protobuf-$pb/google/protobuf" ] \
        || install_into .venv/bin/python --no-deps --target ".cache/protobuf-$pb" "protobuf==$pb" \
        || echo "could not install protobuf $pb; its tests will skip"
done
# Debian's packages, waited for before the tests start (installed beside the Python installs above).
wait "$debian_packages" || true
# The suite in parallel, a module's tests in one worker since they share its servers; then the
# tests that need the machine alone (marked `alone`), one at a time. Two workers more than the CPUs
# (SERVEKIT_TEST_WORKERS to choose): many tests wait for a server to start, and the spare workers
# fill those waits (on 2 CPUs the whole suite took 12:04 with 2 workers, 11:11 with 3 on one machine;
# on another, 3 workers kept 1.65 of the CPUs busy, 4 kept 1.70-1.71: 17:00 against 16:15 and 17:00;
# 5 workers were no better there, 18:44 against 16:18 and 18:03 with 4).
set +e
# Bytecode is written and reused: with PYTHONDONTWRITEBYTECODE set (some images set it), every
# pytest worker re-rewrote each test module's asserts and every server the suite starts compiled
# servekit from source again (about 6 CPU-s a worker's collection, 0.15 s a server start).
unset PYTHONDONTWRITEBYTECODE
# pyproject.toml's addopts give each module to one worker, longest first (--dist loadfile
# --no-loadscope-reorder: with xdist's own order the fuzz test started ten minutes in and was the
# run's last two minutes alone).
python -m pytest -n "${SERVEKIT_TEST_WORKERS:-$(($(nproc) + 2))}" "$@"
status=$?
python -m pytest --alone "$@"
alone=$?
[ "$alone" -eq 5 ] && alone=0  # exit status 5: no test of this selection needs the machine alone
[ "$status" -ne 0 ] && exit "$status"
exit "$alone"
