#!/usr/bin/env bash
# Creates .venv (if missing) and installs hara_ref with its pinned toolchain.
# torch comes first: the CPU build on machines without an NVIDIA GPU, so that no multi-GB CUDA build is pulled.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
stamp="$VENV/.hara_ref-installed"
# Up to date already? (the stamp is newer than everything that decides what is installed)
if [ -f "$stamp" ] && [ "$stamp" -nt settings.ini ] && [ "$stamp" -nt constraints.txt ] && [ "$stamp" -nt setup.py ]; then exit 0; fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip "$@"; }
# pip byte-compiles each package on one core; compiling all of site-packages afterwards uses every core
nc=--no-compile
pip install -q --upgrade pip setuptools wheel
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    pip install -q $nc "torch==2.13.0"
  else
    # CPU build: from a local wheel or PyPI mirror if one carries it, else from PyTorch's CPU index.
    pip install -q $nc "torch==2.13.0+cpu" 2>/dev/null \
      || pip install -q $nc "torch==2.13.0+cpu" --extra-index-url https://download.pytorch.org/whl/cpu
  fi
fi
pip install -q $nc -c constraints.txt -e ".[dev,trl]"
# a few files in site-packages are templates, not Python, and do not compile (pip skips them too)
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$VENV/bin/python" -m compileall -q -j 0 "$site" >/dev/null || true
pip check
touch "$stamp"
