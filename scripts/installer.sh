# Sourced by the scripts that make virtualenvs: `install_into PYTHON ARGS...` installs ARGS (pip
# install's arguments) into the environment of PYTHON, with uv where it can, else with pip.
#
# uv downloads and unpacks in parallel: the suite's .venv (every extra, TensorFlow and PyTorch
# included) installs in 43 s against pip's 179 s on 2 CPUs, a quick-lane venv of another Python in
# 12 s against about 2 minutes. uv reads no pip.conf: pip's PIP_FIND_LINKS, PIP_INDEX_URL,
# PIP_EXTRA_INDEX_URL, PIP_CONSTRAINT and PIP_CERT are handed to it as its own (docs/torch.md sets
# PIP_EXTRA_INDEX_URL for PyTorch's CPU builds). SERVEKIT_INSTALLER=pip installs with pip alone.
# uv is taken from PATH, else from .venv (bootstrap.sh installs it there), else pip is used; what
# uv fails to install is tried again with pip.

installer_uv() {
    [ "${SERVEKIT_INSTALLER:-uv}" = uv ] || return 1
    local uv
    uv="$(command -v uv 2>/dev/null || true)"
    [ -n "$uv" ] || { [ -x .venv/bin/uv ] && uv="$PWD/.venv/bin/uv"; }
    [ -n "$uv" ] && "$uv" --version >/dev/null 2>&1 && echo "$uv"
}

install_into() {
    local python="$1" uv
    shift
    if uv="$(installer_uv)"; then
        (
            [ -z "${PIP_FIND_LINKS:-}" ] || export UV_FIND_LINKS="${UV_FIND_LINKS:-$PIP_FIND_LINKS}"
            [ -z "${PIP_INDEX_URL:-}" ] || export UV_INDEX_URL="${UV_INDEX_URL:-$PIP_INDEX_URL}"
            [ -z "${PIP_EXTRA_INDEX_URL:-}" ] || export UV_EXTRA_INDEX_URL="${UV_EXTRA_INDEX_URL:-$PIP_EXTRA_INDEX_URL}"
            [ -z "${PIP_CONSTRAINT:-}" ] || export UV_CONSTRAINT="${UV_CONSTRAINT:-$PIP_CONSTRAINT}"
            [ -z "${PIP_CERT:-}" ] || export SSL_CERT_FILE="${SSL_CERT_FILE:-$PIP_CERT}"
            exec "$uv" pip install --quiet --python "$python" "$@"
        ) && return 0
        # what uv could not do (an index only pip.conf names, a proxy only pip knows), pip may
        echo "uv could not install ${*: -1}; trying pip" >&2
    fi
    "$python" -m pip install --quiet "$@"
}
