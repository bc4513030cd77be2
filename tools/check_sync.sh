#!/usr/bin/env bash
# Fails when the exported package differs from the notebooks, when notebooks are not clean,
# or when README.md (BOOK.md) is out of step with nbs/index.ipynb (nbs/book.ipynb). Works on any checkout (no git needed).
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cp -r hara_ref "$tmp/pkg"; cp -r nbs "$tmp/nbs"; cp README.md "$tmp/README.md"; cp BOOK.md "$tmp/BOOK.md"
nbdev_export
if ! diff -r -x __pycache__ "$tmp/pkg" hara_ref; then
  echo "FAIL: nbdev_export changed hara_ref/: the package and the notebooks disagree (edit the notebook, export, commit both)"; exit 1; fi
nbdev_clean
if ! diff -r -x .ipynb_checkpoints "$tmp/nbs" nbs >/dev/null; then
  diff -r -x .ipynb_checkpoints -q "$tmp/nbs" nbs || true
  echo "FAIL: nbdev_clean changed notebooks in nbs/: commit cleaned notebooks"; exit 1; fi
python tools/readme.py
if ! diff "$tmp/README.md" README.md; then echo "FAIL: README.md is not in step with nbs/index.ipynb (run python tools/readme.py)"; exit 1; fi
if ! diff "$tmp/BOOK.md" BOOK.md; then echo "FAIL: BOOK.md is not in step with nbs/book.ipynb (run python tools/readme.py)"; exit 1; fi
echo "sync: package, notebooks and README agree"
