#!/usr/bin/env bash
# Sets up what `make demo` and `make test` need, skipping what is already there:
# the system packages SimGrid's build needs, a virtual environment, SimGrid 4.1
# (built from source with pybind11<3) and hcsim itself (editable).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v g++ >/dev/null || missing+=(g++)
[ -f /usr/include/boost/version.hpp ] || missing+=(libboost-dev)
"$PYTHON" -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
pyinc=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
[ -f "$pyinc/Python.h" ] || missing+=(python3-dev)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing system packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "setup: missing system packages: ${missing[*]}" >&2
    echo "setup: run: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# PIP_CONSTRAINT reaches SimGrid's isolated build environment too: it fails with pybind11 3.x.
export PIP_CONSTRAINT="$PWD/constraints.txt"
# pip >= 25.3 constrains build environments only through PIP_BUILD_CONSTRAINT.
export PIP_BUILD_CONSTRAINT="$PWD/constraints.txt"
if ! "$VENV/bin/python" -c 'import hcsim.engine.simgrid_loader as s; s.load()' 2>/dev/null; then
  echo "setup: installing SimGrid 4.1 (built from source the first time, about 8 minutes) and hcsim"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e '.[test]'
