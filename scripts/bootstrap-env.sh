#!/usr/bin/env bash
# Creates .venv with the project and its test tools, and installs the local tritonserver.
# Needs Python 3.12 (Helm's Python bindings need >= 3.12; Triton's stub needs NumPy 1.x, which has no
# wheels for 3.13). PYTHON may name another interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {
  if [ -n "${PYTHON:-}" ]; then echo "$PYTHON"; return; fi
  if command -v python3.12 >/dev/null 2>&1 && python3.12 -c 'import sys' >/dev/null 2>&1; then
    command -v python3.12; return
  fi
  if command -v pyenv >/dev/null 2>&1; then
    for version in $(pyenv versions --bare 2>/dev/null | grep -E '^3\.12\.[0-9]+$' | sort -V -r); do
      echo "$(pyenv root)/versions/$version/bin/python3"; return
    done
  fi
  if python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then command -v python3; return; fi
  echo "No Python 3.12 found: install one (e.g. pyenv install 3.12) or set PYTHON=/path/to/python3.12" >&2
  exit 1
}

if [ ! -x .venv/bin/python ]; then
  "$(find_python)" -m venv .venv
fi
if [ ! -f .venv/.installed ] || [ pyproject.toml -nt .venv/.installed ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e '.[test]'
  touch .venv/.installed
fi
.venv/bin/kubetriton install-triton
