#!/usr/bin/env bash
# Creates the environments that `make` runs in, each once (again when pyproject.toml changes):
#
#   bootstrap-env.sh          .venv: NumPy 1.x, then the project and its test tools, on Python 3.12 (Helm's
#                             Python bindings need >= 3.12; PYTHON may name another interpreter); then
#                             `kubetriton install-triton` installs the local tritonserver and provisions
#                             the Python its Python-backend stub runs on, whatever the worker's is.
#   bootstrap-env.sh numpy2   .venv-numpy2: a worker environment made as a user with NumPy 2 makes one,
#                             numpy>=2 first and then the project, which must keep it; on Python 3.13
#                             when there is one (NUMPY2_PYTHON may name another interpreter).
#
# Nothing is written outside this folder and the user's cache (~/.cache: pip's, kubetriton's Triton), and
# nothing needs root. Tests that need a server this does not install (haproxy, promtool) skip, saying so.
set -euo pipefail
cd "$(dirname "$0")/.."

# find_python VERSION: an interpreter of that version, on PATH or through pyenv.
find_python() {
  if command -v "python$1" >/dev/null 2>&1 && "python$1" -c 'import sys' >/dev/null 2>&1; then
    command -v "python$1"; return
  fi
  if command -v pyenv >/dev/null 2>&1; then
    for version in $(pyenv versions --bare 2>/dev/null | grep -E "^${1//./\\.}\.[0-9]+$" | sort -V -r); do
      echo "$(pyenv root)/versions/$version/bin/python3"; return
    done
  fi
  if python3 -c "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$1'.split('.'))))" 2>/dev/null; then
    command -v python3; return
  fi
  return 1
}

# install_project VENV [PIP REQUIREMENT...]: the requirements first, then the project with its test tools.
install_project() {
  local venv=$1
  shift
  if [ ! -f "$venv/.installed" ] || [ pyproject.toml -nt "$venv/.installed" ]; then
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    if [ $# -gt 0 ]; then "$venv/bin/python" -m pip install --quiet "$@"; fi
    "$venv/bin/python" -m pip install --quiet -e '.[test]'
    touch "$venv/.installed"
  fi
}

case "${1:-}" in
  "")
    if [ ! -x .venv/bin/python ]; then
      python=${PYTHON:-$(find_python 3.12)} || {
        echo "No Python 3.12 found: install one (e.g. pyenv install 3.12) or set PYTHON=/path/to/python3.12" >&2
        exit 1
      }
      "$python" -m venv .venv
    fi
    install_project .venv 'numpy>=1.24,<2'
    .venv/bin/kubetriton install-triton
    ;;
  numpy2)
    if [ ! -x .venv-numpy2/bin/python ]; then
      python=${NUMPY2_PYTHON:-$(find_python 3.13 || find_python 3.12)} || {
        echo "No Python 3.13 or 3.12 found: install one or set NUMPY2_PYTHON=/path/to/python3" >&2
        exit 1
      }
      "$python" -m venv .venv-numpy2
    fi
    install_project .venv-numpy2 'numpy>=2'
    .venv-numpy2/bin/python -c 'import numpy, sys
if int(numpy.__version__.split(".")[0]) < 2:
    sys.exit(f"Installing the project replaced NumPy 2 with NumPy {numpy.__version__}")
print(f"NumPy 2 worker environment: Python {sys.version.split()[0]}, NumPy {numpy.__version__}")'
    ;;
  *)
    echo "usage: $0 [numpy2]" >&2
    exit 2
    ;;
esac
