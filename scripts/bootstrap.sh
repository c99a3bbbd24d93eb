# Sourced by the Quickstart scripts: create .venv (once) and install servekit into it.
# Usage: . scripts/bootstrap.sh EXTRAS   (e.g. "sklearn" or "all,test")
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
. scripts/installer.sh
stamp=".venv/.servekit-installed-$1-$(sha1sum pyproject.toml | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  # pip stays in the venv (tests and users call it); uv installs the rest (scripts/installer.sh)
  uv=uv
  { [ "${SERVEKIT_INSTALLER:-uv}" = uv ] && ! command -v uv >/dev/null 2>&1; } || uv=
  python -m pip install --quiet --upgrade pip $uv
  # the test extra pins the torch release this project is tested with (torch==2.13.0); where no
  # CPU build of it lies on the machine, the installer takes PyPI's, which on Linux is the CUDA build:
  # set PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu for PyTorch's CPU builds (docs/torch.md)
  install_into .venv/bin/python -e ".[$1]"
  touch "$stamp"
fi
