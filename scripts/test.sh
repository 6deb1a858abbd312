#!/usr/bin/env bash
# Set up the environment and run the whole test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Small BLAS calls in the fits run faster single-threaded on this 2-core machine.
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
exec .venv/bin/python -m pytest -q "$@"
