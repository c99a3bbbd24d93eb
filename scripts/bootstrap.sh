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
  # PyPI's torch for Linux is the CUDA build (gigabytes of nvidia-* wheels); the CPU build comes from
  # PyTorch's own index (SERVEKIT_TORCH_INDEX= to leave it out, or another URL for a mirror)
  torch_index="${SERVEKIT_TORCH_INDEX-https://download.pytorch.org/whl/cpu}"
  if [ "$(uname -s)" = Linux ] && [ -n "$torch_index" ]; then
    python -m pip install --quiet --extra-index-url "$torch_index" -e ".[$1]"
  else
    python -m pip install --quiet -e ".[$1]"
  fi
  touch "$stamp"
fi
