# Sourced by the Quickstart scripts: create .venv (once) and install servekit into it.
# Usage: . scripts/bootstrap.sh EXTRAS   (e.g. "sklearn" or "all,test")
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
stamp=".venv/.servekit-installed-$1-$(sha1sum pyproject.toml | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  python -m pip install --quiet --upgrade pip
  # the test extra pins the torch release this project is tested with (torch==2.13.0); where no
  # CPU build of it lies on the machine, pip takes PyPI's, which on Linux is the CUDA build: set
  # PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu for PyTorch's CPU builds (docs/torch.md)
  python -m pip install --quiet -e ".[$1]"
  touch "$stamp"
fi
