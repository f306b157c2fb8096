#!/usr/bin/env bash
# Set up graph_runtime on a fresh machine: a virtualenv in .venv with the package (editable) and
# its test extras, plus Debian's PoCL OpenCL driver when running as root and no OpenCL driver exists.
# Idempotent: a second run only checks. Usage: bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    need=()
    ls /etc/OpenCL/vendors/*.icd >/dev/null 2>&1 || need+=(pocl-opencl-icd ocl-icd-libopencl1)
    command -v dot >/dev/null || need+=(graphviz)
    if [ ${#need[@]} -gt 0 ]; then
        echo "setup: installing Debian packages: ${need[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
    fi
elif ! ls /etc/OpenCL/vendors/*.icd >/dev/null 2>&1; then
    echo "setup: no OpenCL driver found; OpenCL runs will be skipped (as root this script" \
         "would install Debian's pocl-opencl-icd)" >&2
fi

PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
stamp=.venv/.graph_runtime-installed
if [ ! -f "$stamp" ] || [ setup.cfg -nt "$stamp" ]; then
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e '.[test]'
    touch "$stamp"
fi
